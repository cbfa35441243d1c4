"""Exposition text -> samples, with a pre-filter that keeps only what an adapter reads.

Parsing is ``prometheus_client.parser`` (never a hand-rolled parser). A vLLM
page is ~600 lines of which the sidecar reads ~40; handing the parser only
those lines (plus their ``# HELP``/``# TYPE``) is what makes a scrape cheap
(``bench/scrape_cycle.py`` measures it). ``tests/test_parse.py`` proves on
every fixture that the filtered parse yields exactly the samples the adapter
takes from a full parse.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator

from prometheus_client.parser import text_string_to_metric_families


class InvalidText(ValueError):
    """The body is not Prometheus exposition text."""


def _family_of(sample_name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_total"):
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)]
    return sample_name


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
    """Pre-filter + parse for one target, remembering the parse of its info lines.

    An info gauge such as ``vllm:cache_config_info`` carries ~40 labels and is
    the same line scrape after scrape; it costs a quarter of the parse, so its
    samples are kept per exact line text (a changed line is parsed afresh).
    """

    def __init__(self, needed: Iterable[str], info_names: Iterable[str] = ()):
        self.pattern = prefilter_pattern(needed)
        self._info_prefixes = tuple(f"{n}{{" for n in info_names)
        self._memo: dict[str, list[Sample]] = {}

    def samples(self, text: str) -> list[Sample]:
        lines = self.pattern.findall(text)
        out: list[Sample] = []
        rest = []
        for line in lines:
            if line.startswith(self._info_prefixes):
                cached = self._memo.get(line)
                if cached is None:
                    cached = list(samples(line + "\n"))
                    if len(self._memo) > 64:  # bounded: a churning label set must not grow memory
                        self._memo.clear()
                    self._memo[line] = cached
                out.extend(cached)
            else:
                rest.append(line)
        out.extend(samples("\n".join(rest) + "\n"))
        return out


def decode(body: bytes) -> str:
    """UTF-8 text of a body, or :class:`InvalidText` for binary garbage."""
    if b"\x00" in body:
        raise InvalidText("body contains NUL bytes (binary data, not exposition text)")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidText(f"body is not UTF-8 ({e.reason} at byte {e.start})") from None
