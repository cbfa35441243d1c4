"""Exposition text -> samples, with a pre-filter that keeps only what an adapter reads.

Parsing is ``prometheus_client.parser`` (never a hand-rolled parser). A vLLM
page is ~600 lines of which the sidecar reads ~40; handing the parser only
those lines (plus their ``# HELP``/``# TYPE``) is what makes a scrape cheap
(``bench/scrape_cycle.py`` measures it). ``tests/test_prefilter.py`` proves on
every fixture that the filtered parse yields exactly the samples the adapter
takes from a full parse.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from prometheus_client.parser import text_string_to_metric_families


class InvalidText(ValueError):
    """The body is not Prometheus exposition text."""


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
        self._memo: dict[str, Sample] = {}

    def samples(self, text: str) -> list[Sample]:
        lines = self.pattern.findall(text)
        previous = self._memo
        misses = [line for line in lines if line not in previous]
        fresh: dict[str, Sample] = {}
        if misses:
            parsed = list(samples("\n".join(misses) + "\n"))
            if len(parsed) != len(misses):  # each kept line is one sample line; anything else is malformed
                raise InvalidText(f"{len(misses)} sample lines gave {len(parsed)} samples")
            fresh = dict(zip(misses, parsed, strict=True))
        memo: dict[str, Sample] = {}
        out: list[Sample] = []
        for line in lines:
            sample = previous.get(line) or fresh[line]
            memo[line] = sample
            out.append(sample)
        self._memo = memo
        return out


def decode(body: bytes) -> str:
    """UTF-8 text of a body, or :class:`InvalidText` for binary garbage."""
    if b"\x00" in body:
        raise InvalidText("body contains NUL bytes (binary data, not exposition text)")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidText(f"body is not UTF-8 ({e.reason} at byte {e.start})") from None
