"""Hostile and broken model files (config.json, the safetensors index), through the real CLI.

`kv-sidecar capacity --model-config FILE`, `kv-sidecar check-config` with ``model.config: FILE`` and
`kv-sidecar run` must each exit 2 at once on a file that cannot describe a real model: every problem
on its own line naming the file, the field and the fix, no traceback. A ``model.config`` that is not
there yet is the one difference: `run` waits for it (vLLM may still be downloading the model),
`check-config` refuses it. Time and memory are measured by bench/hostile_files.py.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from faultserver import ok
from fixtures import CPU_032

from sidecar import capacity as cap
from sidecar.config import load_config
from sidecar.input_files import JSON_MAX_BYTES
from sidecar.layers import build_extenders
from sidecar.scrape_loop import Sidecar

CLI = (sys.executable, "-c", "import sys; from sidecar.cli import main; sys.exit(main())")
TIMEOUT_S = 60
MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "model-configs"
LLAMA = json.loads((MODELS / "Llama-3.1-8B.json").read_text())
DEEPSEEK = json.loads((MODELS / "DeepSeek-V3.json").read_text())
TINY = CPU_032 / "tiny-llama-gqa-bf16.config.json"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KV_SIDECAR_")}


def cli(*args: str) -> tuple[int, str]:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, env=_env(), timeout=TIMEOUT_S)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stderr


def model(tmp_path: Path, base: dict[str, Any] | None = None, **changes: Any) -> Path:
    """A config.json: ``base`` (Llama-3.1-8B's) with ``changes`` (None removes a field)."""
    config = dict(LLAMA if base is None else base)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def refused(path: str | Path, *words: str) -> list[str]:
    """`capacity` and `check-config` (with model.config) both exit 2 naming ``path``; one line holds ``words``."""
    code, err = cli("capacity", "--model-config", str(path))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert all(line.startswith(f"kv-sidecar capacity: error: --model-config: {path}") for line in lines), err
    assert any(all(w in line for w in words) for line in lines), f"no line with {words}: {lines}"
    config = Path(path).parent / "sidecar.yaml" if Path(path).parent.is_dir() else None
    if config is not None and os.access(config.parent, os.W_OK):
        config.write_text(f"model:\n  config: {path}\n")
        code, err = cli("check-config", str(config))
        assert code == 2, err
        problem_lines = err.strip().splitlines()[1:]
        assert all(line.startswith(f"  {config}: model.config: ") for line in problem_lines), err
        assert any(all(w in line for w in words) for line in problem_lines), f"no line with {words}: {err}"
    return [line.partition(f"{path}: ")[2] for line in lines]


def test_a_billion_layers_is_refused_at_once(tmp_path):
    refused(model(tmp_path, num_hidden_layers=1e9), "num_hidden_layers", "from 1 to 1024", "126 layers")


def test_a_billion_layers_as_an_integer_is_refused(tmp_path):
    refused(model(tmp_path, num_hidden_layers=1_000_000_000), "num_hidden_layers", "from 1 to 1024")


def test_10_to_the_30_heads_are_refused(tmp_path):
    refused(model(tmp_path, num_attention_heads=10**30), "num_attention_heads", "from 1 to 1024")


def test_a_200_mb_config_json_is_refused_by_its_size(tmp_path):
    path = tmp_path / "config.json"
    with path.open("w") as f:  # a real (valid) JSON object, 200 MB of it
        f.write('{"architectures": ["LlamaForCausalLM"], "padding": "')
        chunk = "x" * (1 << 20)
        for _ in range(200):
            f.write(chunk)
        f.write('"}')
    refused(path, f"more than the {JSON_MAX_BYTES >> 20}MiB")


def test_deeply_nested_json_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"architectures": ["X"], "rope_scaling": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused(path, "nested deeper than 64")


def test_json_nested_just_past_the_bound_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"architectures": ["X"], "a": ' + "[" * 70 + "]" * 70 + "}")
    refused(path, "nested deeper than 64")


def test_an_integer_too_big_for_a_float_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA).replace('"vocab_size": 128256', '"vocab_size": ' + "9" * 400))
    refused(path, "an integer of 400 digits")


def test_an_integer_of_5000_digits_is_refused_without_a_traceback(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA).replace('"vocab_size": 128256', '"vocab_size": ' + "9" * 5000))
    refused(path, "an integer of 5000 digits")


def test_a_string_where_a_number_belongs_is_named(tmp_path):
    refused(model(tmp_path, hidden_size="4096 wide"), "hidden_size", "'4096 wide' is not a whole number")


def test_a_boolean_where_a_count_belongs_is_named(tmp_path):
    refused(model(tmp_path, num_key_value_heads=True), "num_key_value_heads", "True is not a whole number")


def test_nan_layers_are_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA).replace('"num_hidden_layers": 32', '"num_hidden_layers": NaN'))
    refused(path, "num_hidden_layers", "nan")


def test_nope_layer_interval_zero_is_refused(tmp_path):
    refused(model(tmp_path, attention_chunk_size=8192, nope_layer_interval=0), "nope_layer_interval", "from 1")


def test_hidden_size_smaller_than_the_heads_is_refused(tmp_path):
    refused(model(tmp_path, hidden_size=16), "hidden_size: 16 is smaller than num_attention_heads 32")


def test_a_negative_kv_lora_rank_is_refused(tmp_path):
    refused(model(tmp_path, DEEPSEEK, kv_lora_rank=-600), "kv_lora_rank: -600", "from 1 to 8192")


def test_more_kv_heads_than_heads_is_refused(tmp_path):
    refused(model(tmp_path, num_key_value_heads=64), "num_key_value_heads: 64 is more than num_attention_heads 32")


def test_kv_heads_that_do_not_divide_the_heads_are_refused(tmp_path):
    refused(model(tmp_path, num_key_value_heads=5), "num_key_value_heads: 5 does not divide num_attention_heads 32")


def test_a_negative_sliding_window_is_refused(tmp_path):
    refused(model(tmp_path, sliding_window=-4096), "sliding_window: -4096")


def test_architectures_that_are_not_a_list_are_refused(tmp_path):
    refused(model(tmp_path, architectures={"0": "LlamaForCausalLM"}), "architectures: must be a list")


def test_quantization_bits_that_are_text_are_refused(tmp_path):
    quant = {"quant_method": "awq", "bits": "four"}
    refused(model(tmp_path, quantization_config=quant), "quantization_config.bits")


def test_every_problem_is_named_in_one_pass(tmp_path):
    lines = refused(model(tmp_path, num_hidden_layers=-1, hidden_size="x", vocab_size=1e40), "num_hidden_layers")
    assert len(lines) == 3, lines
    assert any(line.startswith("hidden_size:") for line in lines)
    assert any(line.startswith("vocab_size:") for line in lines)


def test_a_json_list_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[1, 2, 3]")
    refused(path, "expected a JSON object")


def test_config_json_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(json.dumps(LLAMA).replace("llama", "ll\udcffama", 1).encode("utf-8", "surrogateescape"))
    refused(path, "not UTF-8")


def test_config_json_that_is_not_json_is_refused_with_its_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "architectures": ["X"],\n  "hidden_size": 4096,,\n}')
    refused(path, "line 3", "not valid JSON")


def test_a_fifo_as_config_json_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "config.json")
    refused(tmp_path / "config.json", "FIFO", "not a regular file")


def test_dev_zero_as_config_json_is_refused():
    code, err = cli("capacity", "--model-config", "/dev/zero")
    assert code == 2 and "character device" in err, err


def test_a_fifo_as_the_safetensors_index_is_refused_without_blocking(tmp_path):
    path = model(tmp_path)
    os.mkfifo(tmp_path / "model.safetensors.index.json")
    code, err = cli("capacity", "--model-config", str(path), "--gpu-memory", "H100-80GB")
    assert code == 2 and "model.safetensors.index.json" in err and "FIFO" in err, err


def test_a_safetensors_total_size_that_is_text_is_refused(tmp_path):
    path = model(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {"total_size": "lots"}}')
    code, err = cli("capacity", "--model-config", str(path), "--gpu-memory", "H100-80GB")
    assert code == 2 and "metadata.total_size" in err and "fix or remove the index file" in err, err


@pytest.mark.parametrize("flag", ["--tensor-parallel-size", "--max-model-len", "--block-size"])
def test_calculator_flags_in_other_digits_are_refused(tmp_path, flag):
    code, err = cli("capacity", "--model-config", str(model(tmp_path)), flag, "٢")
    assert code == 2 and f"{flag}: '٢' is not a whole number" in err, err


def test_the_real_configs_are_all_still_accepted():
    for path in sorted(MODELS.glob("*.json")):
        spec = cap.load_model(path)
        layout = cap.kv_layout(spec)
        assert 0 < layout.bytes_per_token < 10**8, path.name


def test_check_config_passes_a_model_config_that_is_not_there_yet_as_run_does(tmp_path):
    """vLLM may still be downloading it: `run` waits for it, and `check-config` says so without failing."""
    config = tmp_path / "sidecar.yaml"
    config.write_text(f"model:\n  config: {tmp_path / 'model'}\n")
    proc = subprocess.run([*CLI, "check-config", str(config)], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0 and "no such file yet" in proc.stdout, proc.stdout + proc.stderr


def test_run_waits_for_a_model_config_that_is_not_there_yet(tmp_path):
    """vLLM may still be downloading the model: `run` starts, says so once, and serves."""
    config = tmp_path / "sidecar.yaml"
    config.write_text(f"model:\n  config: {tmp_path / 'model'}\nscrape:\n  interval: 1s\n")
    proc = subprocess.Popen(
        [*CLI, "run", f"--config.file={config}", "--web.listen-address=127.0.0.1:0", "--target=http://127.0.0.1:9/m"],
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stderr is not None
        lines = []
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and not any("listening" in line for line in lines):
            lines.append(proc.stderr.readline())
        assert any("no such file yet" in line and "level=warning" in line for line in lines), lines
        assert proc.poll() is None, "run exited instead of waiting for the model"
    finally:
        proc.terminate()
        rest = proc.communicate(timeout=TIMEOUT_S)[1]
    assert proc.returncode == 0 and "Traceback" not in rest
    assert sum("no such file yet" in line for line in [*lines, *rest.splitlines()]) == 1, "said once"


def test_the_capacity_gauges_appear_with_the_model_file_and_the_wait_is_logged_twice(tmp_path, server, caplog):
    server.behaviour = ok((CPU_032 / "gqa-6mib_full-a.txt").read_bytes())
    model_dir = tmp_path / "tiny"
    config = load_config(
        None,
        env={},
        flags={("scrape", "interval"): "5s", ("model", "config"): str(model_dir)},
        flag_targets=[server.url],
        model_missing_ok=True,
    )
    clock = [1_800_000_000.0]
    with caplog.at_level(logging.INFO, logger="kv_sidecar.layers"):
        sidecar = Sidecar(config, build_extenders(config), clock=lambda: clock[0])
        loop = __import__("asyncio").new_event_loop()
        labels = {"target": config.targets[0].name, "model_name": "models/tiny-llama-gqa-bf16", "engine": "0"}
        try:
            for _ in range(3):
                clock[0] += 5
                loop.run_until_complete(sidecar.scrape_once(sidecar.states[0]))
            assert sidecar.registry.get_sample_value("kvcache_theoretical_bytes_per_token", labels) is None
            assert sidecar.registry.get_sample_value("kvcache_capacity_tokens", labels) is not None, "the rest is up"
            model_dir.mkdir()
            (model_dir / "config.json").write_bytes(TINY.read_bytes())
            for _ in range(3):
                clock[0] += 5
                loop.run_until_complete(sidecar.scrape_once(sidecar.states[0]))
            assert sidecar.registry.get_sample_value("kvcache_theoretical_bytes_per_token", labels) == 1024.0
        finally:
            loop.run_until_complete(sidecar.aclose())
            loop.close()
    messages = [r.getMessage() for r in caplog.records if "model.config" in r.getMessage()]
    assert len(messages) == 2, messages
    assert "no such file yet" in messages[0] and "loaded after" in messages[1]


def test_a_layout_vllm_reports_that_the_model_cannot_follow_is_logged_when_it_starts_and_ends(tmp_path, server, caplog):
    page = (CPU_032 / "gqa-6mib_full-a.txt").read_text()
    # tokens / concurrency = max_model_len: 6,144,000, past the model's 2048 (a longer context than the
    # model allows, as VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 permits): the model cannot follow it
    assert 'kv_cache_max_concurrency="6.0"' in page
    bad = page.replace('kv_cache_max_concurrency="6.0"', 'kv_cache_max_concurrency="0.001"')
    config = load_config(
        None, env={}, flags={("scrape", "interval"): "5s", ("model", "config"): str(TINY)}, flag_targets=[server.url]
    )
    clock = [1_800_000_000.0]
    sidecar = Sidecar(config, build_extenders(config), clock=lambda: clock[0])
    loop = __import__("asyncio").new_event_loop()
    try:
        with caplog.at_level(logging.INFO, logger="kv_sidecar.layers"):
            for body in [bad] * 4 + [page] * 2:
                server.behaviour = ok(body.encode())
                clock[0] += 5
                loop.run_until_complete(sidecar.scrape_once(sidecar.states[0]))
    finally:
        loop.run_until_complete(sidecar.aclose())
        loop.close()
    messages = [r.getMessage() for r in caplog.records if "follow" in r.getMessage()]
    assert len(messages) == 2, messages
    assert "cannot follow" in messages[0] and "again" in messages[1] and "after 4 scrapes" in messages[1]
