"""Reading the files the sidecar is given, safely: configuration YAML, a model's JSON, token files.

Whatever a ConfigMap or a model directory holds, reading it must not block, bloat or crash the sidecar:

- only a **regular file** is read: a FIFO, a device (``/dev/zero``), a directory or a socket is refused
  at once (the file is opened with ``O_NONBLOCK`` and checked with ``fstat`` before one byte is read);
- at most a **size cap** is read (:data:`YAML_MAX_BYTES`, :data:`JSON_MAX_BYTES`, ...): a larger file is
  refused by its size, a file that grows while read (``/proc``) after the cap;
- text is **strict UTF-8** (a leading byte-order mark is allowed);
- YAML goes through the safe loader, with **duplicate keys** refused (PyYAML keeps the last one
  silently), nesting bounded (:data:`MAX_DEPTH`) and **alias expansion** bounded (:data:`YAML_MAX_NODES`:
  the "billion laughs" document is refused after reading its first aliases, in milliseconds);
- JSON nesting is bounded (:data:`MAX_DEPTH`) and an integer too big for a float is refused.

Every problem is a :class:`FileProblem` holding one line per problem (``line 3, column 1: ...``), each
saying what to do; the configuration turns them into its own error (exit 2). The caps are rows of
:data:`sidecar.limits.LIMITS` (``config.*``, ``model.*``).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from typing import Any

import yaml

from .units import format_size

__all__ = [
    "INDEX_MAX_BYTES",
    "JSON_MAX_BYTES",
    "MAX_DEPTH",
    "TOKEN_MAX_BYTES",
    "YAML_MAX_BYTES",
    "YAML_MAX_NODES",
    "FileProblem",
    "not_regular",
    "read_bytes",
    "read_json",
    "read_text",
    "read_yaml",
]

#: A YAML configuration file (``--config.file``, ``--web.config.file``): the generated example with every
#: field (deploy/examples/sidecar.yaml) is about 10 KiB.
YAML_MAX_BYTES = 1 << 20
#: A model's ``config.json``: real ones are a few KiB (those of tests/fixtures/model-configs: 2 KiB at most).
JSON_MAX_BYTES = 16 << 20
#: ``model.safetensors.index.json``: one line per tensor, a few MB for the largest models.
INDEX_MAX_BYTES = 64 << 20
#: A bearer-token file: a Kubernetes service-account token is about 1 KiB.
TOKEN_MAX_BYTES = 64 << 10
#: Nesting of mappings and lists, in YAML and JSON: real files nest 4 levels deep.
MAX_DEPTH = 64
#: Nodes of a YAML document once its aliases are expanded: a full configuration has a few hundred.
YAML_MAX_NODES = 100_000
#: Digits of an integer in a YAML or JSON file: no count the sidecar reads has more than 20.
MAX_INT_DIGITS = 64

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class FileProblem(ValueError):
    """What keeps a file from being used: one line per problem, each ending with the fix."""

    def __init__(self, path: str, problems: list[str], reason: str | None = None):
        self.path = path
        self.problems = problems
        #: the first problem without its fix, for a caller that words its own (``cannot read 'x': <reason>``)
        self.reason = reason or problems[0]
        super().__init__("; ".join(f"{path}: {p}" for p in problems))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def not_regular(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it exists and is not a regular file (``a FIFO (named pipe)``), else None.

    For the paths that are not read through :func:`read_bytes` (SQLite opens the history itself):
    ``stat`` never blocks, where opening a FIFO for reading waits for a writer.
    """
    try:
        st = os.stat(path)
    except OSError:
        return None  # missing or unreachable: the caller's own open says why
    return None if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)


def read_bytes(path: str, *, max_bytes: int, what: str = "file") -> bytes:
    """The content of the regular file ``path``, at most ``max_bytes``; else :class:`FileProblem`.

    ``what`` names the file in the fix (``a configuration file``). Never blocks: the file is opened
    non-blocking and must be a regular file before anything is read.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        why = e.strerror or str(e)
        raise FileProblem(path, [f"cannot read the file: {why} (check the path)"], why) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = f"is {_kind(st.st_mode)}, not a regular file"
            raise FileProblem(path, [f"{kind} (give the path of {what})"], kind)
        if st.st_size > max_bytes:
            raise FileProblem(path, [_too_large(f"{st.st_size:,} bytes", max_bytes, what)])
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except BlockingIOError:
        raise FileProblem(path, [f"cannot be read without waiting (give the path of {what})"]) from None
    except OSError as e:
        raise FileProblem(path, [f"cannot read the file: {e.strerror or e} (check the path)"]) from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise FileProblem(path, [_too_large(None, max_bytes, what)])
    return b"".join(chunks)


def _too_large(size: str | None, max_bytes: int, what: str) -> str:
    held = f"is {size}, more than" if size else "holds more than"
    return f"{held} the {format_size(max_bytes)} {what} may hold (is this the right file?)"


def read_text(path: str, *, max_bytes: int, what: str = "file") -> str:
    """:func:`read_bytes` decoded as strict UTF-8 (a leading byte-order mark is dropped)."""
    raw = read_bytes(path, max_bytes=max_bytes, what=what)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise FileProblem(
            path, [f"line {line}: not UTF-8 text (byte {e.start} is 0x{raw[e.start]:02x}); save the file as UTF-8"]
        ) from None


# ----------------------------------------------------------------------------- YAML


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


def _int_constructor(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """YAML's int, refused past :data:`MAX_INT_DIGITS` (``int()`` of 5,000 digits raises ValueError)."""
    if len(node.value) > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer of {len(node.value)} characters is too long to be a value", node.start_mark
        )
    value: int = yaml.SafeLoader.construct_yaml_int(loader, node)
    return value


_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc]
    """The safe loader (libyaml's when installed) with bounded integers."""


_Loader.add_constructor("tag:yaml.org,2002:int", _int_constructor)


@dataclass
class _Frame:
    """One open mapping or list while :func:`_check_events` walks a document."""

    path: str  # where it is: ``scrape``, ``targets[0]``
    anchor: str | None = None
    mapping: bool = False
    nodes: int = 1  # the values it expands to so far
    keys: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (line, column) it is first at
    at_key: bool = True  # (a mapping) the next node is a key
    key: str = "?"  # (a mapping) the last key, naming the value that follows
    index: int = 0  # (a list) the next item's index
    root: bool = False  # the stream: its one node is the document

    def child(self) -> str:
        """The path of the node that comes next in this frame."""
        if self.root:
            return ""
        if self.mapping:
            return f"{self.path}.{self.key}" if self.path else self.key
        return f"{self.path}[{self.index}]"

    def advance(self, key: str | None, mark: Any, problems: list[str]) -> None:
        """A node was read in this frame: a key (``key``: its text, None when not a scalar) or a value."""
        if not self.mapping:
            self.index += 1
            return
        if not self.at_key:
            self.at_key = True
            return
        self.at_key = False
        self.key = key if key is not None else "?"
        if key is None:
            return
        at = (mark.line + 1, mark.column + 1)
        if key in self.keys:
            first = self.keys[key]
            where = (
                f"lines {first[0]} and {at[0]}"
                if first[0] != at[0]
                else f"line {at[0]}, columns {first[1]} and {at[1]}"
            )
            problems.append(f"{self.child()}: duplicate key ({where}): only one can be meant, remove the other")
        else:
            self.keys[key] = at


def _check_events(text: str) -> list[str]:
    """Duplicate keys, nesting deeper than :data:`MAX_DEPTH`, aliases expanding past :data:`YAML_MAX_NODES`.

    One pass over the parser's events (no document is built): each mapping or list is a frame counting
    the nodes it expands to; an alias adds its anchor's count. Duplicate keys are all listed; the
    bounds stop the pass where they are crossed.
    """
    problems: list[str] = []
    loader = _Loader(text)
    frames = [_Frame("", nodes=0, root=True)]
    sizes: dict[str, int] = {}
    total = 0
    try:
        while True:
            event = loader.get_event()
            if event is None or isinstance(event, yaml.StreamEndEvent):
                break
            top = frames[-1]
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(frames) > MAX_DEPTH:
                    problems.append(f"{_where(event.start_mark)}nested deeper than {MAX_DEPTH} levels (flatten it)")
                    return problems
                path = top.child()
                top.advance(None, event.start_mark, problems)
                frames.append(_Frame(path, event.anchor, isinstance(event, yaml.MappingStartEvent)))
                total += 1
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                done = frames.pop()
                if done.anchor is not None:
                    sizes[done.anchor] = done.nodes
                frames[-1].nodes += done.nodes
            elif isinstance(event, yaml.ScalarEvent):
                top.advance(event.value, event.start_mark, problems)
                top.nodes += 1
                total += 1
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor not in sizes:
                    open_anchor = any(f.anchor == event.anchor for f in frames)
                    why = "refers to the node that holds it" if open_anchor else "is not defined before it"
                    problems.append(f"{_where(event.start_mark)}alias *{event.anchor} {why} (remove it)")
                    return problems
                top.advance(None, event.start_mark, problems)
                top.nodes += sizes[event.anchor]
                total += sizes[event.anchor]
            if total > YAML_MAX_NODES:
                problems.append(
                    f"{_where(event.start_mark)}expands to more than {YAML_MAX_NODES:,} values through aliases "
                    "(anchors and aliases may repeat a part, not multiply it; write the values out)"
                )
                return problems
    finally:
        loader.dispose()
    return problems


def read_yaml(
    path: str,
    *,
    max_bytes: int = YAML_MAX_BYTES,
    what: str = "a YAML configuration file",
    duplicates: list[str] | None = None,
) -> Any:
    """The YAML document in ``path`` (None when empty), read with every bound of this module.

    Raises :class:`FileProblem` listing every duplicate key, or the first syntax error or bound crossed.
    ``duplicates``: when given, duplicate keys are appended to it instead (the last one kept, as PyYAML
    does), so that the caller reports them with the problems of the values, in one pass.
    """
    text = read_text(path, max_bytes=max_bytes, what=what)
    try:
        problems = _check_events(text)
        fatal = [p for p in problems if ": duplicate key (" not in p]
        if fatal or (problems and duplicates is None):
            raise FileProblem(path, fatal or problems)
        if duplicates is not None:
            duplicates.extend(problems)
        return yaml.load(text, Loader=_Loader)  # a safe loader (the SafeLoader with bounded ints)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        fix = "fix that value" if isinstance(e, yaml.constructor.ConstructorError) else "fix the syntax there"
        raise FileProblem(path, [f"{_where(mark)}not valid YAML: {problem} ({fix})"]) from None
    except (ValueError, TypeError, OverflowError) as e:  # e.g. a timestamp 2025-02-30
        if isinstance(e, FileProblem):
            raise
        raise FileProblem(path, [f"not valid YAML: {e} (fix that value)"]) from None


# ----------------------------------------------------------------------------- JSON


class _BadNumber(Exception):
    pass


def _parse_int(text: str) -> int:
    """JSON's integers, refused past :data:`MAX_INT_DIGITS` digits (none fits a float or a count)."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _BadNumber(text)
    return int(text)


def _depth_problem(value: Any) -> bool:
    """Whether ``value`` nests deeper than :data:`MAX_DEPTH` (iteratively: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > MAX_DEPTH:
                    return True
                stack.append((child, depth + 1))
    return False


def read_json(path: str, *, max_bytes: int = JSON_MAX_BYTES, what: str = "a model's config.json") -> Any:
    """The JSON value in ``path``, read with every bound of this module; else :class:`FileProblem`."""
    text = read_text(path, max_bytes=max_bytes, what=what)
    try:
        value = json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        raise FileProblem(
            path, [f"line {e.lineno}, column {e.colno}: not valid JSON: {e.msg} (fix the syntax there)"]
        ) from None
    except RecursionError:
        raise FileProblem(path, [f"nested deeper than {MAX_DEPTH} levels (is this the right file?)"]) from None
    except _BadNumber as e:
        shown = str(e)[:20]
        raise FileProblem(
            path, [f"an integer of {len(str(e))} digits ({shown}...) is too big to be any value (fix that number)"]
        ) from None
    if _depth_problem(value):
        raise FileProblem(path, [f"nested deeper than {MAX_DEPTH} levels (is this the right file?)"])
    return value
