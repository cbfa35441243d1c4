"""The container image, built from this checkout and run the way a restricted Kubernetes pod runs it:
read-only root, its own non-root user, no capabilities, no privilege escalation.

The daemon scrapes the simulator (on the host) and is read from the host; the history it writes into a
mounted folder makes the weekly report, run from the same image; `rules render` from the image prints
what the package prints.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from podmantools import PODMAN, RESTRICTED, ROOT, UID, Image, inspect, podman
from processes import Processes, free_port, http_get, http_status, kv_sidecar
from prometheus_client.parser import text_string_to_metric_families

import sidecar

pytestmark = [pytest.mark.image, pytest.mark.timeout(1200)]

SOURCE = "https://github.com/kv-cache-sidecar/kv-cache-sidecar"
#: Compiler drivers, assembler, linker, make: none of them may be in the final image.
BUILD_TOOLS = re.compile(
    r"(?:[\w.-]+-)?(?:gcc|g\+\+|cc|c\+\+|cpp|clang|clang\+\+|ld(?:\.bfd|\.gold|\.lld)?|as|make)(?:-[\d.]+)?"
)
_names = (f"kv-sidecar-image-test-{os.getpid()}-{n}" for n in itertools.count())


@pytest.fixture(autouse=True)
def this_checkouts_package(monkeypatch):
    """Host-side commands (the simulator, the package's own rules and report) run this checkout's code,
    as the image does, even when the interpreter's kv-sidecar is installed from another checkout."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def container_ids(pid: int, field: str) -> list[int]:
    """The real, effective, saved and filesystem ids of ``pid`` as its user namespace sees them."""
    host_ids = [int(v) for v in _status(pid)[field].split()]
    maps = [
        line.split() for line in Path(f"/proc/{pid}/{'uid' if field == 'Uid' else 'gid'}_map").read_text().splitlines()
    ]
    inside = []
    for host_id in host_ids:
        for first_inside, first_outside, count in ((int(a), int(b), int(c)) for a, b, c in maps):
            if first_outside <= host_id < first_outside + count:
                inside.append(first_inside + host_id - first_outside)
                break
    return inside


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def test_the_image_is_labelled_and_says_how_it_runs(image: Image):
    config = inspect("image", image.ref)["Config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["kv-sidecar"]
    assert config["Cmd"] == ["run", "--config.file", "/etc/kv-sidecar/config.yaml"]
    assert "9437/tcp" in config["ExposedPorts"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == sidecar.__version__
    assert labels["org.opencontainers.image.source"] == SOURCE
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert image.ref == f"ghcr.io/kv-cache-sidecar/kv-cache-sidecar:{sidecar.__version__}"
    assert image.report_ref == f"ghcr.io/kv-cache-sidecar/kv-cache-sidecar-report:{sidecar.__version__}"
    report_env = dict(item.split("=", 1) for item in inspect("image", image.report_ref)["Config"]["Env"])
    assert report_env["MPLCONFIGDIR"].startswith("/tmp/")
    version = podman("run", "--rm", *RESTRICTED, image.ref, "--version")
    assert version.stdout.strip() == f"kv-cache-sidecar {sidecar.__version__}"


def test_the_final_stage_holds_this_checkouts_code_and_no_build_tools(image: Image, containers):
    name = next(_names)
    containers.append(name)
    podman("create", "--name", name, image.ref)
    files: dict[str, tarfile.TarInfo] = {}
    installed: dict[str, str] = {}
    accounts: dict[str, str] = {}
    export = subprocess.Popen([*PODMAN, "export", name], stdout=subprocess.PIPE)
    assert export.stdout is not None
    try:
        _read_export(export.stdout, files, installed, accounts)
    finally:  # a reader that stops early must not leave podman blocked on the pipe
        export.stdout.close()
        exported = export.wait(timeout=60)
    assert exported == 0

    checkout = {
        p.relative_to(ROOT).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (ROOT / "sidecar").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and (p.suffix == ".py" or p.parent.name == "data")
    }
    assert installed == checkout, "the image's package is not this checkout's sidecar/"
    # compiled at install time: a read-only root never gets bytecode written later
    assert any(
        re.fullmatch(r"opt/kv-sidecar/lib/python3\.\d+/site-packages/sidecar/__pycache__/cli\..*\.pyc", p)
        for p in files
    )
    # the code belongs to root and the runtime user cannot change it
    venv = [m for p, m in files.items() if p.startswith("opt/kv-sidecar/") and not m.issym()]
    assert venv and all(m.uid == 0 and not m.mode & 0o002 for m in venv)

    pip_caches = [p for p in files if re.search(r"(^|/)\.cache/pip(/|$)", p)]
    assert not pip_caches
    assert not [p for p in files if re.match(r"opt/kv-sidecar/(bin/pip|lib/python3\.\d+/site-packages/pip/)", p)]
    tools = [
        p for p in files if re.match(r"(usr/|usr/local/)?s?bin/", p) and BUILD_TOOLS.fullmatch(p.rsplit("/", 1)[-1])
    ]
    assert not tools, f"build tools in the final image: {tools}"
    # what only the builder stage had: the sources, the wheel, pip.conf's mount point
    assert not [p for p in files if p.split("/")[0] in {"src", "wheels"} or p.startswith("opt/wheel-build")]
    assert "etc/pip.conf" not in files
    assert files["etc/kv-sidecar/config.yaml"].isfile()
    # the runtime user has a name and no home or shell to log into
    assert re.search(rf"^kv-sidecar:x:{UID}:{UID}::/nonexistent:/usr/sbin/nologin$", accounts["etc/passwd"], re.M)
    assert re.search(rf"^kv-sidecar:x:{UID}:$", accounts["etc/group"], re.M)


def _read_export(
    stream, files: dict[str, tarfile.TarInfo], installed: dict[str, str], accounts: dict[str, str]
) -> None:
    """Every member of the exported root filesystem; the package's files hashed, passwd and group read."""
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            path = member.name.removeprefix("./")
            files[path] = member
            if path in {"etc/passwd", "etc/group"}:
                handle = tar.extractfile(member)
                assert handle is not None
                accounts[path] = handle.read().decode()
            package = re.match(r"opt/kv-sidecar/lib/python3\.\d+/site-packages/(sidecar/.*)", path)
            if package and member.isfile() and "__pycache__" not in path:
                handle = tar.extractfile(member)
                assert handle is not None
                installed[package.group(1)] = hashlib.sha256(handle.read()).hexdigest()


def test_rules_render_in_the_image_prints_what_the_package_prints(image: Image):
    in_image = podman("run", "--rm", *RESTRICTED, image.ref, "rules", "render")
    on_host = subprocess.run([*kv_sidecar(), "rules", "render"], capture_output=True, text=True, timeout=60, check=True)
    assert in_image.stdout == on_host.stdout
    assert "alert: KVCacheAlmostFull" in in_image.stdout


def test_the_daemon_runs_restricted_and_its_history_makes_the_weekly_report(image: Image, containers, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the container's user writes its history here (under rootless podman too)
    procs = Processes(tmp_path)
    sim_port, port = free_port(), free_port()
    name = next(_names)
    started = time.time()
    try:
        # 4097 blocks: a capacity no default gives, so the gauge below must have been read from this simulator
        procs.start(
            "simulator", [*kv_sidecar(), "simulate", "--port", str(sim_port), "--num-gpu-blocks-override", "4097"]
        )
        containers.append(name)
        podman(
            "run", "--detach", "--name", name, *RESTRICTED, "--volume", f"{data}:/data",
            image.ref,
            "run", "--config.file", "/etc/kv-sidecar/config.yaml",
            "--target", f"http://127.0.0.1:{sim_port}/metrics",
            "--web.listen-address", f"127.0.0.1:{port}",
            "--scrape.interval", "1s",
            "--history.path", "/data/history.sqlite",
        )  # fmt: skip
        metrics = _wait_for_gauges(f"http://127.0.0.1:{port}", name, procs)
        assert http_status(f"http://127.0.0.1:{port}/healthz") == 200
        assert http_status(f"http://127.0.0.1:{port}/readyz") == 200
        simulator = samples(http_get(f"http://127.0.0.1:{sim_port}/metrics")[1].decode())
        ((cache_config, _),) = simulator["vllm:cache_config_info"]
        ((_, capacity),) = metrics["kvcache_capacity_tokens"]
        assert capacity == int(cache_config["kv_cache_size_tokens"]) == 4096 * 16 + 16
        ((_, usage),) = metrics["kvcache_usage_ratio"]
        assert 0 < usage < 1
        ((_, up),) = metrics["kvcache_sidecar_target_up"]
        assert up == 1

        state = inspect("container", name)
        assert state["HostConfig"]["ReadonlyRootfs"] is True
        pid = state["State"]["Pid"]
        assert "kv-sidecar" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        assert container_ids(pid, "Uid") == [UID] * 4
        assert container_ids(pid, "Gid") == [UID] * 4
        status = _status(pid)
        assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == int(status["CapBnd"], 16) == 0
        assert status["NoNewPrivs"] == "1"

        # SIGTERM to PID 1 stops it at once (a pod's termination), with its history flushed
        stopping = time.monotonic()
        podman("stop", "--time", "10", name)
        assert time.monotonic() - stopping < 5
        assert inspect("container", name)["State"]["ExitCode"] == 0, podman("logs", name).stderr
    finally:
        procs.stop()
    assert (data / "history.sqlite").stat().st_size > 0

    # the weekly report from the report's image, over that history; matplotlib writes only under /tmp
    period = ["--from", str(int(started) - 120), "--to", str(int(time.time()) + 60)]
    report = podman(
        "run", "--rm", *RESTRICTED, "--tmpfs", "/tmp:rw,mode=1777", "--volume", f"{data}:/data",
        image.report_ref, "report", "--history", "/data/history.sqlite", "--out", "/data/report", *period,
    )  # fmt: skip
    assert report.stdout.startswith("KV-cache report ") and "(history /data/history.sqlite)" in report.stdout
    (html,) = (data / "report").glob("*.html")
    assert html.read_text().count('src="data:image/png;base64,') >= 3  # the plots, drawn in the container
    (in_image,) = (data / "report").glob("*.json")
    # ... says what the package says over the same history
    on_host = tmp_path / "host-report"
    host_argv = ["report", "--history", str(data / "history.sqlite"), "--out", str(on_host), "--format", "json"]
    subprocess.run([*kv_sidecar(), *host_argv, *period], capture_output=True, text=True, timeout=120, check=True)
    (host_json,) = on_host.glob("*.json")
    assert _comparable(in_image) == _comparable(host_json)
    # without a writable /tmp, matplotlib has nowhere to cache: one line with the fix, no traceback
    no_tmp = podman(
        "run", "--rm", *RESTRICTED, "--volume", f"{data}:/data",
        image.report_ref, "report", "--history", "/data/history.sqlite", "--out", "/data/report-no-tmp", *period,
        check=False,
    )  # fmt: skip
    assert no_tmp.returncode == 1 and "set MPLCONFIGDIR" in no_tmp.stderr, no_tmp.stderr[-3000:]
    # matplotlib's own warning may come first; the last line is ours
    assert "Traceback" not in no_tmp.stderr, no_tmp.stderr
    assert no_tmp.stderr.strip().splitlines()[-1].startswith("kv-sidecar report: matplotlib needs"), no_tmp.stderr


def _comparable(path: Path) -> dict:
    report = json.loads(path.read_text())
    return {k: v for k, v in report.items() if k not in {"generated_at", "source"}}


def _wait_for_gauges(base: str, name: str, procs: Processes) -> dict[str, list[tuple[dict[str, str], float]]]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        procs.check_alive()
        if inspect("container", name)["State"]["Status"] != "running":
            raise AssertionError(f"the container stopped:\n{podman('logs', name).stderr[-3000:]}")
        status, body = http_get(f"{base}/metrics")
        if status == 200:
            metrics = samples(body.decode())
            # usage above 0: the gauges follow the simulator's cache as it fills, not only its first answer
            if "kvcache_capacity_tokens" in metrics and metrics.get("kvcache_usage_ratio", [({}, 0)])[0][1] > 0:
                return metrics
        time.sleep(0.5)
    raise AssertionError(f"no capacity gauges within 60 s:\n{podman('logs', name).stderr[-3000:]}")


#: The daemon image's budget (docs/container.md): it runs in every GPU pod.
DAEMON_MAX_BYTES = 120_000_000


def test_the_daemon_image_is_small_and_holds_no_matplotlib(image: Image, containers):
    """The daemon imports neither matplotlib nor numpy; the report's image has them (its own target)."""
    assert image.size_bytes <= DAEMON_MAX_BYTES, f"{image.size_bytes / 1e6:.0f} MB"
    probe = "import importlib.util as u; print([m for m in ('matplotlib', 'numpy') if u.find_spec(m)])"
    daemon = podman("run", "--rm", *RESTRICTED, "--entrypoint", "/opt/kv-sidecar/bin/python", image.ref, "-c", probe)
    assert daemon.stdout.strip() == "[]"
    report = podman(
        "run", "--rm", *RESTRICTED, "--entrypoint", "/opt/kv-sidecar/bin/python", image.report_ref, "-c", probe
    )  # fmt: skip
    assert report.stdout.strip() == "['matplotlib', 'numpy']"


def test_a_bad_configuration_at_start_never_stops_the_daemon(image: Image, containers, tmp_path):
    """What a bad ConfigMap does to the next pod that starts: the container keeps running and says so."""
    config = tmp_path / "config.yaml"
    config.write_text("scrape: {interval: soon}\n")
    config.chmod(0o644)
    port = free_port()
    name = next(_names)
    containers.append(name)
    podman(
        "run", "--detach", "--name", name, *RESTRICTED, "--volume", f"{config}:/etc/kv-sidecar/config.yaml:ro",
        image.ref, "run", "--config.file", "/etc/kv-sidecar/config.yaml", "--web.listen-address", f"127.0.0.1:{port}",
    )  # fmt: skip
    deadline = time.monotonic() + 30
    body = b""
    while time.monotonic() < deadline and b"kvcache_sidecar_config_last_reload_successful 0.0" not in body:
        body = http_get(f"http://127.0.0.1:{port}/metrics")[1]
        time.sleep(0.3)
    assert b"kvcache_sidecar_config_last_reload_successful 0.0" in body, podman("logs", name).stderr
    state = inspect("container", name)["State"]
    assert state["Running"] is True and state["ExitCode"] == 0
    assert "scrape.interval: not a duration: 'soon'" in podman("logs", name).stderr
