"""Generated files: committed == generated (one test each), and the settings table they come from."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sidecar import cli
from sidecar.artifacts import generate
from sidecar.artifacts.params import RuleParams
from sidecar.config import ENV_VARS, Config, ForecastSettings, ModelSettings, build_config, flag_name, load_config
from sidecar.settings import ALERT_SETTINGS, SECTIONS, SETTINGS, TARGET_SETTINGS, section_keys

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


def test_a_block_without_its_markers_is_an_error_not_a_silent_skip(tmp_path, capsys):
    readme = next(a for a in generate.GENERATED if a.block)
    with pytest.raises(ValueError, match="lost its"):
        readme.updated("no markers here\n")


def test_the_makefile_target_runs_the_generator():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^generate: .*\n\t\$\(PY\) -m sidecar\.artifacts\.generate$", makefile, re.M)


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
    }
    for s in SETTINGS:
        assert s.env in (None, f"KV_SIDECAR_{s.section}_{s.key}".upper()), s.path
        assert s.flag in (None, flag_name(s.section, s.key)), s.path


def test_the_dataclasses_take_their_defaults_from_the_table():
    config = build_config({})
    holders = {"thresholds": config.thresholds, "model": config.model, "forecast": config.forecast}
    for s in SETTINGS:
        if s.default is not None:
            assert getattr(holders.get(s.section, config), s.field) == s.default, s.path
    assert ModelSettings() == config.model and ForecastSettings() == config.forecast
    assert Config(targets=config.targets) == config


def test_run_help_shows_each_flags_default_from_the_table():
    r = subprocess.run(
        [str(Path(sys.executable).with_name("kv-sidecar")), "run", "--help"], capture_output=True, text=True, timeout=60
    )
    out = " ".join(r.stdout.split())
    for s in SETTINGS:
        if s.flag:
            assert f"{s.flag} " in out and " ".join(f"(default: {s.default_text()})".split()) in out, s.path
