"""Replace files so that a reader never sees half of one: the package's one atomic writer.

Every file the package writes for others to read (generated rules and dashboards, the weekly report
and its images, dashboard snapshots, the report's delivery marker) goes through here:

1. the new content is written to a temporary file in the target's own folder, so that the rename
   below stays on one filesystem and can never turn into a copy;
2. the temporary file is flushed and ``fsync``-ed, so its bytes are on disk before it gets the name;
3. it is made readable (``mkstemp`` creates it 0600; a generated file is 0644 like one from ``cp``);
4. ``os.replace`` renames it over the target: ``rename(2)`` is atomic on POSIX, a reader opens
   either the old file or the new one, never a mix (POSIX.1-2017, rename: "a link named new shall
   remain visible to other threads throughout the renaming operation");
5. the folder is ``fsync``-ed, so the rename itself survives a power cut (the directory entry is
   data of the folder, not of the file).

A failure before the rename (a full disk, an error raised by the code producing the content, a
Ctrl-C) removes the temporary file and leaves the old file exactly as it was. A process killed
outright (``SIGKILL``, a power cut) while writing also leaves the old file intact, but nothing runs
to remove its temporary file: it stays as the hidden ``.<name>.<random>.tmp`` beside the target.

Three entry points:

- :func:`write_atomically`: one file from text, bytes, or an iterable of pieces (a 25 MB JSON
  document written piece by piece is never held whole);
- :func:`write_atomically_with`: one file from a function that writes to a binary file object
  (``Figure.savefig``, ``json.dump`` through a wrapper, a streaming encoder);
- :func:`replace_together`: several files that belong together (a report and its images): all are
  written to temporary files first, and only when every one is complete are they renamed into
  place, in the order given; nothing new is left when a write fails.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

#: What a file is made of: text (written as UTF-8), bytes, or pieces of either written one by one.
Content = str | bytes | Iterable[str | bytes]

#: The permission bits of a written file: readable by everyone, writable by its owner (as ``cp`` makes it).
FILE_MODE = 0o644


def write_atomically(path: Path, content: Content, *, mode: int = FILE_MODE) -> None:
    """Replace ``path`` with ``content`` atomically, creating its missing parent folders.

    ``content`` is text (UTF-8), bytes, or an iterable of str/bytes pieces written in order.
    On any failure the old file is unchanged and no temporary file is left.
    """
    write_atomically_with(path, _writer(content), mode=mode)


def write_atomically_with(path: Path, write: Callable[[BinaryIO], object], *, mode: int = FILE_MODE) -> None:
    """Replace ``path`` with what ``write(f)`` writes to the binary file ``f``, creating missing parent folders.

    What ``write`` raises propagates after the temporary file is removed; the old file is unchanged.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _stage(path, write, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def replace_together(files: Sequence[tuple[Path, Content]], *, mode: int = FILE_MODE) -> None:
    """Write every ``(path, content)`` to a temporary file, then rename them all into place, in order.

    Their folders must exist (a caller that creates them knows which to remove again on failure).
    A failure while writing leaves no new file at all; one during the renames (a Ctrl-C, a folder
    removed meanwhile) leaves the files renamed so far and removes every temporary file, so put the
    files that others point to (a document linking to images) last.
    """
    staged: list[tuple[Path, Path]] = []
    try:
        for path, content in files:
            staged.append((_stage(Path(path), _writer(content), mode), Path(path)))
        for tmp, path in staged:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for folder in dict.fromkeys(path.parent for _, path in staged):
        _fsync_folder(folder)


def _writer(content: Content) -> Callable[[BinaryIO], None]:
    """A function writing ``content`` to a binary file: text as UTF-8, pieces one by one."""
    if isinstance(content, str):
        content = content.encode("utf-8")
    if isinstance(content, bytes):
        data = content

        def write_bytes(f: BinaryIO) -> None:
            f.write(data)

        return write_bytes
    pieces = content

    def write_pieces(f: BinaryIO) -> None:
        for piece in pieces:
            f.write(piece.encode("utf-8") if isinstance(piece, str) else piece)

    return write_pieces


def _stage(path: Path, write: Callable[[BinaryIO], object], mode: int) -> Path:
    """A complete, synced temporary file next to ``path`` holding what ``write`` wrote; removed on failure."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable; a filesystem that cannot sync folders is left as it is."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # e.g. some network filesystems refuse fsync on a folder: the rename is done, only not yet durable
    finally:
        os.close(fd)
