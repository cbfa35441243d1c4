"""Exposition text -> samples, with a pre-filter that keeps only what an adapter reads.

Parsing is ``prometheus_client.parser`` (never a hand-rolled parser). A vLLM
page is ~600 lines of which the sidecar reads ~40; handing the parser only
those lines (plus their ``# HELP``/``# TYPE``) is what makes a scrape cheap
(``bench/scrape_cycle.py`` measures it). ``tests/test_prefilter.py`` proves on
every fixture that the filtered parse yields exactly the samples the adapter
takes from a full parse.

No page can make the parse slow or large: ``prometheus_client``'s label parsing costs the
length of a line times its number of labels, so what reaches it is bounded first
(:class:`PageLimits`, Prometheus' own per-scrape names: ``sample_limit``, ``label_limit``,
``label_name_length_limit``, ``label_value_length_limit``). The number of kept lines, each
line's length and an upper bound of its labels (its quotes) are checked with string operations
before the parser sees a line; the exact label count and lengths right after, on the lines that
were parsed. A page past a limit is :class:`LimitExceeded` (a failed scrape).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "LINE_OVERHEAD",
    "SPLIT_MAX_CHARS",
    "FilteredParser",
    "InvalidText",
    "LimitExceeded",
    "PageLimits",
    "Sample",
    "decode",
    "prefilter",
    "prefilter_pattern",
    "samples",
]


class InvalidText(ValueError):
    """The body is not Prometheus exposition text."""


class LimitExceeded(InvalidText):
    """The page is exposition text, but beyond one of the target's :class:`PageLimits`."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason  # sample_limit | label_limit
        super().__init__(detail)


#: Room on a line for the metric name, the value and a timestamp (the names kept are the adapter's own).
LINE_OVERHEAD = 1024


@dataclass(frozen=True)
class PageLimits:
    """A target's bounds on the sample lines the adapter reads; 0 = no limit (as in Prometheus)."""

    sample_limit: int = 0
    label_limit: int = 0
    label_name_length_limit: int = 0
    label_value_length_limit: int = 0

    @property
    def line_limit(self) -> int:
        """The longest line the three label limits allow, every value character escaped; 0 = none."""
        if not (self.label_limit and self.label_name_length_limit and self.label_value_length_limit):
            return 0
        return LINE_OVERHEAD + self.label_limit * (self.label_name_length_limit + 2 * self.label_value_length_limit + 6)

    def check_line(self, line: str) -> None:
        """Before parsing: the line's length, and its quotes (two per label value; escaped ones are
        allowed as many again), so that the parser's cost per line is bounded."""
        line_limit = self.line_limit
        if line_limit and len(line) > line_limit:
            raise LimitExceeded(
                "label_limit", f"a sample line of {len(line)} characters > {line_limit} ({_start(line)})"
            )
        if self.label_limit and line.count('"') > 4 * self.label_limit + 4:
            raise LimitExceeded(
                "label_limit", f"a sample line with more than {self.label_limit} labels ({_start(line)})"
            )

    def check_sample(self, sample: Sample) -> None:
        """After parsing: the exact number of labels and their lengths."""
        name, labels, _ = sample
        if self.label_limit and len(labels) > self.label_limit:
            raise LimitExceeded("label_limit", f"{name}: {len(labels)} labels > label_limit {self.label_limit}")
        for key, value in labels.items():
            if self.label_name_length_limit and len(key) > self.label_name_length_limit:
                raise LimitExceeded(
                    "label_limit",
                    f"{name}: a label name of {len(key)} characters > label_name_length_limit "
                    f"{self.label_name_length_limit} ({key[:40]!r}...)",
                )
            if self.label_value_length_limit and len(value) > self.label_value_length_limit:
                raise LimitExceeded(
                    "label_limit",
                    f"{name}: label {key[:40]} has {len(value)} characters > label_value_length_limit "
                    f"{self.label_value_length_limit}",
                )


def _start(line: str) -> str:
    """The beginning of a line, for a log: never the whole of a hostile one."""
    return repr(line[:60]) + ("..." if len(line) > 60 else "")


def prefilter_pattern(needed: Iterable[str]) -> re.Pattern[str]:
    """A multiline regex matching the sample lines of ``needed``.

    ``# HELP``/``# TYPE`` lines are dropped: the parser then reads every kept
    line as an untyped sample of the same name, labels and value, which is all
    the adapters use (the differential test checks exactly that).
    """
    names = "|".join(sorted((re.escape(n) for n in set(needed)), key=len, reverse=True))
    return re.compile(rf"^(?:{names})[{{ ].*$", re.MULTILINE)


def prefilter(text: str, pattern: re.Pattern[str]) -> str:
    """Only the lines ``pattern`` keeps, in their original order."""
    return "\n".join(pattern.findall(text)) + "\n"


Sample = tuple[str, dict[str, str], float]

#: A page up to this many characters is split into lines and filtered by name, the fastest on a vLLM page
#: (about twice the regex's speed); a larger one is scanned by :func:`prefilter_pattern`'s regex, which
#: stops at the sample limit without holding every line of the page.
SPLIT_MAX_CHARS = 1 << 20


def _named(line: str, needed: frozenset[str]) -> bool:
    """Whether ``line``'s sample name (up to ``{`` or a space) is one of ``needed``: the regex's test."""
    brace, space = line.find("{"), line.find(" ")
    end = brace if brace >= 0 and (space < 0 or brace < space) else space
    return end >= 0 and line[:end] in needed


def samples(text: str) -> Iterator[Sample]:
    """``(name, labels, value)`` for every sample; :class:`InvalidText` on malformed input."""
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                yield s.name, s.labels, s.value
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise InvalidText(str(e)[:200]) from None


class FilteredParser:
    """Pre-filter + parse for one target, reusing the parse of lines that did not change.

    Most kept lines are the same text scrape after scrape (the ~40-label
    ``vllm:cache_config_info``, idle histogram buckets, zero counters). Only the
    lines that differ from the previous scrape go through the parser, in one
    batch; the others reuse last scrape's samples. The memo holds exactly the
    previous scrape's lines, so it cannot grow. The differential test runs every
    fixture through it twice against a full parse.
    """

    def __init__(self, needed: Iterable[str]):
        self.pattern = prefilter_pattern(needed)
        self._needed = frozenset(needed)
        self._names = tuple(sorted(self._needed))
        self._memo: dict[str, Sample] = {}
        self._limits = PageLimits()

    def lines(self, text: str, sample_limit: int = 0) -> list[str]:
        """The kept lines of ``text`` in page order (what :func:`prefilter` keeps); :class:`LimitExceeded`
        when there are more than ``sample_limit`` (0 = no limit)."""
        if len(text) <= SPLIT_MAX_CHARS:
            names, needed = self._names, self._needed
            lines = [line for line in text.split("\n") if line.startswith(names) and _named(line, needed)]
        elif sample_limit:
            # stop at the first line past the limit: a page of a million kept lines costs no more
            lines = [m.group() for m in islice(self.pattern.finditer(text), sample_limit + 1)]
        else:
            lines = self.pattern.findall(text)
        if sample_limit and len(lines) > sample_limit:
            raise LimitExceeded(
                "sample_limit", f"more than {sample_limit} sample lines of the families read (sample_limit)"
            )
        return lines

    def samples(self, text: str, limits: PageLimits | None = None) -> list[Sample]:
        """The kept samples of ``text``; :class:`LimitExceeded` past ``limits``, :class:`InvalidText`."""
        limits = limits or PageLimits()
        if limits != self._limits:  # the memo's lines were checked against other limits
            self._memo, self._limits = {}, limits
        lines = self.lines(text, limits.sample_limit)
        previous = self._memo
        misses = [line for line in lines if line not in previous]
        fresh: dict[str, Sample] = {}
        if misses:
            for line in misses:
                limits.check_line(line)
            parsed = list(samples("\n".join(misses) + "\n"))
            if len(parsed) != len(misses):  # each kept line is one sample line; anything else is malformed
                raise InvalidText(f"{len(misses)} sample lines gave {len(parsed)} samples")
            for sample in parsed:
                limits.check_sample(sample)
            fresh = dict(zip(misses, parsed, strict=True))
        memo: dict[str, Sample] = {}
        out: list[Sample] = []
        for line in lines:
            sample = previous.get(line) or fresh[line]
            memo[line] = sample
            out.append(sample)
        self._memo = memo
        return out


def decode(body: bytes | bytearray) -> str:
    """UTF-8 text of a body, or :class:`InvalidText` for binary garbage."""
    if b"\x00" in body:
        raise InvalidText("body contains NUL bytes (binary data, not exposition text)")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidText(f"body is not UTF-8 ({e.reason} at byte {e.start})") from None
