"""Generated files: committed == generated (one test each), and the settings table they come from."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sidecar import cli
from sidecar.alert_params import RuleParams
from sidecar.artifacts import cli as rules_cli
from sidecar.artifacts import generate
from sidecar.config import (
    ENV_VARS,
    HOLDERS,
    Config,
    ForecastSettings,
    ModelSettings,
    TargetConfig,
    build_config,
    load_config,
)
from sidecar.settings import ALERT_SETTINGS, SECTIONS, SETTINGS, TARGET_SETTINGS, flag_name, section_keys

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "deploy" / "examples" / "sidecar.yaml"


@pytest.mark.parametrize("artifact", generate.GENERATED, ids=lambda a: a.name)
def test_committed_file_is_what_its_generator_gives(artifact):
    path = REPO / artifact.path
    current = path.read_text(encoding="utf-8")
    assert artifact.updated(current) == current, (
        f"{artifact.name} is out of date with {artifact.source}: run `make generate`"
    )


def test_generate_check_names_the_fix_and_generate_repairs_the_drift(tmp_path, capsys):
    for artifact in generate.GENERATED:
        (tmp_path / artifact.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / artifact.path, tmp_path / artifact.path)
    assert generate.main(["--check", "--root", str(tmp_path)]) == 0
    example = tmp_path / "deploy" / "examples" / "sidecar.yaml"
    example.write_text(example.read_text().replace("interval: 5s", "interval: 7s"))
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("`--config.file FILE`", "`--config.file`"))
    assert generate.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "deploy/examples/sidecar.yaml is out of date" in err and "README.md#run-flags is out of date" in err
    assert "run `make generate`" in err
    assert generate.main(["--root", str(tmp_path)]) == 0
    assert generate.main(["--check", "--root", str(tmp_path)]) == 0
    assert example.read_text() == EXAMPLE.read_text() and readme.read_text() == (REPO / "README.md").read_text()


def test_a_block_without_its_markers_is_an_error_not_a_silent_skip():
    readme = next(a for a in generate.GENERATED if a.block)
    with pytest.raises(ValueError, match="lost its"):
        readme.updated("no markers here\n")


def test_the_makefile_target_runs_the_generator():
    """What `make generate` would run (make itself reads the Makefile; -n runs nothing)."""
    out = subprocess.run(["make", "-n", "generate"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert re.search(r"python -m sidecar\.artifacts\.generate$", out, re.M), out


# --------------------------------------------------------------------- the example config


def _uncommented(text: str) -> dict:
    """The example with its commented-out fields (``  # key: value``) switched on."""
    return yaml.safe_load(re.sub(r"^(\s+)# (\w+: )", r"\1\2", text, flags=re.M))


def test_the_example_lists_exactly_the_settings_table():
    doc = _uncommented(EXAMPLE.read_text())
    assert list(doc) == [s.name for s in SECTIONS]
    for name, keys in doc.items():
        if name == "targets":
            (target,) = keys
            assert tuple(target) == ("url",) + tuple(k for k in section_keys(TARGET_SETTINGS, "targets") if k != "url")
            assert tuple(target["tls"]) == tuple(
                s.key.removeprefix("tls.") for s in TARGET_SETTINGS if s.key.startswith("tls.")
            )
        elif name == "alerts":
            assert (
                tuple(keys)
                == tuple(s.key for s in ALERT_SETTINGS)
                == tuple(f.name for f in dataclasses.fields(RuleParams))
            )
        else:
            assert tuple(keys) == section_keys(SETTINGS, name), name


def test_the_example_reads_as_the_defaults():
    assert load_config(str(EXAMPLE), env={}) == load_config(None, env={})


# --------------------------------------------------------------------- the settings table


def test_the_table_keeps_every_variable_and_flag_name():
    assert set(ENV_VARS) == {
        "KV_SIDECAR_WEB_LISTEN_ADDRESS",
        "KV_SIDECAR_SCRAPE_INTERVAL",
        "KV_SIDECAR_SCRAPE_STALENESS",
        "KV_SIDECAR_DERIVE_WINDOW",
        "KV_SIDECAR_LOG_LEVEL",
        "KV_SIDECAR_LOG_FORMAT",
        "KV_SIDECAR_MODEL_CONFIG",
        "KV_SIDECAR_MODEL_DTYPE",
        "KV_SIDECAR_MODEL_TENSOR_PARALLEL_SIZE",
        "KV_SIDECAR_MODEL_PIPELINE_PARALLEL_SIZE",
        "KV_SIDECAR_MODEL_GPU_MEMORY",
        "KV_SIDECAR_THRESHOLDS_WATERMARK",
        "KV_SIDECAR_HISTORY_PATH",
    }
    assert set(cli.RUN_FLAGS) == {
        "web_listen_address",
        "scrape_interval",
        "scrape_staleness",
        "derive_window",
        "log_level",
        "log_format",
        "model_config",
        "model_dtype",
        "model_tensor_parallel_size",
        "model_pipeline_parallel_size",
        "model_gpu_memory",
        "thresholds_watermark",
        "forecast_window",
        "history_path",
    }
    assert {row.path for row in rules_cli.RENDER_FLAGS} == {
        "thresholds.watermark",
        "thresholds.warning",
        "thresholds.target_usage",
        "alerts.sidecar_job",
        "alerts.namespace",
        "alerts.runbook_base_url",
        "alerts.dashboard_base_url",
    }
    for s in SETTINGS:
        assert s.env in (None, f"KV_SIDECAR_{s.section}_{s.key}".upper()), s.path
    assert flag_name("web", "listen_address") == "--web.listen-address"
    assert flag_name("model", "tensor_parallel_size") == "--model.tensor-parallel-size"


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_every_row_has_a_field_of_its_dataclass():
    """A new row needs its field, else build_config cannot hold the value (the step CONTRIBUTING.md names)."""
    for s in SETTINGS + ALERT_SETTINGS + TARGET_SETTINGS:
        holder = TargetConfig if s.section == "targets" else HOLDERS.get(s.section, Config)
        assert s.field in _fields(holder), (
            f"{s.path}: add the field `{s.field}` to {holder.__name__} (default: default({s.path!r}))"
        )
    for name, holder in HOLDERS.items():
        assert name in _fields(Config) and dataclasses.is_dataclass(holder), name
        assert _fields(holder) == {s.field for s in SETTINGS + ALERT_SETTINGS if s.section == name}, name


def test_the_dataclasses_take_their_defaults_from_the_table():
    config = build_config({})
    holders = {name: getattr(config, name) for name in HOLDERS}
    for s in SETTINGS + ALERT_SETTINGS:
        if s.default is not None:
            assert getattr(holders.get(s.section, config), s.field) == s.default, s.path
    target = TargetConfig(name="t", url="http://t:8000/metrics")
    for s in TARGET_SETTINGS:
        if s.default is not None:
            assert getattr(target, s.field) == s.default, s.path
    assert ModelSettings() == config.model and ForecastSettings() == config.forecast and RuleParams() == config.alerts
    assert Config(targets=config.targets) == config


def _help_entries(*argv: str) -> dict[str, str]:
    """The options of a real ``kv-sidecar ... --help``: ``"--flag METAVAR"`` -> its help, whitespace collapsed."""
    r = subprocess.run(
        [str(Path(sys.executable).with_name("kv-sidecar")), *argv, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "1000"},  # no wrapping inside long words (URLs)
    )
    assert r.returncode == 0, r.stderr
    entries: dict[str, str] = {}
    last = ""
    for line in r.stdout.split("options:", 1)[1].splitlines():
        m = re.match(r"^  (-\S.*?)(?:\s{2,}(.*))?$", line)
        if m:
            last = m.group(1)
            entries[last] = m.group(2) or ""
        elif line.strip() and last:
            entries[last] = f"{entries[last]} {line.strip()}".strip()
    return {k: " ".join(v.split()) for k, v in entries.items()}


#: What `kv-sidecar run --help` says of each settings flag: its value's name and its default.
RUN_HELP = {
    "--web.listen-address HOST:PORT": ":9437",
    "--scrape.interval DURATION": "5s",
    "--scrape.staleness DURATION": "max(3 x interval, 60s)",
    "--derive.window DURATION": "5m",
    "--log.level {debug,info,warning,error}": "info",
    "--log.format {logfmt,json}": "logfmt",
    "--thresholds.watermark FRACTION": "0.9",
    "--model.config PATH": "none",
    "--model.dtype DTYPE": "auto = config dtype, float32 served as bfloat16",
    "--model.tensor-parallel-size N": "1",
    "--model.pipeline-parallel-size N": "1",
    "--model.gpu-memory SIZE|GPU": "none",
    "--forecast.window DURATION": "10m",
    "--history.path PATH": "none (off)",
}

#: What `kv-sidecar rules --help` says of each settings flag.
RENDER_HELP = {
    "--thresholds.watermark FRACTION": "from --config.file, else 0.9",
    "--thresholds.warning FRACTION": "from --config.file, else 0.8",
    "--thresholds.target-usage FRACTION": "from --config.file, else 0.75",
    "--alerts.sidecar-job JOB": "from --config.file, else kv-cache-sidecar",
    "--alerts.runbook-base-url URL": "from --config.file, else "
    "https://github.com/kv-cache-sidecar/kv-cache-sidecar/blob/main/docs/runbooks",
    "--alerts.namespace NAMESPACE": "from --config.file, else none",
    "--alerts.dashboard-base-url URL": "from --config.file, else none",
}


@pytest.mark.parametrize(
    ("argv", "expected", "rows"),
    [
        (("run",), RUN_HELP, tuple(s for s in SETTINGS if s.run_flag)),
        (("rules",), RENDER_HELP, rules_cli.RENDER_FLAGS),
    ],
    ids=["run", "rules-render"],
)
def test_help_shows_each_flags_own_help_and_default(argv, expected, rows):
    entries = _help_entries(*argv)
    by_flag = {invocation.split()[0]: invocation for invocation in entries}
    assert {flag_name(s.section, s.key) for s in rows} == {i.split()[0] for i in expected}
    for s in rows:
        invocation = by_flag[flag_name(s.section, s.key)]
        assert invocation in expected, f"{invocation!r}: not the value name expected"
        help_text = entries[invocation]
        assert help_text.startswith(" ".join(s.help.split())), (invocation, help_text)
        assert help_text.endswith(f"(default: {expected[invocation]})"), (invocation, help_text)
