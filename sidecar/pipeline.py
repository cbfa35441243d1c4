"""The read pipeline: a fetched page -> one :class:`~sidecar.observation.EngineScrape`, or one failure reason.

    body --decode--> text --pre-filtered parse (PageLimits)--> samples
         --engine (targets[].engine, or detected: auto)--> adapter --normalise--> EngineScrape
         --engine_limit--> accepted or refused

Every step is pure (no socket, no clock, no thread): the scrape loop (:mod:`sidecar.scrape_loop`) runs it on a
fetched body, on its event loop or a page-reader thread (:mod:`sidecar.page_readers`), and the replays
(:mod:`sidecar.replay`) run it on the simulator's page, so both read a page with exactly this code.

A page the pipeline refuses raises :class:`~sidecar.reasons.ScrapeFailed` with one of
:data:`~sidecar.reasons.REASONS` (``empty``, ``invalid_text``, ``no_engine_metrics``, ``mixed_engines``,
``sample_limit``, ``label_limit``, ``invalid_value``, ``too_large``, or an adapter's own
``no_capacity``); what each limit bounds is in ``docs/limits.md``.
"""

from __future__ import annotations

from types import ModuleType

from . import page_parser
from .config import TargetConfig
from .engines import ADAPTERS, adapter, detect
from .limits import OutOfRange
from .observation import EngineScrape
from .reasons import ScrapeFailed
from .settings import AUTO_ENGINE


def parser_for(target: TargetConfig) -> page_parser.FilteredParser:
    """The pre-filtered parser of ``target``: it keeps only the families its engine's adapter reads (every
    adapter's, and the names that tell the engines apart, when ``targets[].engine`` is ``auto``).

    One per target and kept across scrapes (and reloads that keep the target's source), because it
    remembers the previous page's lines (:class:`~sidecar.page_parser.FilteredParser`).
    """
    if target.engine == AUTO_ENGINE:
        return page_parser.FilteredParser(set().union(*(set(a.NEEDED) | set(a.SIGNATURE) for a in ADAPTERS.values())))
    return page_parser.FilteredParser(adapter(target.engine).NEEDED)


def engine_of(target: TargetConfig, samples: list[page_parser.Sample]) -> ModuleType:
    """The adapter that reads ``target``'s page: the one ``targets[].engine`` names, else (``auto``) the
    one whose signature families the page carries; :class:`ScrapeFailed` when none or several do."""
    if target.engine != AUTO_ENGINE:
        return adapter(target.engine)
    found = detect({name for name, _, _ in samples})
    if not found:
        known = ", ".join(ADAPTERS)
        raise ScrapeFailed("no_engine_metrics", f"no metric family of a known engine ({known}) in the answer")
    if len(found) > 1:
        kinds = ", ".join(a.KIND for a in found)
        raise ScrapeFailed(
            "mixed_engines",
            f"the page carries the families of several engines ({kinds}): point each target at one "
            "server, or set targets[].engine to the one to read",
        )
    return found[0]


def page_limits(target: TargetConfig) -> page_parser.PageLimits:
    """``target``'s bounds on the sample lines read (Prometheus' per-scrape names; 0 = no limit)."""
    return page_parser.PageLimits(
        target.sample_limit, target.label_limit, target.label_name_length_limit, target.label_value_length_limit
    )


def read_page(target: TargetConfig, parser: page_parser.FilteredParser, body: bytes | bytearray) -> EngineScrape:
    """What the sidecar makes of ``target``'s fetched ``body``: decode, pre-filtered parse, normalise, all
    within the target's limits; raises :class:`ScrapeFailed` naming the reason of a refusal.

    Nothing of a refused page is used: one number the capacity stands on that cannot be one
    (``invalid_value``) or one engine too many (``too_large``) refuses the whole page.
    """
    if not body or body.isspace():  # (not strip(): no copy of a large page)
        raise ScrapeFailed("empty", "200 with an empty body")
    try:
        samples = parser.samples(page_parser.decode(body), page_limits(target))
        engine = engine_of(target, samples)
        scrape: EngineScrape | None = engine.normalise(
            samples, label_values_limit=target.label_values_limit, capacity_tokens=target.capacity_tokens
        )
    except page_parser.LimitExceeded as e:
        raise ScrapeFailed(e.reason, str(e)) from None
    except page_parser.InvalidText as e:
        raise ScrapeFailed("invalid_text", str(e)) from None
    except OutOfRange as e:
        # the value is part of the field at fault: another bad value is logged again
        raise ScrapeFailed("invalid_value", str(e), f"{e.field}={str(e.value)[:40]}") from None
    if scrape is None:
        raise ScrapeFailed("no_engine_metrics", f"no {engine.KIND} metric family in the answer")
    if target.engine_limit and len(scrape.observations) > target.engine_limit:
        # Like Prometheus' sample_limit: a page under the byte limit can still carry enough
        # series to stall every target's loop and blow up /metrics; refuse it whole.
        raise ScrapeFailed(
            "too_large",
            f"{len(scrape.observations)} (model, engine) pairs > targets[].engine_limit "
            f"{target.engine_limit} (one target per server)",
        )
    return scrape
