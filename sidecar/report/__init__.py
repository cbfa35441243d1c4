"""The weekly capacity report: what the KV cache went through over a period and what to change.

Sources (:mod:`.prometheus`, :mod:`.embedded`) fill a :class:`~sidecar.report.data.Week`;
:mod:`.figures` turns it into a :class:`~sidecar.report.results.Report` with the daemon's own
sizing and advice functions; :mod:`.render` writes it as Markdown, HTML and JSON; :mod:`.cli` is
``kv-sidecar report`` and ``kv-sidecar reporter``. docs/report.md explains the figures.
"""
