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
    """A multiline regex matching the sample lines of ``needed`` and their HELP/TYPE lines."""
    names = set(needed)
    families = {_family_of(n) for n in names} | names
    samples = "|".join(sorted((re.escape(n) for n in names), key=len, reverse=True))
    fams = "|".join(sorted((re.escape(n) for n in families), key=len, reverse=True))
    return re.compile(rf"^(?:(?:{samples})[{{ ]|# (?:HELP|TYPE) (?:{fams}) ).*$", re.MULTILINE)


def prefilter(text: str, pattern: re.Pattern[str]) -> str:
    """Only the lines ``pattern`` keeps, in their original order."""
    return "\n".join(m.group(0) for m in pattern.finditer(text)) + "\n"


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` for every sample; :class:`InvalidText` on malformed input."""
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                yield s.name, s.labels, s.value
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise InvalidText(str(e)[:200]) from None


def decode(body: bytes) -> str:
    """UTF-8 text of a body, or :class:`InvalidText` for binary garbage."""
    if b"\x00" in body:
        raise InvalidText("body contains NUL bytes (binary data, not exposition text)")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidText(f"body is not UTF-8 ({e.reason} at byte {e.start})") from None
