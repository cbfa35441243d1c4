"""Write a :class:`~sidecar.report.results.Report` as Markdown, one self-contained HTML page and JSON.

What goes where:

- ``kvcache-report-<start>_<end>.md``: the report for chats, wikis and pull requests, its plots as
  PNGs beside it in ``kvcache-report-<start>_<end>-images/<model>-<plot>.png``;
- ``kvcache-report-<start>_<end>.html``: one file, the same PNGs embedded as ``data:`` URIs, with a
  print style sheet (a page per model, nothing wider than the page);
- ``kvcache-report-<start>_<end>.json``: every figure for machines, the report's dataclasses as
  objects (timelines included) with NaN and infinities as ``null``, keys sorted, on one line.

``<start>``/``<end>`` are the period's UTC dates (``YYYY-MM-DD``), with ``THHMM`` added when the
period does not start or end at midnight (a few minutes of ``make run``), so two different periods
never share a file name. Both Markdown and HTML are built from one list of blocks
(:func:`blocks`), so they show the same things in the same order: the title, the period and
source, the summary, the fleet table, then for each model its figures, its recommendation and
effect, its pods, its pages and its plots (:mod:`sidecar.report.plots`).

Why the writing is the way it is:

- **Same bytes on a rerun.** Everything shown comes from the report in its order; the only
  run-dependent value, ``generated_at``, appears on exactly one line of each document; the PNGs are
  drawn deterministically (see :mod:`sidecar.report.plots`).
- **All or nothing.** Every file is first written to a temporary name in its final folder; only
  when all of them are complete are they renamed into place (``os.replace``, atomic on POSIX), the
  images first and the documents last. A full disk, an unwritable folder or a Ctrl-C before the
  renames leaves no new file at all (the temporary ones are removed); one during the renames
  leaves at worst new images next to the previous documents, never a half-written document.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html
import importlib
import json
import math
import re
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeGuard

from ..atomic_write import replace_together
from ..forecast import recommendation
from .data import ModelKey, Page, Period
from .formats import EXTRA_HINT, FORMATS
from .growth import AT_CAPACITY, GROWING, growth_text
from .results import Advice, ModelReport, PodReport, Report

NONE = "—"  # shown for a figure that is not known

#: What each plot of :mod:`sidecar.report.plots` shows (its alt text and caption).
PLOT_CAPTIONS = {
    "usage": "Usage over the period (the hottest pod at each step) with the warning, watermark and target lines",
    "demand": "Peak demand against the usable capacity",
    "preemptions": "Preemptions per hour",
    "heatmap": "Peak usage by hour of the week (UTC, Monday first)",
}

#: Human text for every action and reason (the daemon's enums, never shown raw).
ACTION_TEXT = recommendation.ACTION_TEXT
REASON_TEXT = recommendation.REASON_TEXT

LEVER_TEXT = {
    "fp8_kv_cache": "fp8 KV cache",
    "half_kv_heads": "half the KV heads",
    "max_model_len": "lower max_model_len",
}


class ReportWriteError(Exception):
    """The output folder cannot take the report; the message is one line naming the folder and the fix."""


class PlotsUnavailable(Exception):
    """matplotlib cannot run here (no writable cache folder); the message is one line with the fix."""


# ----------------------------------------------------------------------------- entry point


def write_report(report: Report, out_dir: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write the report in ``formats`` into ``out_dir``; the documents written (in ``formats`` order), then images.

    Raises :class:`ReportWriteError` when ``out_dir`` cannot be written (nothing is left behind),
    ``ImportError`` naming the extra to install when a format needs plots and matplotlib is
    missing, ``ValueError`` for an unknown format.
    """
    wanted = list(dict.fromkeys(formats))
    unknown = [f for f in wanted if f not in FORMATS]
    if unknown or not wanted:
        raise ValueError(f"report formats: {', '.join(unknown) or 'none given'}; choose from {', '.join(FORMATS)}")
    out_dir = Path(out_dir)
    base = base_name(report.period)
    images_dir = out_dir / f"{base}-images"
    # the folders first: an unwritable --out fails at once, before seconds of drawing
    created = _make_dirs(out_dir, images_dir if "md" in wanted and report.models else None)
    try:
        pictures = draw_plots(report) if {"md", "html"} & set(wanted) else {}
        documents = [(out_dir / f"{base}.{fmt}", _document(fmt, report, pictures, images_dir.name)) for fmt in wanted]
        images = [(images_dir / name, data) for name, data in pictures.items()] if "md" in wanted else []
        _commit(out_dir, images + documents)
    except BaseException:
        for folder in reversed(created):
            _remove_if_empty(folder)
        raise
    return [path for path, _ in documents] + [path for path, _ in images]


def _document(fmt: str, report: Report, pictures: dict[str, bytes], images_folder: str) -> bytes | list[str]:
    """The document's bytes; JSON's as its ASCII pieces, written one by one (25 MB for a week of 64 pods)."""
    if fmt == "md":
        return markdown(report, pictures, images_folder).encode("utf-8")
    if fmt == "html":
        return page(report, pictures).encode("utf-8")
    return json_pieces(report)


def base_name(period: Period) -> str:
    """``kvcache-report-<start>_<end>``: UTC dates, with the time when the period is not whole days."""
    whole_days = period.start % 86400 == 0 and period.end % 86400 == 0
    fmt = "%Y-%m-%d" if whole_days else "%Y-%m-%dT%H%M"
    return f"kvcache-report-{_utc(period.start, fmt)}_{_utc(period.end, fmt)}"


def draw_plots(report: Report) -> dict[str, bytes]:
    """Every model's plots as PNG bytes, by file name (``<model slug>-<plot>.png``), in report order."""
    try:
        plots: Any = importlib.import_module(f"{__package__}.plots")
    except ImportError as e:
        missing = e.name or "matplotlib"
        raise ImportError(f"the report's plots need {missing}: {EXTRA_HINT}", name=missing) from None
    except OSError:  # matplotlib found no writable config/cache folder (MPLCONFIGDIR, ~/.config, /tmp)
        raise PlotsUnavailable(
            "matplotlib needs a writable folder for its cache: set MPLCONFIGDIR to one "
            "(on a read-only root filesystem: mount a writable /tmp)"
        ) from None
    out: dict[str, bytes] = {}
    for slug, model in zip(model_slugs(report), report.models, strict=True):
        for name, data in plots.model_plots(report, model).items():
            out[f"{slug}-{name}.png"] = data
    return out


def model_slugs(report: Report) -> list[str]:
    """A file-name-safe, stable name per model (``prod/Llama-3.1-8B`` -> ``prod-llama-3.1-8b``).

    Two models whose names fold to the same slug both get a short hash of their full name.
    """
    plain = [re.sub(r"[^a-z0-9._-]+", "-", str(m.model).lower()).strip("-.") or "model" for m in report.models]
    out = []
    for slug, m in zip(plain, report.models, strict=True):
        if plain.count(slug) > 1:
            slug = f"{slug}-{hashlib.sha256(str(m.model).encode()).hexdigest()[:8]}"
        out.append(slug)
    return out


# ----------------------------------------------------------------------------- atomic writes


def _commit(out_dir: Path, files: Sequence[tuple[Path, bytes | list[str]]]) -> None:
    """Stage every file under a temporary name, then rename them all into place, in order
    (:func:`sidecar.atomic_write.replace_together`); a failure to write is a :class:`ReportWriteError`."""
    try:
        replace_together(files)
    except OSError as e:
        raise ReportWriteError(_write_message(out_dir, e)) from None


def _make_dirs(out_dir: Path, images_dir: Path | None) -> list[Path]:
    """Create the folders; the ones this call created, outermost first (removed again on failure)."""
    wanted = [out_dir] + ([images_dir] if images_dir is not None else [])
    created: list[Path] = []
    try:
        for folder in wanted:
            missing = [p for p in [folder, *folder.parents] if not p.exists()]
            folder.mkdir(parents=True, exist_ok=True)
            created += reversed(missing)
    except OSError as e:
        for folder in reversed(created):
            _remove_if_empty(folder)
        raise ReportWriteError(_write_message(out_dir, e)) from None
    return created


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def _write_message(out_dir: Path, e: OSError) -> str:
    where = f"{e.filename}: " if e.filename and str(e.filename) != str(out_dir) else ""
    reason = e.strerror or str(e)
    return (
        f"cannot write the report in {out_dir} ({where}{reason}); "
        "choose a folder you can write with --out, or fix its permissions"
    )


# ----------------------------------------------------------------------------- numbers for people


def pct(ratio: float | None) -> str:
    """0.8734 -> ``87.3%``."""
    return f"{ratio * 100:.1f}%" if _known(ratio) else NONE


def tokens(n: float | None) -> str:
    """1234567.0 -> ``1,234,567``."""
    return f"{round(n):,}" if _known(n) else NONE


def hours(h: float | None) -> str:
    """12.25 -> ``12.3 h``."""
    return f"{h:.1f} h" if _known(h) else NONE


def count(n: float | None) -> str:
    return f"{round(n):,}" if _known(n) else NONE


def change(ratio: float | None) -> str:
    """0.125 -> ``+12.5%``."""
    return f"{ratio * 100:+.1f}%" if _known(ratio) else NONE


def weeks(w: float | None) -> str:
    return f"{w:.1f} weeks" if _known(w) else NONE


def gib(n: float | None) -> str:
    return f"{n / 2**30:.2f} GiB ({round(n):,} bytes)" if _known(n) else NONE


def when(t: float | None) -> str:
    """A Unix time as ``Tue 2026-11-24 14:00 UTC``."""
    return _utc(t, "%a %Y-%m-%d %H:%M UTC") if _known(t) else NONE


def action(a: str) -> str:
    return ACTION_TEXT.get(a, a.replace("_", " "))


def _known(x: float | None) -> TypeGuard[float]:
    return x is not None and math.isfinite(x)


def _utc(t: float, fmt: str) -> str:
    return datetime.fromtimestamp(t, UTC).strftime(fmt)


def _step(seconds: float) -> str:
    """The grid's step: ``1-minute``, ``15-second``."""
    return f"{seconds / 60:g}-minute" if seconds % 60 == 0 else f"{seconds:g}-second"


def _span(seconds: float) -> str:
    """A length of time: ``7 days``, ``36 h``, ``38 min``."""
    if seconds >= 2 * 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 3 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min"


# ----------------------------------------------------------------------------- blocks: what both documents show


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    anchor: str = ""


@dataclass(frozen=True)
class Para:
    text: str
    kind: str = ""  # "generated": the one line that differs between runs; "status", "lead": styling


@dataclass(frozen=True)
class Items:
    items: list[str]
    numbered: bool = False


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]
    #: one letter per column: "l" text (left), "r" numbers (right)
    align: str
    link_first: list[str] | None = None  # anchors: the first column links to these sections


@dataclass(frozen=True)
class Image:
    name: str  # file name in the images folder (and the key of the PNG bytes)
    caption: str


@dataclass(frozen=True)
class Section:
    """A model's part of the report (the HTML starts a printed page there)."""

    anchor: str
    blocks: list[Any]


def blocks(report: Report) -> list[Any]:
    """The report's content in order, independent of the output format."""
    period = report.period
    out: list[Any] = [
        Heading(1, f"KV-cache capacity report: {_utc(period.start, '%Y-%m-%d')} to {_utc(period.end, '%Y-%m-%d')}"),
        Para(
            f"Period: {when(period.start)} to {when(period.end)} ({_span(period.seconds)}, "
            f"{_step(period.step_s)} steps). "
            f"Source: {report.source}.",
            "lead",
        ),
        Para(
            f"Thresholds: warning {pct(report.warning)}, watermark {pct(report.watermark)}; "
            f"recommendations size the peak at a target usage of {pct(report.target_usage)}.",
            "lead",
        ),
        Para(f"Generated {when(report.generated_at)}.", "generated"),
        Heading(2, "Summary", "summary"),
    ]
    out.append(Items(list(report.summary), numbered=True) if report.summary else Para("Nothing to change this week."))
    slugs = model_slugs(report)
    out += [Heading(2, "Fleet", "fleet"), _fleet_table(report, slugs)]
    for slug, model in zip(slugs, report.models, strict=True):
        out.append(Section(f"model-{slug}", list(_model_blocks(report, model, slug))))
    return out


def _fleet_table(report: Report, slugs: list[str]) -> Table:
    header = [
        "Model",
        "Peak",
        "p95",
        f"Above warning ({pct(report.warning)})",
        f"Above watermark ({pct(report.watermark)})",
        "Peak demand / usable",
        "Preemptions",
        "Pages (critical / warning)",
        "Growth",
        "Replicas (now → needed)",
        "Action",
    ]
    rows = [
        [
            str(m.model),
            pct(m.usage.peak_ratio),
            pct(m.usage.p95_ratio),
            hours(m.usage.hours_above_warning),
            hours(m.usage.hours_above_watermark),
            pct(m.capacity.peak_demand_ratio),
            count(m.pressure.preemptions),
            _pages_by_severity(m.pages) if report.pages_known else "—",
            _growth_short(m),
            _replicas(m.advice),
            action(m.advice.action),
        ]
        for m in report.models
    ]
    return Table(header, rows, "lrrrrrrrlrl", link_first=[f"model-{s}" for s in slugs])


def _pages_by_severity(pages: Sequence[Page]) -> str:
    """``6 / 14``: critical pages (what paged) and warnings, never one count of both."""
    critical = sum(1 for p in pages if p.severity == "critical")
    return f"{critical} / {len(pages) - critical}"


#: The advice's words where the GPU's name is not known (the dashboards' are the same).
GPU_UNKNOWN = "GPU type unknown (set model.gpu_memory)"


def _replicas(a: Advice) -> str:
    if a.replicas_now is None or a.suggested_replicas is None:
        return NONE
    text = (
        f"{a.replicas_now} → {a.suggested_replicas}" if a.suggested_replicas != a.replicas_now else str(a.replicas_now)
    )
    return f"{a.gpu} × {text}" if a.gpu else text


def _growth_text(m: ModelReport) -> str:
    """The growth in one phrase (:func:`~sidecar.report.growth.growth_text`): "already full" never beside weeks."""
    return growth_text(m.growth)


def _growth_short(m: ModelReport) -> str:
    """The fleet table's form: the verdict and the weeks until full with their interval, no growth rate."""
    g = m.growth
    if g.verdict == AT_CAPACITY:
        return "already full"
    if not _known(g.weeks_until_full):
        return g.verdict
    if g.verdict != GROWING:  # two points: no interval
        return f"full in {weeks(g.weeks_until_full)} (two weeks only)"
    fast = f"{g.weeks_until_full_low:.1f}" if g.weeks_until_full_low is not None else "?"
    slow = f"{g.weeks_until_full_high:.1f}" if g.weeks_until_full_high is not None else f"{g.horizon_weeks:.0f}+"
    return f"full in {weeks(g.weeks_until_full)} ({fast} to {slow})"


def _model_blocks(report: Report, m: ModelReport, slug: str) -> Iterator[Any]:
    yield Heading(2, str(m.model), f"model-{slug}")
    pods = f"{len(m.pods)} pod{'s' if len(m.pods) != 1 else ''}"
    yield Para(f"{'Needs action' if m.needs_action else 'No action needed'} ({pods}).", "status")
    yield Heading(3, "Figures")
    yield Table(["Figure", "Value"], _figure_rows(m), "ll")
    yield Heading(3, "Recommendation")
    yield from _advice_blocks(report, m.advice)
    yield Heading(3, "Pods")
    yield _pods_table(m.pods, m.advice.even_share_tokens)
    yield Heading(3, "Pages")
    if not report.pages_known:
        yield Para(f"Not known from {report.source}: alerts are evaluated by Prometheus (its ALERTS series).")
    else:
        yield Items([_page_text(p) for p in m.pages]) if m.pages else Para("None.")
    yield Heading(3, "Plots")
    for name, caption in PLOT_CAPTIONS.items():
        yield Image(f"{slug}-{name}.png", caption)


def _figure_rows(m: ModelReport) -> list[list[str]]:
    u, c, p, g = m.usage, m.capacity, m.pressure, m.growth
    worst = f"{count(p.worst_hour_preemptions)} preemptions in the hour from {when(p.worst_hour_start)}"
    return [
        [
            "Usage: peak / p50 / p95 / p99",
            " / ".join(pct(x) for x in (u.peak_ratio, u.p50_ratio, u.p95_ratio, u.p99_ratio)),
        ],
        ["Hours above the warning", hours(u.hours_above_warning)],
        ["Hours above the watermark", hours(u.hours_above_watermark)],
        ["Capacity (vLLM) / usable, tokens", f"{tokens(c.capacity_tokens)} / {tokens(c.usable_tokens)}"],
        ["Theoretical capacity, tokens", tokens(c.theoretical_tokens)],
        ["vLLM / theoretical", pct(c.efficiency_ratio)],
        ["Peak demand, tokens", f"{tokens(c.peak_demand_tokens)} ({pct(c.peak_demand_ratio)} of usable)"],
        ["Idle at the peak", pct(c.idle_ratio)],
        ["Preemptions", count(p.preemptions)],
        ["Worst hour for preemptions", worst if p.worst_hour_start is not None else NONE],
        ["Hours with requests waiting for KV", hours(p.hours_waiting)],
        ["Prefix-cache hit ratio", pct(p.prefix_hit_ratio)],
        ["Peak demand the period before, tokens", tokens(g.previous_peak_demand_tokens)],
        ["Change of peak demand", change(g.change_ratio)],
        ["Growth", _growth_text(m)],
    ]


def _advice_blocks(report: Report, a: Advice) -> Iterator[Any]:
    yield Para(a.sentence or f"{action(a.action)}.")
    if a.uneven:
        yield Para(a.uneven)
    if _known(a.peak_usage_after_ratio):
        yield Para(
            f"Effect: the period's peak would sit at {pct(a.peak_usage_after_ratio)} of the new capacity "
            f"(target {pct(report.target_usage)})."
        )
    gpus = a.gpus_per_replica
    gpu = f"{a.gpu} × " if a.gpu else ""
    lines = []
    if a.replicas_now is not None and a.capacity_now_tokens is not None:
        now = ", ".join(a.current_flags) or "settings unknown"
        on = f"{gpu}{a.replicas_now} replica{'s' if a.replicas_now != 1 else ''}" + (
            f" ({a.replicas_now * gpus} GPUs)" if gpus else ""
        )
        lines.append(f"Now: {now} on {on}, {tokens(a.capacity_now_tokens)} tokens of pool per replica (vLLM's figure)")
        if not a.gpu:
            lines.append(GPU_UNKNOWN)
    if a.set_flags and a.suggested_replicas is not None and a.capacity_after_tokens is not None:
        n = a.suggested_replicas
        on = f"{gpu}{n} replica{'s' if n != 1 else ''}" + (f" ({n * gpus} GPUs)" if gpus else "")
        lines.append(
            f"Recommended: {', '.join(a.set_flags)} on {on}, "
            f"{tokens(a.capacity_after_tokens)} tokens of pool per replica"
        )
    if a.replicas_needed_now is not None:
        lines.append(f"Replicas the peak needs at the target with today's setting: {a.replicas_needed_now}")
    if a.concurrency_now is not None and a.concurrency_after is not None:
        lines.append(f"Max-length requests per replica: {a.concurrency_now} → {a.concurrency_after}")
    if a.capacity_shortfall_tokens is not None:
        lines.append(f"One replica's shortfall at the upper bound: {tokens(a.capacity_shortfall_tokens)} tokens")
    lines += [f"With {LEVER_TEXT.get(k, k)}: {tokens(v)} tokens per replica" for k, v in sorted(a.levers.items())]
    lines.append(f"Action: {action(a.action)} ({REASON_TEXT.get(a.reason, a.reason.replace('_', ' '))})")
    yield Items(lines)


def _pods_table(pods: list[PodReport], even_share: float | None) -> Table:
    """Each pod's figures and its own peak over the even share of the workload's (the advice is per workload)."""
    header = ["Pod", "Engine", "Peak", "p95", "Above warning", "Above watermark"]
    header += ["Usable tokens", "Peak demand / usable", "Peak demand / even share", "Preemptions", "Pages"]
    rows = [
        [
            p.pod,
            p.engine,
            pct(p.usage.peak_ratio),
            pct(p.usage.p95_ratio),
            hours(p.usage.hours_above_warning),
            hours(p.usage.hours_above_watermark),
            tokens(p.capacity.usable_tokens),
            pct(p.capacity.peak_demand_ratio),
            pct(p.capacity.peak_demand_tokens / even_share)
            if even_share and p.capacity.peak_demand_tokens is not None
            else NONE,
            count(p.pressure.preemptions),
            count(p.pages),
        ]
        for p in pods
    ]
    return Table(header, rows, "llrrrrrrrrr")


def _page_text(p: Page) -> str:
    end = _utc(p.end, "%H:%M UTC") if _utc(p.end, "%Y-%m-%d") == _utc(p.start, "%Y-%m-%d") else when(p.end)
    who = f", {p.pod}" if p.pod else ""
    return f"{p.alertname} ({p.severity}){who}: {when(p.start)} to {end} ({_span(p.end - p.start)})"


# ----------------------------------------------------------------------------- Markdown


def markdown(report: Report, pictures: dict[str, bytes], images_folder: str) -> str:
    """The report as Markdown; images link to ``images_folder/<name>`` next to the file."""
    lines: list[str] = []
    for block in _flatten(blocks(report)):
        lines += _md_block(block, images_folder)
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _flatten(items: list[Any]) -> Iterator[Any]:
    for b in items:
        if isinstance(b, Section):
            yield from b.blocks
        else:
            yield b


def _md_block(block: Any, images_folder: str) -> list[str]:
    if isinstance(block, Heading):
        return ["#" * block.level + " " + _md_text(block.text)]
    if isinstance(block, Para):
        return [f"_{_md_text(block.text)}_" if block.kind == "generated" else _md_text(block.text)]
    if isinstance(block, Items):
        return [f"{i}. {_md_text(t)}" if block.numbered else f"- {_md_text(t)}" for i, t in enumerate(block.items, 1)]
    if isinstance(block, Table):
        align = ["---:" if a == "r" else "---" for a in block.align]
        rows = [[_md_cell(h) for h in block.header], align] + [[_md_cell(c) for c in row] for row in block.rows]
        return ["| " + " | ".join(row) + " |" for row in rows]
    if isinstance(block, Image):
        return [f"![{block.caption}]({images_folder}/{block.name})"]
    raise TypeError(f"unknown block {block!r}")


#: What Markdown and GFM read as syntax in running text: emphasis, code, links and images, raw HTML and
#: entities, strikethrough, table cells (CommonMark 0.31 "Backslash escapes": any ASCII punctuation may be
#: escaped; GFM 0.29 "Tables": ``\\|`` inside a cell). An ``_`` between two letters or digits is left as
#: it is: CommonMark never reads it as emphasis ("Emphasis and strong emphasis", rule 2), so
#: ``gpu_memory_utilization`` stays readable in the file.
_MD_SPECIAL = re.compile(r"[\\`*\[\]<>|&~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
#: Line and paragraph breaks (and every other control character): a label value stays on its line.
_MD_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")


def _md_text(text: str) -> str:
    """Plain text as Markdown that shows it as it is: a label value cannot add HTML, a link, an image,
    emphasis, a table column or a line (breaks become a space, syntax characters are escaped)."""
    out = _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), _MD_BREAKS.sub(" ", text))
    return "\\" + out if out[:1] in ("#", "+", "=", ">") else out


def _md_cell(text: str) -> str:
    return _md_text(text)


# ----------------------------------------------------------------------------- HTML

CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { font-family: "DejaVu Sans", "Helvetica Neue", Arial, sans-serif; color: #1d2330; background: #fff;
  margin: 0 auto; padding: 24px 32px; max-width: 1180px; line-height: 1.45; font-size: 15px; }
h1 { font-size: 26px; margin: 0 0 8px; }
h2 { font-size: 21px; margin: 28px 0 8px; padding-bottom: 4px; border-bottom: 2px solid #d9dde5; }
h3 { font-size: 16px; margin: 20px 0 6px; }
p, li { overflow-wrap: anywhere; }
.lead { margin: 2px 0; color: #39404f; }
.generated { margin: 2px 0 0; color: #6b7280; font-size: 13px; }
.status { font-weight: bold; }
table { border-collapse: collapse; width: 100%; max-width: 100%; margin: 6px 0 12px; font-size: 13.5px; }
table.pairs { width: auto; }
th, td { border: 1px solid #d9dde5; padding: 4px 7px; text-align: right; vertical-align: top; }
th { background: #f2f4f8; font-weight: bold; vertical-align: bottom; }
td { white-space: nowrap; }
th.t, td.t { text-align: left; }
td.t { white-space: normal; overflow-wrap: break-word; }
.table { max-width: 100%; overflow-x: auto; }
tr.action td { background: #fff4e5; }
a { color: #2f5fb8; text-decoration: none; }
figure { margin: 10px 0 18px; break-inside: avoid; page-break-inside: avoid; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid #e5e7eb; }
figcaption { font-size: 13px; color: #4b5563; margin-top: 3px; }
@media print {
  body { padding: 0; max-width: none; font-size: 11pt; }
  section.model { break-before: page; page-break-before: always; }
  table { font-size: 9pt; }
  h2, h3 { break-after: avoid; page-break-after: avoid; }
  tr { break-inside: avoid; page-break-inside: avoid; }
  a { color: inherit; }
}
"""


def page(report: Report, pictures: dict[str, bytes]) -> str:
    """The report as one HTML file: the plots embedded as ``data:`` URIs, no external resource."""
    content = blocks(report)
    title = html.escape(content[0].text)
    body = "\n".join(_html_block(b, pictures, report) for b in content)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{title}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _html_block(block: Any, pictures: dict[str, bytes], report: Report) -> str:
    e = html.escape
    if isinstance(block, Section):
        inner = "\n".join(_html_block(b, pictures, report) for b in block.blocks)
        return f'<section class="model" id="{e(block.anchor)}-section">\n{inner}\n</section>'
    if isinstance(block, Heading):
        anchor = f' id="{e(block.anchor)}"' if block.anchor else ""
        return f"<h{block.level}{anchor}>{e(block.text)}</h{block.level}>"
    if isinstance(block, Para):
        css = f' class="{block.kind}"' if block.kind else ""
        return f"<p{css}>{e(block.text)}</p>"
    if isinstance(block, Items):
        tag = "ol" if block.numbered else "ul"
        return f"<{tag}>" + "".join(f"<li>{e(t)}</li>" for t in block.items) + f"</{tag}>"
    if isinstance(block, Table):
        return _html_table(block, report)
    if isinstance(block, Image):
        data = base64.b64encode(pictures[block.name]).decode("ascii")
        return (
            f'<figure><img src="data:image/png;base64,{data}" alt="{e(block.caption)}" width="1100">'
            f"<figcaption>{e(block.caption)}</figcaption></figure>"
        )
    raise TypeError(f"unknown block {block!r}")


def _html_table(table: Table, report: Report) -> str:
    e = html.escape
    kinds = [' class="t"' if a == "l" else "" for a in table.align]
    head = "<tr>" + "".join(f"<th{k}>{e(h)}</th>" for k, h in zip(kinds, table.header, strict=True)) + "</tr>"
    rows = []
    for i, row in enumerate(table.rows):
        cells = [f"<td{k}>{e(c)}</td>" for k, c in zip(kinds, row, strict=True)]
        flag = ""
        if table.link_first is not None:
            cells[0] = f'<td{kinds[0]}><a href="#{e(table.link_first[i])}">{e(row[0])}</a></td>'
            flag = ' class="action"' if report.models[i].needs_action else ""
        rows.append(f"<tr{flag}>" + "".join(cells) + "</tr>")
    css = ' class="pairs"' if len(table.header) == 2 else ""
    # the wrapper scrolls a table that cannot fit (a pod name of 200 characters), never the page
    body = "\n".join(rows)
    return f'<div class="table"><table{css}>\n<thead>{head}</thead>\n<tbody>\n{body}\n</tbody>\n</table></div>'


# ----------------------------------------------------------------------------- JSON


def json_text(report: Report) -> str:
    """Every figure of the report: its dataclasses as objects, NaN/inf as null, keys sorted.

    Compact (no indentation): a week of 64 pods has millions of timeline points, and one per line made
    a 57 MB file that took longer to write than the report to read (``jq .`` indents it for people).
    The text is what ``json.dumps(..., sort_keys=True, separators=(",", ":"))`` gives for the same
    objects, written here so that a timeline becomes one string without a Python list of its points
    in between (120 MB for a week of 64 pods).
    """
    return "".join(json_pieces(report))


def json_pieces(report: Report) -> list[str]:
    """:func:`json_text` in pieces (ASCII: ``json.dumps`` escapes the rest)."""
    out: list[str] = []
    _json(report, out)
    out.append("\n")
    return out


#: ModelKey's fields the JSON always has (workload and cluster appear only when set: a report without those
#: labels reads as before)
_MODEL_KEY_ALWAYS = ("namespace", "model_name")


def _json(value: Any, out: list[str]) -> None:
    """Append the JSON text of ``value`` to ``out`` (as ``json.dumps`` with sorted keys, compact)."""
    if value is None or value is True or value is False:
        out.append("null" if value is None else "true" if value else "false")
    elif isinstance(value, str):
        out.append(json.dumps(value))
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(float.__repr__(value) if math.isfinite(value) else "null")
    elif isinstance(value, array):
        out.append(_float_list(value))
    elif isinstance(value, (list, tuple)):
        if value and all(type(v) is float for v in value):
            out.append(_float_list(value))
            return
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _json(v, out)
        out.append("]")
    elif isinstance(value, ModelKey):  # the workload and cluster only where the series carry them
        _json_object(((k, v) for k, v in dataclasses.asdict(value).items() if v or k in _MODEL_KEY_ALWAYS), out)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        _json_object(((f.name, getattr(value, f.name)) for f in dataclasses.fields(value)), out)
    elif isinstance(value, dict):
        _json_object(((str(k), v) for k, v in value.items()), out)
    else:
        raise TypeError(f"not JSON: {type(value).__name__}")


def _json_object(items: Iterator[tuple[str, Any]], out: list[str]) -> None:
    out.append("{")
    for i, (k, v) in enumerate(sorted(items, key=lambda kv: kv[0])):
        if i:
            out.append(",")
        out.append(json.dumps(k))
        out.append(":")
        _json(v, out)
    out.append("}")


def _float_list(values: Sequence[float]) -> str:
    """``[1.5,null,...]``: floats as ``repr`` writes them (as ``json`` does), NaN as null."""
    text = ",".join(map(float.__repr__, values))
    if "inf" in text:  # never in a report's figures; null as NaN is
        text = ",".join(float.__repr__(v) if math.isfinite(v) else "nan" for v in values)
    return "[" + text.replace("nan", "null") + "]"
