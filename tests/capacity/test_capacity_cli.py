"""`kv-sidecar capacity` end to end, in a subprocess: outputs and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from capacity_fixtures import REPO, VLLM_CPU, config_path

from sidecar.capacity.budget import GiB
from sidecar.capacity.cli import default_context_lengths

# The module's own entry point runs the add_parser()/run() pair of `kv-sidecar capacity`.
CMD = [sys.executable, "-m", "sidecar.capacity.cli", "capacity"]


def capacity(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CMD, *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_table_reproduces_seed000():
    out = capacity(
        "--model-config",
        str(config_path("Llama-3.1-8B")),
        "--context-lengths",
        "4096,16384",
        "--concurrency",
        "1,8,32",
        "--kv-cache-memory-bytes",
        "6GiB",
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "131,072 B (128.0 KiB) per rank" in text
    lines: dict[str, list[str]] = {}
    for line in text.splitlines():  # the first table with these rows is the memory grid
        if line.strip().startswith(("4,096", "16,384")):
            lines.setdefault(line.split()[0], line.split())
    assert lines["4,096"][1::2][:3] == ["0.50", "4.00", "16.00"]
    assert lines["16,384"][1::2][:3] == ["2.00", "16.00", "64.00"]
    assert "3,072 x 16 tokens = 49,152 tokens (49,136 usable after the null block)" in text
    assert "(4.28x)" in text  # KV over weights at 32 × 16K
    assert any(line.split() == ["4,096", "12.00x", "11"] for line in text.splitlines())  # 12 as vLLM counts, 11 usable


def test_json_has_the_documented_keys():
    out = capacity(
        "--model-config",
        str(config_path("Qwen3-32B")),
        "-tp",
        "2",
        "--gpu-memory",
        "H100-80GB",
        "--kv-cache-dtype",
        "fp8",
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for key in (
        "bytes_per_token",
        "bytes_per_token_all_layers",
        "per_request_state_bytes",
        "layers",
        "kv_heads",
        "head_dim",
        "attention",
        "kv_dtype",
        "block_size",
        "weights_bytes",
        "kv_budget_bytes",
        "num_blocks",
        "capacity_tokens",
        "max_concurrency",
    ):
        assert key in data, key
    assert data["bytes_per_token"] == 262_144 // 2 // 2  # TP 2, fp8
    assert data["kv_dtype"] == "fp8" and data["attention"] == "gqa" and data["head_dim"] == 128
    assert data["capacity_tokens"] == data["num_blocks"] * 16
    assert data["budget"]["source"] == "estimated"


def test_json_without_budget_omits_budget_keys():
    out = capacity("--model-config", str(config_path("gpt-oss-20b")), "--format", "json", "--tp", "4")
    data = json.loads(out.stdout)
    assert out.returncode == 0
    assert data["attention"] == "hybrid" and data["bytes_per_token"] == 24_576 // 4
    assert "num_blocks" not in data and "kv_budget_bytes" not in data


def test_json_vllm_cpu_capture_figures():
    out = capacity(
        "--model-config",
        str(VLLM_CPU / "tiny-llama-gqa-bf16.config.json"),
        "--device",
        "cpu",
        "--max-model-len",
        "1024",
        "--kv-cache-memory-bytes",
        "6291456",
        "--context-lengths",
        "1024",
        "--format",
        "json",
        "--vllm-version",
        "0.32.0",
    )
    data = json.loads(out.stdout)
    assert (data["num_blocks"], data["capacity_tokens"], data["logged_capacity_tokens"]) == (48, 6144, 6144)
    assert data["max_concurrency"] == 6.0


def grid_contexts(text: str) -> list[str]:
    """The context column of the memory grid of the text table."""
    lines = text.splitlines()
    start = lines.index("KV cache memory per rank (GiB; x weights)") + 2
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line.split()[0])
    return rows


@pytest.mark.parametrize(
    ("max_model_len", "expected"),
    [
        (131072, [4096, 16384, 32768]),
        (32768, [4096, 16384, 32768]),
        (8192, [4096, 8192]),
        (4096, [4096]),
        (2048, [2048]),
    ],
)
def test_default_context_lengths_stop_at_max_model_len(max_model_len, expected):
    assert default_context_lengths(max_model_len) == expected


def test_a_4k_model_runs_with_the_defaults():
    """Llama-2-7B (max_position_embeddings 4096) with no --context-lengths: docs/capacity.md's example."""
    out = capacity("--model-config", str(config_path("Llama-2-7b-chat-hf")))
    assert out.returncode == 0, out.stderr
    assert grid_contexts(out.stdout) == ["4,096"]
    assert "KV exceeds the weights from 25,705 tokens" in out.stdout
    tiny = capacity("--model-config", str(VLLM_CPU / "tiny-llama-gqa-bf16.config.json"), "--device", "cpu")
    assert tiny.returncode == 0, tiny.stderr
    assert grid_contexts(tiny.stdout) == ["2,048"]  # its max_position_embeddings


def test_measured_weights_replace_the_estimate():
    """--weights-memory: vLLM's "Model loading took 64.4 GiB" for gpt-oss-120b (docs/capacity.md, "The budget")."""
    base = ["--model-config", str(config_path("gpt-oss-120b")), "--gpu-memory", "H200-141GB", "--format", "json"]
    estimated = json.loads(capacity(*base).stdout)
    out = capacity(*base, "--weights-memory", "64.4GiB")
    assert out.returncode == 0, out.stderr
    given = json.loads(out.stdout)
    assert given["weights_bytes"] == given["budget"]["weights_bytes"] == int(64.4 * GiB)
    assert given["weights_source"] == "given" and estimated["weights_source"] == "config-shapes"
    # the KV budget shrinks by exactly the difference in weights
    assert (
        estimated["kv_budget_bytes"] - given["kv_budget_bytes"] == given["weights_bytes"] - estimated["weights_bytes"]
    )


def test_a_small_given_budget_prints_in_mib():
    out = capacity(
        "--model-config",
        str(VLLM_CPU / "tiny-llama-gqa-bf16.config.json"),
        "--device",
        "cpu",
        "--kv-cache-memory-bytes",
        "6MiB",
    )
    assert out.returncode == 0, out.stderr
    assert "Budget (given)  6.00 MiB of KV cache" in out.stdout


def test_markdown_table_rows():
    out = capacity(
        "--model-config",
        str(config_path("Llama-2-7b-chat-hf")),
        "--context-lengths",
        "4096",
        "--concurrency",
        "1",
        "--kv-cache-dtype",
        "fp8",
        "--format",
        "markdown",
    )
    assert out.returncode == 0, out.stderr
    assert "| 1 | 4,096 | 1.00 |" in out.stdout  # 262,144 B/token × 4096 = 1 GiB


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model-config", "/nonexistent/config.json"], "--model-config: /nonexistent/config.json: no such file"),
        (["--model-config", "{bad}"], "--model-config"),
        (["--model-config", str(config_path("Llama-3.1-8B")), "-tp", "3"], "does not divide num_attention_heads 32"),
        (["--model-config", str(config_path("Llama-3.1-8B")), "--tp", "two"], "--tensor-parallel-size: 'two'"),
        (
            ["--model-config", str(config_path("Llama-3.1-70B-Instruct")), "--gpu-memory", "24GB"],
            "leaves no memory for KV cache blocks",
        ),
        (
            ["--model-config", str(config_path("Llama-2-7b-chat-hf")), "--context-lengths", "8192"],
            "--context-lengths: 8,192 is above max_model_len 4,096 (lower it: that is the model's own limit)",
        ),
        (
            [
                "--model-config",
                str(config_path("Llama-2-7b-chat-hf")),
                "--max-model-len",
                "2048",
                "--context-lengths",
                "4096",
            ],
            "raise --max-model-len up to the model's max_position_embeddings",
        ),
        (
            ["--model-config", str(config_path("Llama-3.1-8B")), "--weights-memory", "lots"],
            "--weights-memory: 'lots' is not a size",
        ),
        (
            ["--model-config", str(config_path("Llama-2-7b-chat-hf")), "--max-model-len", "100000"],
            "--max-model-len: 100000 is above the model's limit 4096",
        ),
        (["--model-config", str(config_path("Llama-3.1-8B")), "--gpu-memory", "huge"], "--gpu-memory: 'huge'"),
        (
            [
                "--model-config",
                str(config_path("Llama-3.1-8B")),
                "--gpu-memory",
                "80GiB",
                "--gpu-memory-utilization",
                "1.2",
            ],
            "--gpu-memory-utilization: must be in (0, 1]",
        ),
        (["--model-config", str(config_path("Llama-3.1-8B")), "--kv-cache-dtype", "int3"], "--kv-cache-dtype: unknown"),
        (
            ["--model-config", str(config_path("Llama-3.1-8B")), "--dtype", "int8"],
            "--dtype: 'int8' is not a weight dtype",
        ),
        (["--model-config", str(config_path("Llama-3.1-8B")), "--block-size", "0"], "--block-size: must be at least 1"),
        (
            ["--model-config", str(config_path("Llama-3.1-8B")), "--kv-cache-memory-bytes", "-5"],
            "--kv-cache-memory-bytes",
        ),
        (["--model-config", str(config_path("Llama-3.1-8B")), "--concurrency", "1,x"], "--concurrency: 'x'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    out = capacity(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert needle in lines[0]
    assert out.stdout == ""


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (
            {"architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24},
            "not supported: attention-free",
        ),
        ({"foo": 1}, "architectures: missing"),
        (
            {
                "architectures": ["MyModelForCausalLM"],
                "model_type": "my_model",  # no class defaults known: nothing to fill it from
                "hidden_size": 4096,
                "num_attention_heads": 32,
            },
            "num_hidden_layers: missing",
        ),
    ],
)
def test_bad_configs(tmp_path, config, needle):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = capacity("--model-config", str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_invalid_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    out = capacity("--model-config", str(tmp_path / "config.json"))
    assert out.returncode == 2 and "not valid JSON" in out.stderr


def test_explain_prints_the_terms_as_vllm_logs_them():
    out = capacity("--model-config", str(config_path("Llama-3.1-8B")), "--gpu-memory", "H100-80GB", "--explain")
    assert out.returncode == 0, out.stderr
    # no --gpu-memory-utilization and no --vllm-version: the newest vLLM's default, 0.92 (0.20.0 and later)
    assert "Desired GPU memory utilization is (0.92, 72.85 GiB)" in out.stdout
    assert "sampler" in out.stdout and "1024 sequences" in out.stdout


def test_from_log_shows_each_terms_error():
    log = config_path("Llama-3.1-8B").parents[1] / "vllm-logs" / "vllm23278-gpt-oss-120b-h100.log"
    out = capacity(
        "--model-config", str(config_path("gpt-oss-120b")), "--gpu-memory", "H100-80GB", "--from-log", str(log)
    )
    assert out.returncode == 0, out.stderr
    budget_row = [line for line in out.stdout.splitlines() if line.startswith("budget ")][-1]
    assert "-2.14 GiB" in budget_row  # the logged budget, beside the estimate and the error


def test_from_log_without_a_profile_is_one_line(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("INFO nothing here\n")
    out = capacity(
        "--model-config", str(config_path("Llama-3.1-8B")), "--gpu-memory", "H100-80GB", "--from-log", str(log)
    )
    assert out.returncode == 2 and "no memory profile found" in out.stderr
