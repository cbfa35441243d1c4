"""The one atomic writer (``sidecar.atomic_write``) on real files: a reader sees the old file or the new
one, never half of one, and a write that fails halfway leaves the old file and no temporary file.

The failures are real where they can be: a file-size limit (``RLIMIT_FSIZE``) makes the kernel refuse
a write halfway through, as a full disk would (``EFBIG`` instead of ``ENOSPC``, the same path through
the writer); a ``SIGKILL`` kills a writing process outright.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.atomic_write import FILE_MODE, replace_together, write_atomically, write_atomically_with

OLD = b"the old file, complete\n" * 1000  # 23 KB
NEW_SIZE = 4 * 2**20  # 4 MiB: many write(2) calls, so a failure can land in the middle


def _old_file(folder: Path, name: str = "target.bin") -> Path:
    path = folder / name
    path.write_bytes(OLD)
    return path


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_text_bytes_and_pieces_are_written_whole_and_readable(tmp_path):
    write_atomically(tmp_path / "new" / "deeper" / "a.txt", "grüße\n")
    write_atomically(tmp_path / "b.bin", b"\x00\xff")
    write_atomically(tmp_path / "c.json", (p for p in ['{"a": ', b"1", "}"]))
    assert (tmp_path / "new" / "deeper" / "a.txt").read_bytes() == "grüße\n".encode()
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert (tmp_path / "c.json").read_text() == '{"a": 1}'
    # mkstemp creates 0600; a generated file is world-readable like one from cp
    assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == FILE_MODE == 0o644
    write_atomically(tmp_path / "private", "x", mode=0o600)
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600
    assert _temporaries(tmp_path) == []


def _pieces_then(exc: BaseException) -> Iterator[bytes]:
    """Half of a new file (2 MiB, past any buffer), then ``exc``: a producer that fails midway."""
    for _ in range(32):
        yield b"n" * 65536
    raise exc


@pytest.mark.parametrize("exc", [ValueError("the renderer failed"), KeyboardInterrupt()])
def test_a_producer_failing_halfway_leaves_the_old_file_and_no_temporary(tmp_path, exc):
    path = _old_file(tmp_path)
    with pytest.raises(type(exc)):
        write_atomically(path, _pieces_then(exc))
    assert path.read_bytes() == OLD
    assert _temporaries(tmp_path) == []


def test_a_writer_function_failing_halfway_leaves_the_old_file(tmp_path):
    path = _old_file(tmp_path)

    def half_then_fail(f) -> None:
        f.write(b"n" * (NEW_SIZE // 2))
        raise RuntimeError("savefig failed")

    with pytest.raises(RuntimeError, match="savefig"):
        write_atomically_with(path, half_then_fail)
    assert path.read_bytes() == OLD and _temporaries(tmp_path) == []
    write_atomically_with(path, lambda f: f.write(b"whole"))
    assert path.read_bytes() == b"whole"


#: A child process that may write at most 1 MiB per file (the kernel refuses the rest with EFBIG; SIGXFSZ,
#: which would kill it, is ignored so the error reaches Python) and tries to replace the file with 4 MiB.
_FILE_SIZE_LIMITED = """
import errno, resource, signal, sys
from pathlib import Path
from sidecar.atomic_write import write_atomically
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    write_atomically(Path(sys.argv[1]), b"n" * (4 * 2**20))
except OSError as e:
    print(errno.errorcode[e.errno])
"""


def test_the_kernel_refusing_a_write_halfway_leaves_the_old_file_and_no_temporary(tmp_path):
    """As on a full disk: the kernel stops the write after 1 MiB of 4. The old file is whole, nothing is left."""
    path = _old_file(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _FILE_SIZE_LIMITED, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == errno.errorcode[errno.EFBIG], done.stderr
    assert path.read_bytes() == OLD
    assert _temporaries(tmp_path) == []


#: A child that writes 1 MiB of the new file, says so, and waits to be killed before writing the rest.
_KILLED_MIDWAY = """
import sys, time
from pathlib import Path
from sidecar.atomic_write import write_atomically
def pieces():
    yield b"n" * 2**20
    print("halfway", flush=True)
    time.sleep(60)
    yield b"n" * 2**20
write_atomically(Path(sys.argv[1]), pieces())
"""


def test_a_process_killed_midway_leaves_the_old_file_and_only_a_hidden_temporary(tmp_path):
    """SIGKILL leaves no chance to clean up: the old file is intact, and the documented leftover is one
    hidden ``.<name>.<random>.tmp`` beside it (never a file under the target's name)."""
    path = _old_file(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", _KILLED_MIDWAY, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "halfway"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert path.read_bytes() == OLD
    (left,) = _temporaries(tmp_path)
    assert left.startswith(".target.bin.") and left.endswith(".tmp")


def test_a_reader_sees_the_old_file_or_the_new_one_never_a_mix(tmp_path):
    """A thread reads the file as fast as it can while it is replaced 40 times by 4 MiB of one of two bytes."""
    path = tmp_path / "shared.bin"
    versions = [b"a" * NEW_SIZE, b"b" * NEW_SIZE]
    write_atomically(path, versions[0])
    seen: set[bytes] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            data = path.read_bytes()
            seen.add(data if data in versions else b"torn: " + data[:16] + b"..." + data[-16:])

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(40):
            write_atomically(path, versions[i % 2])
            time.sleep(0.001)
    finally:
        stop.set()
        reader.join(timeout=30)
    assert seen <= set(versions), [s[:40] for s in seen - set(versions)]
    assert _temporaries(tmp_path) == []


def test_files_replaced_together_appear_only_when_all_are_complete(tmp_path):
    """The report's case: images then the document that links them. A failure writing the second file
    leaves neither new file, the old ones intact and no temporary."""
    image, doc = _old_file(tmp_path, "plot.png"), _old_file(tmp_path, "report.md")
    with pytest.raises(OSError, match="disk full"):
        replace_together([(image, b"new image"), (doc, _pieces_then(OSError(errno.ENOSPC, "disk full")))])
    assert image.read_bytes() == OLD and doc.read_bytes() == OLD
    assert _temporaries(tmp_path) == []
    replace_together([(image, b"new image"), (doc, "new report")])
    assert image.read_bytes() == b"new image" and doc.read_text() == "new report"


def test_an_interrupted_rename_keeps_the_order_and_leaves_no_temporary(tmp_path, monkeypatch):
    """A Ctrl-C during the renames: the files before it are new, the rest old, none half-written."""
    first, second, third = (_old_file(tmp_path, n) for n in ("1.png", "2.png", "doc.md"))
    real_replace = os.replace
    renamed: list[str] = []

    def interrupted(src, dst):
        if len(renamed) == 1:
            raise KeyboardInterrupt
        real_replace(src, dst)
        renamed.append(Path(dst).name)

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        replace_together([(first, b"new 1"), (second, b"new 2"), (third, b"new doc")])
    monkeypatch.setattr(os, "replace", real_replace)
    assert renamed == ["1.png"]
    assert [p.read_bytes() for p in (first, second, third)] == [b"new 1", OLD, OLD]
    assert _temporaries(tmp_path) == []


def test_a_folder_that_cannot_hold_the_file_is_an_oserror_naming_it(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the folder should be\n")
    with pytest.raises(OSError) as e:
        write_atomically(blocker / "out.txt", "x")
    assert str(blocker) in str(e.value)
    with pytest.raises(OSError):
        replace_together([(blocker / "a.png", b"x")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-folder"]
