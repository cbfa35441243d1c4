"""Configuration: defaults, precedence, and bad input that names the field and exits 2 before serving."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import MODEL_CONFIGS

from sidecar.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
KV = [str(Path(sys.executable).with_name("kv-sidecar"))]


def test_defaults_are_the_documented_ones():
    c = load_config(None, env={})
    (t,) = c.targets
    assert t.url == "http://127.0.0.1:8000/metrics"
    assert c.listen_address == ":9437"
    assert c.scrape_interval_s == 5.0
    assert t.timeout_s == pytest.approx(4.0)  # 0.8 x interval
    assert t.body_size_limit_bytes == 4 * 2**20
    assert c.staleness_s == 60.0  # max(3 x 5s, 60s)
    assert c.derive_window_s == 300.0
    assert (c.thresholds.watermark, c.thresholds.warning, c.thresholds.target_usage) == (0.9, 0.8, 0.75)


def test_one_second_interval_alone_is_valid():
    c = load_config(None, env={}, flags={("scrape", "interval"): "1s"})
    assert c.scrape_interval_s == 1.0 and c.targets[0].timeout_s == pytest.approx(0.8)
    assert c.staleness_s == 60.0


def test_default_timeout_is_capped_at_ten_seconds():
    c = load_config(None, env={}, flags={("scrape", "interval"): "1m"})
    assert c.targets[0].timeout_s == 10.0 and c.staleness_s == 180.0


def test_flags_win_over_env_which_wins_over_the_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("scrape: {interval: 10s}\nweb: {listen_address: ':1111'}\ntargets: [http://file:8000/metrics]\n")
    env = {"KV_SIDECAR_SCRAPE_INTERVAL": "7s", "KV_SIDECAR_TARGET": "http://env:8000/metrics,http://env2:8000/m"}
    c = load_config(str(f), env=env, flags={("scrape", "interval"): "3s"})
    assert c.scrape_interval_s == 3.0
    assert [t.url for t in c.targets] == ["http://env:8000/metrics", "http://env2:8000/m"]
    assert c.listen_address == ":1111"
    c = load_config(str(f), env=env, flag_targets=["http://flag:8000/metrics"])
    assert c.scrape_interval_s == 7.0 and [t.url for t in c.targets] == ["http://flag:8000/metrics"]


def test_the_shipped_example_is_valid():
    example = REPO / "deploy" / "examples" / "sidecar.yaml"
    r = subprocess.run(KV + ["check-config", str(example)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


BAD = {
    "unknown-section": ("scrap:\n  interval: 5s\n", "scrap: unknown section (did you mean 'scrape'?)"),
    "unknown-field": ("scrape:\n  intervall: 5s\n", "scrape.intervall: unknown field (did you mean 'interval'?)"),
    "bad-duration": ("scrape:\n  interval: five seconds\n", "scrape.interval: not a duration"),
    "negative-duration": ("scrape:\n  interval: 0s\n", "scrape.interval: must be greater than"),
    "negative-interval": ("scrape:\n  interval: -5s\n", "scrape.interval: must be positive, got '-5s'"),
    "bad-gpu-memory": ("model: {gpu_memory: banana}\n", "model.gpu_memory: 'banana' is not a size or a known GPU"),
    "url-without-scheme": (
        "targets:\n  - url: localhost\n",
        "targets[0].url: not an http(s) URL: 'localhost' (did you mean http://localhost:8000/metrics?)",
    ),
    "timeout-above-interval": (
        "scrape: {interval: 5s}\ntargets:\n  - url: http://a:8000/metrics\n    timeout: 6s\n",
        "targets[0].timeout: '6s' is not shorter than scrape.interval",
    ),
    "timeout-equal-interval": (
        "scrape: {interval: 5s}\ntargets:\n  - url: http://a:8000/metrics\n    timeout: 5s\n",
        "targets[0].timeout: '5s' is not shorter than scrape.interval (5s)",
    ),
    "bad-size": (
        "targets:\n  - url: http://a:8000/metrics\n    body_size_limit: lots\n",
        "targets[0].body_size_limit: not a size",
    ),
    "duplicate-names": (
        "targets:\n  - {name: a, url: 'http://a:8000/metrics'}\n  - {name: a, url: 'http://b:8000/metrics'}\n",
        "targets[1].name: 'a' is used by another target",
    ),
    "unknown-engine": (
        "targets:\n  - {url: 'http://a:8000/metrics', engine: ollama}\n",
        "targets[0].engine: 'ollama' is not supported",
    ),
    "missing-token-file": (
        "targets:\n  - {url: 'http://a:8000/metrics', bearer_token_file: /nonexistent/token}\n",
        "targets[0].bearer_token_file: '/nonexistent/token' is not a readable file",
    ),
    "watermark-order": (
        "thresholds: {watermark: 0.7, warning: 0.8}\n",
        "thresholds.warning: must be below thresholds.watermark",
    ),
    "watermark-range": ("thresholds: {watermark: 90}\n", "thresholds.watermark: must be a fraction between 0 and 1"),
    "bad-listen": ("web: {listen_address: 'localhost'}\n", "web.listen_address: 'localhost' is not HOST:PORT"),
    "bad-log-level": ("log: {level: verbose}\n", "log.level: 'verbose' is not one of"),
    "bad-tp": ("model: {tensor_parallel_size: zero}\n", "model.tensor_parallel_size: must be a whole number"),
    "nan-interval": ("scrape:\n  interval: .nan\n", "scrape.interval: not a duration"),
    "inf-timeout": (
        "targets:\n  - {url: 'http://a:8000/metrics', timeout: .inf}\n",
        "targets[0].timeout: not a duration",
    ),
    "tiny-interval": ("scrape:\n  interval: 1ms\n", "scrape.interval: must be at least 100ms"),
    "fractional-tp": ("model: {tensor_parallel_size: 2.7}\n", "model.tensor_parallel_size: must be a whole number"),
    "port-out-of-range": ("web: {listen_address: ':70000'}\n", "web.listen_address: port 70000 is out of range"),
    "forecast-window-too-short": (
        "forecast: {window: 5s, min_span: 1h}\n",
        "forecast.window: 5s cannot hold forecast.min_samples",
    ),
    "long-window-shorter-than-window": (
        "forecast: {window: 10m, long_windows: [5m, 40m]}\n",
        "forecast.long_windows: each must be longer than forecast.window (10m)",
    ),
    "long-windows-not-a-list": (
        "forecast: {long_windows: 5}\n",
        "forecast.long_windows: must be a list of durations such as [20m, 40m]",
    ),
    "long-window-not-a-duration": (
        "forecast: {long_windows: [20m, soon]}\n",
        "forecast.long_windows[1]: not a duration: 'soon'",
    ),
    "credentials-in-url": (
        "targets:\n  - url: 'http://admin:s3cr3t@vllm:8000/metrics'\n",
        "targets[0].url: credentials in the URL would end up in labels and logs",
    ),
    "alerts-typo": ("alerts:\n  warnng_for: 5m\n", "alerts.warnng_for: unknown field (did you mean 'warning_for'?)"),
    "alerts-not-a-number": (
        "alerts:\n  prefix_hit_ratio_low: lots\n",
        "alerts.prefix_hit_ratio_low: must be a finite number, got 'lots'",
    ),
    "min-samples-one": ("forecast: {min_samples: 1}\n", "forecast.min_samples: must be at least 2, got 1"),
    "not-yaml": ("targets: [unclosed\n", "not valid YAML"),
    "not-a-mapping": ("- just\n- a list\n", "the top level must be a mapping"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_config_exits_2_naming_the_field(tmp_path, name):
    text, expected = BAD[name]
    f = tmp_path / f"{name}.yaml"
    f.write_text(text)
    r = subprocess.run(KV + ["check-config", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert expected in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"s3cr3t-TOKEN\nsecond-line\n", "is not one token"),
        (b"s3cr3t-TOKEN-\xc3\xa9\n", "holds non-ASCII bytes"),
        (b"  \n", "is empty"),
    ],
)
def test_a_token_file_that_holds_no_token_exits_2_without_showing_it(tmp_path, content, problem):
    token = tmp_path / "token"
    token.write_bytes(content)
    f = tmp_path / "tok.yaml"
    f.write_text(f"targets:\n  - {{url: 'http://a:8000/metrics', bearer_token_file: '{token}'}}\n")
    r = subprocess.run(KV + ["check-config", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"targets[0].bearer_token_file: '{token}' {problem}" in r.stderr
    assert "s3cr3t" not in r.stderr + r.stdout and "second-line" not in r.stderr + r.stdout


def test_a_model_the_capacity_model_refuses_is_reported_against_the_file_and_field(tmp_path):
    """tensor_parallel_size is checked against the model's heads by the capacity model (vLLM refuses it too)."""
    f = tmp_path / "tp.yaml"
    f.write_text(
        f"targets: [http://127.0.0.1:8000/metrics]\n"
        f"model: {{config: '{MODEL_CONFIGS / 'Llama-3.1-8B.json'}', tensor_parallel_size: 3}}\n"
    )
    r = subprocess.run(KV + ["check-config", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"{f}: model.tensor_parallel_size: 3 does not divide num_attention_heads 32" in r.stderr


def test_a_bad_interval_and_a_bad_tensor_parallel_size_are_reported_in_one_run(tmp_path):
    """The model section's shape checks run with the rest of validation, not later at start-up."""
    f = tmp_path / "two.yaml"
    f.write_text(
        f"scrape: {{interval: soon}}\n"
        f"model: {{config: '{MODEL_CONFIGS / 'Llama-3.1-8B.json'}', tensor_parallel_size: 3}}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(str(f), env={})
    assert [p.split(":")[0] for p in e.value.problems] == ["scrape.interval", "model.tensor_parallel_size"]
    assert e.value.problems[1].startswith("model.tensor_parallel_size: 3 does not divide num_attention_heads 32")
    r = subprocess.run(KV + ["check-config", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "(2 problems)" in r.stderr
    assert f"{f}: scrape.interval: not a duration: 'soon'" in r.stderr
    assert f"{f}: model.tensor_parallel_size: 3 does not divide num_attention_heads 32" in r.stderr


def test_long_windows_take_a_list_or_a_comma_separated_string_and_can_be_turned_off(tmp_path):
    f = tmp_path / "fc.yaml"
    f.write_text("targets: [http://127.0.0.1:8000/metrics]\n")
    assert load_config(str(f), env={}).forecast.windows_s == (600.0, 1200.0, 2400.0)  # the defaults
    for value, expected in (
        ("[40m, 20m]", (600.0, 1200.0, 2400.0)),
        ("'30m, 1h'", (600.0, 1800.0, 3600.0)),
        ("[]", (600.0,)),
        ("''", (600.0,)),
    ):
        f.write_text(f"targets: [http://127.0.0.1:8000/metrics]\nforecast: {{long_windows: {value}}}\n")
        assert load_config(str(f), env={}).forecast.windows_s == expected, value


def test_every_problem_is_reported_at_once(tmp_path):
    f = tmp_path / "many.yaml"
    f.write_text(
        "scrape: {interval: 5s, intervall: 1s}\nlog: {format: xml}\ntargets: [localhost]\nthresholds: {watermark: 2}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(str(f), env={})
    fields = [p.split(":")[0] for p in e.value.problems]
    assert fields == ["scrape.intervall", "log.format", "thresholds.watermark", "targets[0].url"]


def test_a_capacity_in_tokens_is_read_for_engines_whose_page_lacks_it(tmp_path):
    """targets[].capacity_tokens: TGI's max_batch_total_tokens as its start-up log prints it
    ("Setting max batch total tokens to 262144"); unset by default, and a count of at least 1."""
    f = tmp_path / "tgi.yaml"
    f.write_text("targets: [{url: 'http://tgi:80/metrics', capacity_tokens: 262144}, 'http://vllm:8000/metrics']\n")
    tgi, vllm = load_config(str(f), env={}).targets
    assert (tgi.capacity_tokens, vllm.capacity_tokens) == (262144, None)
    f.write_text("targets: [{url: 'http://tgi:80/metrics', capacity_tokens: 0}]\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(f), env={})
    assert e.value.problems == ["targets[0].capacity_tokens: must be at least 1, got 0"]


def test_bad_values_from_the_environment_say_so():
    with pytest.raises(ConfigError) as e:
        load_config(None, env={"KV_SIDECAR_SCRAPE_INTERVAL": "abc", "KV_SIDECAR_TARGET": "localhost"})
    assert e.value.problems == [
        "scrape.interval (from KV_SIDECAR_SCRAPE_INTERVAL): not a duration: 'abc' (use e.g. 5s, 1m30s, 500ms)",
        "targets[0].url (from KV_SIDECAR_TARGET): not an http(s) URL: 'localhost' "
        "(did you mean http://localhost:8000/metrics?)",
    ]


def test_check_config_validates_the_file_alone_whatever_the_environment(tmp_path):
    f = tmp_path / "ok.yaml"
    f.write_text("scrape: {interval: 5s}\n")
    r = subprocess.run(
        KV + ["check-config", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "KV_SIDECAR_SCRAPE_INTERVAL": "abc"},
    )
    assert r.returncode == 0, r.stderr


def test_credentials_never_reach_the_output(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("targets:\n  - url: 'http://admin:s3cr3t@vllm:8000/metrics'\n")
    r = subprocess.run(KV + ["check-config", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "s3cr3t" not in r.stderr + r.stdout


def test_default_target_name_is_host_and_port():
    (t,) = load_config(None, env={}, flag_targets=["http://vllm.ns.svc:8000/metrics"]).targets
    assert t.name == "vllm.ns.svc:8000"


def test_port_zero_means_any_free_port():
    assert load_config(None, env={}, flags={("web", "listen_address"): "127.0.0.1:0"}).listen_host_port == (
        "127.0.0.1",
        0,
    )


def test_run_with_a_bad_config_exits_2_before_serving(tmp_path):
    # port 1 would need root to bind if it got that far; it must not.
    r = subprocess.run(
        KV + ["run", "--scrape.interval", "soon", "--web.listen-address", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "scrape.interval (from --scrape.interval): not a duration: 'soon'" in r.stderr


def test_version_flag():
    r = subprocess.run(KV + ["--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("kv-cache-sidecar ")


def test_help_shows_every_default():
    r = subprocess.run(KV + ["run", "--help"], capture_output=True, text=True, timeout=60)
    out = " ".join(r.stdout.split())
    for default in (
        "(default: http://127.0.0.1:8000/metrics)",
        "(default: :9437)",
        "(default: 5s)",
        "(default: 5m)",
        "(default: 0.9)",
        "(default: info)",
        "(default: logfmt)",
    ):
        assert default in out


@pytest.mark.parametrize(
    "listen", [":9437", "127.0.0.1:9437", "[::1]:9437", "[::]:0", "::1:9437", "localhost:9437", "pod-0.svc.local:9437"]
)
def test_listen_addresses_run_can_use_are_accepted(listen):
    assert load_config(None, env={}, flags={("web", "listen_address"): listen}).listen_address == listen


@pytest.mark.parametrize(
    ("listen", "words"),
    [
        (":٩٤٣٧", "digits 0-9"),  # int() reads Arabic-Indic digits; the socket does not
        ("127.0.0.1:", "HOST:PORT"),
        ("127.0.0.1:0009437", "HOST:PORT"),
        (":65536", "out of range"),
        ("my host:9437", "not a host"),
        ("[127.0.0.1]:9437", "not a host"),
        ("[::1:9437", "not a host"),
        ("-bad-.example:9437", "not a host"),
        ("300.1.1.1:9437", "not a host"),
    ],
)
def test_listen_addresses_run_could_not_use_are_refused_with_the_fix(listen, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, env={}, flags={("web", "listen_address"): listen})
    (problem,) = e.value.problems
    assert problem.startswith("web.listen_address (from --web.listen-address): ") and words in problem


def test_a_model_config_that_is_not_there_yet_is_a_problem_unless_run_waits_for_it(tmp_path):
    flags = {("model", "config"): str(tmp_path / "downloading")}
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(None, env={}, flags=flags)
    assert load_config(None, env={}, flags=flags, model_missing_ok=True).model.config == str(tmp_path / "downloading")
    (tmp_path / "downloading").mkdir()
    (tmp_path / "downloading" / "config.json").write_text('{"architectures": ["X"], "num_hidden_layers": 1e9}')
    with pytest.raises(ConfigError) as e:  # once there, it is checked as strictly by both
        load_config(None, env={}, flags=flags, model_missing_ok=True)
    assert "num_hidden_layers: 1000000000.0 is not a whole number from 1 to 1024" in e.value.problems[0]
    assert e.value.problems[0].startswith(f"model.config (from --model.config): {tmp_path / 'downloading'}")
