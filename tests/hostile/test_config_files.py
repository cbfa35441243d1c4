"""Hostile and broken configuration files, through the real CLI: `check-config` and `run` refuse the same.

Each case is a file an attacker or a careless operator could hand the sidecar (a device, a FIFO, an
alias bomb, a 50 MB file, duplicate keys, bytes that are not UTF-8, a port in Arabic-Indic digits...).
`kv-sidecar check-config FILE` must exit 2 at once and `kv-sidecar run --config.file FILE` must say the same at
once, every problem on its own line naming the file, the field and the fix, and no traceback; `run` then goes
on serving its built-in configuration instead of exiting (docs/kubernetes.md, "Never gate vLLM"). Time and memory
are measured by bench/hostile_files.py, not asserted here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sidecar.input_files import TOKEN_MAX_BYTES, YAML_MAX_BYTES

#: The CLI as a user runs it, in a process of its own (the exit code and stderr are what is tested).
CLI = (sys.executable, "-c", "import sys; from sidecar.cli import main; sys.exit(main())")
#: Long enough for a slow CI machine; a FIFO that blocked would take forever, a bomb minutes.
TIMEOUT_S = 60


def _env() -> dict[str, str]:
    """This environment without KV_SIDECAR_* (a variable of the shell must not change the verdict)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("KV_SIDECAR_")}


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), stdin=subprocess.DEVNULL
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{proc.args[3:]} did not exit within {TIMEOUT_S}s")
    return proc.returncode, err


#: What `run` prints after the problems of a file it refuses, instead of exiting (sidecar/cli.py).
NOT_STOPPING = "kv-sidecar: not stopping"


def _finish_run(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """`run`: its exit code and stderr, or, when it reported a refused file and went on (it never exits on
    one), 2 and the report, once it is stopped with SIGTERM (it must then exit 0)."""
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:  # it exited
            return _finish(proc)[0], "".join(lines)
        if line.startswith(NOT_STOPPING):
            proc.terminate()
            code, _ = _finish(proc)
            assert code == 0, f"run, stopped while waiting for a good file, exited {code}"
            return 2, "".join(lines)
        lines.append(line)
    proc.kill()
    proc.communicate()
    pytest.fail(f"{proc.args[3:]} neither reported nor exited within {TIMEOUT_S}s")


def both(path: str | Path, *, listen: bool = True) -> list[tuple[str, int, str]]:
    """(command, exit code, stderr) of `check-config` and `run` on the same file, run side by side.

    ``listen``: give `run` a free port (a file that `run` wrongly accepted would then serve and time out);
    False when the file's own listen address is what is tested.
    """
    flags = ("--web.listen-address=127.0.0.1:0",) if listen else ()
    procs = {
        "check-config": _start("check-config", str(path)),
        "run": _start("run", f"--config.file={path}", *flags),
    }
    return [(name, *(_finish_run(proc) if name == "run" else _finish(proc))) for name, proc in procs.items()]


def problems_of(stderr: str, path: str | Path) -> list[str]:
    """The problem lines of a refusal: each names the file."""
    lines = stderr.strip().splitlines()
    assert lines and lines[0].startswith("kv-sidecar: invalid configuration ("), stderr
    body = lines[1:]
    assert body and all(line.startswith(f"  {path}: ") for line in body), stderr
    return [line.removeprefix(f"  {path}: ") for line in body]


def refused(path: str | Path, *words: str, listen: bool = True) -> list[str]:
    """Both commands exit 2 with no traceback, each problem line naming ``path``; one line holds all ``words``.

    Returns check-config's problem lines; run's must be the same.
    """
    results = both(path, listen=listen)
    seen = []
    for name, code, err in results:
        assert "Traceback" not in err, f"{name}: {err}"
        assert code == 2, f"{name} exited {code}: {err}"
        lines = problems_of(err, path)
        assert any(all(w in line for w in words) for line in lines), f"{name}: no line with {words}: {lines}"
        seen.append(lines)
    assert seen[0] == seen[1], "check-config and run disagree"
    return seen[0]


def write(tmp_path: Path, text: str | bytes, name: str = "sidecar.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_dev_zero_is_refused_without_reading_it():
    refused("/dev/zero", "character device", "not a regular file")


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    refused(fifo, "FIFO", "not a regular file")


def test_a_directory_is_refused(tmp_path):
    refused(tmp_path, "is a directory")


def test_a_unix_socket_is_refused(tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        lines = refused(path, "cannot read the file")
    assert "No such device or address" in lines[0] or "socket" in lines[0]


def test_a_missing_file_is_refused(tmp_path):
    refused(tmp_path / "absent.yaml", "cannot read the file", "check the path")


def test_the_billion_laughs_alias_bomb_is_refused(tmp_path):
    text = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        text += f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]\n"
    refused(write(tmp_path, text), "aliases", "100,000")


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path):
    refused(write(tmp_path, "targets: &t [*t]\n"), "alias *t refers to the node that holds it")


def test_a_50_mb_file_is_refused_by_its_size(tmp_path):
    path = tmp_path / "big.yaml"
    with path.open("w") as f:  # real content, not a sparse file: a file that size must not be parsed
        f.write("scrape:\n  interval: 5s\n")
        line = "# " + "x" * 98 + "\n"
        f.write(line * (50 * 10**6 // len(line)))
    refused(path, "49,999,", f"more than the {YAML_MAX_BYTES >> 20}MiB")


def test_duplicate_keys_are_all_named_with_the_other_problems(tmp_path):
    text = "scrape:\n  interval: 5s\n  interval: 10s\nlog:\n  level: loud\nscrape: {}\n"
    lines = refused(write(tmp_path, text), "scrape.interval: duplicate key (lines 2 and 3)")
    assert any(line.startswith("scrape: duplicate key (lines 1 and 6)") for line in lines)
    assert any(line.startswith("log.level: 'loud'") for line in lines), "the values are checked in the same pass"


def test_a_duplicate_key_inside_a_target_names_the_target(tmp_path):
    text = "targets:\n  - url: http://127.0.0.1:8000/metrics\n    url: http://127.0.0.1:8001/metrics\n"
    refused(write(tmp_path, text), "targets[0].url: duplicate key")


def test_bytes_that_are_not_utf8_are_refused_with_their_line(tmp_path):
    refused(write(tmp_path, b"scrape:\n  interval: 5s\nlog:\n  level: \xff\xfe\n"), "line 4", "not UTF-8", "0xff")


def test_latin1_text_is_refused(tmp_path):
    refused(write(tmp_path, "targets:\n  - name: café\n".encode("latin-1")), "not UTF-8")


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    path = write(tmp_path, "\ufeffscrape:\n  interval: 5s\n".encode())
    proc = subprocess.run([*CLI, "check-config", str(path)], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


@pytest.mark.parametrize("port", ["٩٤٣٧", "９４３７", "९४३७"])  # Arabic-Indic, fullwidth, Devanagari
def test_a_port_in_other_digits_is_refused_by_both(tmp_path, port):
    refused(write(tmp_path, f'web:\n  listen_address: ":{port}"\n'), "web.listen_address", "digits 0-9", listen=False)


def test_a_listen_address_run_could_not_use_is_refused_by_both(tmp_path):
    refused(
        write(tmp_path, 'web:\n  listen_address: "my host:9437"\n'), "web.listen_address", "not a host", listen=False
    )


def test_a_port_of_six_digits_is_refused(tmp_path):
    refused(write(tmp_path, 'web:\n  listen_address: "127.0.0.1:000009437"\n'), "web.listen_address", listen=False)


def test_the_listen_flag_is_checked_as_the_file_is(tmp_path):
    path = write(tmp_path, "scrape:\n  interval: 5s\n")
    code, err = _finish(_start("run", f"--config.file={path}", "--web.listen-address=:٩٤٣٧"))
    assert code == 2 and "Traceback" not in err
    assert "web.listen_address (from --web.listen-address):" in err and "digits 0-9" in err


def test_an_integer_of_5000_digits_is_refused(tmp_path):
    refused(write(tmp_path, "scrape:\n  interval: " + "9" * 5000 + "\n"), "line 2", "too long")


def test_nesting_deeper_than_the_bound_is_refused(tmp_path):
    text = "".join("  " * i + f"k{i}:\n" for i in range(100)) + "  " * 100 + "v: 1\n"
    refused(write(tmp_path, text), "nested deeper than 64")


def test_flow_nesting_of_100000_levels_is_refused(tmp_path):
    refused(write(tmp_path, "a: " + "[" * 100_000 + "]" * 100_000 + "\n"), "not valid YAML")


def test_an_impossible_date_is_refused(tmp_path):
    refused(write(tmp_path, "history:\n  path: 2025-02-30\n"), "not valid YAML", "day is out of range")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("scrape:\n  interval: .inf\n", ("scrape.interval", "not a duration")),
        ("scrape:\n  interval: .nan\n", ("scrape.interval", "not a duration")),
        ("scrape:\n  interval: 99999999999w\n", ("scrape.interval", "longer than ten years")),
        ("scrape:\n  interval: '٥s'\n", ("scrape.interval", "not a duration")),
        ("history:\n  max_size: " + "9" * 40 + "\n", ("history.max_size", "more than 1PiB")),
        ("history:\n  max_size: '" + "9" * 400 + "GiB'\n", ("history.max_size", "more than 1PiB")),
        ("thresholds:\n  watermark: '٠.٩'\n", ("thresholds.watermark",)),
        ("forecast:\n  min_samples: 1e999\n", ("forecast.min_samples",)),
    ],
)
def test_numbers_that_overflow_or_use_other_digits_are_refused(tmp_path, text, words):
    refused(write(tmp_path, text), *words)


def test_a_list_at_the_top_is_refused(tmp_path):
    refused(write(tmp_path, "- scrape\n- log\n"), "the top level must be a mapping")


def test_every_problem_is_reported_in_one_pass(tmp_path):
    text = "scrape:\n  interval: soon\nlog:\n  level: loud\n  format: xml\nforecast:\n  min_samples: -3\nfoo: 1\n"
    lines = refused(write(tmp_path, text), "scrape.interval")
    assert len(lines) == 5, lines
    assert all("(" in line or "must" in line or "one of" in line for line in lines), "each line says the fix"


def test_a_bearer_token_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    refused(write(tmp_path, f"targets:\n  - url: http://127.0.0.1:8000/metrics\n    bearer_token_file: {fifo}\n"))


def test_a_bearer_token_file_larger_than_the_cap_is_refused(tmp_path):
    token = write(tmp_path, "a" * (TOKEN_MAX_BYTES + 1), "token")
    text = f"targets:\n  - url: http://127.0.0.1:8000/metrics\n    bearer_token_file: {token}\n"
    refused(write(tmp_path, text), "targets[0].bearer_token_file", "more than the 64KiB")


@pytest.mark.parametrize("web_file", ["/dev/zero", "fifo"])
def test_a_web_config_file_that_is_not_a_regular_file_is_refused_by_both(tmp_path, web_file):
    if web_file == "fifo":
        web_file = str(tmp_path / "web.fifo")
        os.mkfifo(web_file)
    config = write(tmp_path, "scrape:\n  interval: 5s\n")
    check = _start("check-config", str(config), f"--web.config.file={web_file}")
    run = _start("run", f"--config.file={config}", f"--web.config.file={web_file}", "--web.listen-address=127.0.0.1:0")
    for code, err in (_finish(check), _finish_run(run)):
        assert code == 2 and "Traceback" not in err, err
        assert f"  {web_file}: is a " in err and "not a regular file" in err, err


def test_a_certificate_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "cert.pem"
    os.mkfifo(fifo)
    web = write(tmp_path, f"tls_server_config:\n  cert_file: {fifo}\n  key_file: {fifo}\n", "web.yaml")
    config = write(tmp_path, "scrape:\n  interval: 5s\n")
    code, err = _finish(_start("check-config", str(config), f"--web.config.file={web}"))
    assert code == 2 and "Traceback" not in err, err
    assert "tls_server_config.cert_file" in err and "FIFO" in err, err


def test_thousands_of_problems_are_summed_up_after_the_first_hundred(tmp_path):
    text = "targets:\n" + "".join(f"  - name: t{i}\n    url: nope{i}\n" for i in range(3000))
    lines = refused(write(tmp_path, text), "targets[0].url", "not an http(s) URL")
    assert len(lines) == 101 and lines[-1] == "... and 2900 more problems (fix these first)", lines[-3:]
