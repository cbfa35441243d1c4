"""The report's file formats and what drawing their plots needs: one definition for the CLI's ``--format``
(which must not import the renderer to build its ``--help``) and for :mod:`sidecar.report.render`."""

from __future__ import annotations

#: ``kvcache-report-<period>.md`` (with its images folder), ``.html`` (images inside) and ``.json``.
FORMATS = ("md", "html", "json")
#: How to get matplotlib, which draws the Markdown's and the HTML's plots (JSON needs none).
EXTRA_HINT = "pip install 'kv-cache-sidecar[report]'"
