"""``--selector``: a PromQL label-matcher set such as ``{namespace="prod", model_name=~"llama.*"}``.

Prometheus applies it itself (it is pasted into every query, see :mod:`sidecar.report.prometheus`);
the embedded history applies it here with the same meaning: ``=``, ``!=``, ``=~`` and ``!~``, regular
expressions anchored at both ends as in PromQL (RE2 there, Python's ``re`` here: the common syntax is
the same), a missing label matching as the empty string.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


class SelectorError(ValueError):
    """A selector that is not a PromQL label-matcher set; the message says what to write."""


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str  # "=", "!=", "=~", "!~"
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.label, "")
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        found = re.fullmatch(self.value, have) is not None
        return found if self.op == "=~" else not found

    def promql(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.label}{self.op}"{escaped}"'


def parse_selector(text: str) -> tuple[Matcher, ...]:
    """The matchers of ``{a="b", ...}`` (``""`` or ``{}``: none); raises :class:`SelectorError`."""
    body = text.strip()
    if not body:
        return ()
    try:
        body.encode("utf-8")
    except UnicodeEncodeError:
        raise SelectorError(f"{text!r} is not UTF-8 text; label values are UTF-8") from None
    if not (body.startswith("{") and body.endswith("}")):
        raise SelectorError(f"{text!r} is not a label-matcher set; write it as '{{namespace=\"prod\"}}'")
    body = body[1:-1].strip()
    matchers: list[Matcher] = []
    pos = 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None:
            raise SelectorError(
                f"{text!r}: cannot read a matcher at {body[pos : pos + 20]!r}; "
                'each is label="value", label!="value", label=~"regex" or label!~"regex"'
            )
        value = re.sub(r"\\(.)", r"\1", m.group(3))
        if m.group(2) in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as e:
                raise SelectorError(f"{text!r}: {m.group(1)}: not a regular expression ({e})") from None
        matchers.append(Matcher(m.group(1), m.group(2), value))
        pos = m.end()
    return tuple(matchers)


def matches(matchers: tuple[Matcher, ...], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)


def promql(matchers: tuple[Matcher, ...]) -> str:
    """The matchers as PromQL, without braces (to join with other matchers)."""
    return ", ".join(m.promql() for m in matchers)
