"""Worst time and peak RSS of the sidecar on hostile configuration and model files: one JSON line per case.

Each case is a file built beforehand by this script (a device, a FIFO, an alias bomb, a 50 MB YAML,
a 200 MB config.json, a billion layers, deep nesting) handed to the real CLI in a process of its own
(``kv-sidecar check-config`` or ``kv-sidecar capacity``), three times; ``seconds`` is the worst wall
time, ``rss_mib`` the largest peak RSS of those processes (``wait4``'s ``ru_maxrss``: each process's
own), ``exit`` the exit code (2 = refused, as it must be). For scale, the ``baseline`` case is a valid
configuration: most of each figure is the interpreter and the imports.

    .venv/bin/python bench/hostile_files.py            # every case
    .venv/bin/python bench/hostile_files.py --case NAME
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "tests" / "fixtures" / "model-configs" / "Llama-3.1-8B.json"
CLI = (sys.executable, "-c", "import sys; from sidecar.cli import main; sys.exit(main())")
RUNS = 3


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _bomb(d: Path) -> list[str]:
    text = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        text += f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]\n"
    return ["check-config", str(_write(d / "bomb.yaml", text))]


def _big_yaml(d: Path) -> list[str]:
    path = d / "big.yaml"
    with path.open("w") as f:
        f.write("scrape:\n  interval: 5s\n")
        block = ("# " + "x" * 98 + "\n") * 10_000  # 1 MB at a time: this process stays small (its children
        for _ in range(50):  # start from its peak RSS, which wait4 would report as theirs)
            f.write(block)
    return ["check-config", str(path)]


def _at_the_cap(d: Path) -> list[str]:
    """A YAML file just under the 1 MiB cap, every line a target (32,000 of them): the most work a file can ask."""
    lines, size, i = ["targets:"], 9, 0
    while size < (1 << 20) - 100:
        lines.append(f"  - http://127.0.0.1:{8000 + i % 1000}/m{i}")
        size += len(lines[-1]) + 1
        i += 1
    return ["check-config", str(_write(d / "targets.yaml", "\n".join(lines) + "\n"))]


def _fifo(d: Path) -> list[str]:
    os.mkfifo(d / "config.fifo")
    return ["check-config", str(d / "config.fifo")]


def _model(d: Path, text: str) -> list[str]:
    return ["capacity", "--model-config", str(_write(d / "config.json", text))]


def _big_json(d: Path) -> list[str]:
    path = d / "config.json"
    with path.open("w") as f:
        f.write('{"architectures": ["LlamaForCausalLM"], "padding": "')
        for _ in range(200):
            f.write("x" * (1 << 20))
        f.write('"}')
    return ["capacity", "--model-config", str(path)]


def _layers(d: Path, value: object) -> list[str]:
    config = json.loads(LLAMA.read_text())
    config["num_hidden_layers"] = value
    return _model(d, json.dumps(config))


#: case -> builds its file in a fresh directory and returns the CLI arguments
CASES: dict[str, Callable[[Path], list[str]]] = {
    "baseline": lambda d: ["check-config", str(_write(d / "ok.yaml", "scrape:\n  interval: 5s\n"))],
    "dev_zero": lambda d: ["check-config", "/dev/zero"],
    "fifo": _fifo,
    "alias_bomb": _bomb,
    "yaml_50mb": _big_yaml,
    "yaml_1mib_32000_targets": _at_the_cap,
    "yaml_deep_nesting": lambda d: [
        "check-config",
        str(_write(d / "deep.yaml", "a: " + "[" * 100_000 + "]" * 100_000 + "\n")),
    ],
    "yaml_5000_digit_integer": lambda d: [
        "check-config",
        str(_write(d / "int.yaml", "scrape:\n  interval: " + "9" * 5000 + "\n")),
    ],
    "config_json_200mb": _big_json,
    "config_json_1e9_layers": lambda d: _layers(d, 1e9),
    "config_json_1000000000_layers": lambda d: _layers(d, 1_000_000_000),
    "config_json_deep_nesting": lambda d: _model(d, '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    "config_json_400_digit_integer": lambda d: _model(d, '{"architectures": ["X"], "vocab_size": ' + "9" * 400 + "}"),
}


def measure(name: str) -> dict[str, object]:
    worst_s, peak_kib, code = 0.0, 0, 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("KV_SIDECAR_")}
    env["PYTHONPATH"] = str(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        args = CASES[name](Path(tmp))
        for _ in range(RUNS):
            start = time.perf_counter()
            proc = subprocess.Popen(
                [*CLI, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
            )
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            worst_s = max(worst_s, time.perf_counter() - start)
            peak_kib = max(peak_kib, usage.ru_maxrss)
            code = proc.returncode
    return {
        "surface": "files",
        "case": name,
        "seconds": round(worst_s, 3),
        "rss_mib": round(peak_kib / 1024, 1),
        "exit": code,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="only this case (repeatable)")
    args = parser.parse_args()
    for name in args.case or CASES:
        print(json.dumps(measure(name)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
