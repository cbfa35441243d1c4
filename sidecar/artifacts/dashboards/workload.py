"""One recommendation per workload: the table the Fleet and the Capacity planning dashboards share.

The weekly report sizes a workload (namespace + model, + the owner Deployment/StatefulSet where the
PodMonitor's ``workload`` label knows it) with :func:`sidecar.forecast.policy.advise_workload`:

- its **peak** is the largest sum over its replicas, at one minute, of each replica's largest demand
  in that minute (``sidecar.report.figures``, "A model");
- its **pool** is the smallest replica's (a setting sized on it holds on every replica);
- the **even share** is peak ÷ replicas, what a balanced router gives each;
- **replicas needed** are :func:`sidecar.forecast.sizing.suggested_replicas` of the peak:
  ``max(1, ⌈peak ÷ (target_usage × usable)⌉)``;
- the **memory setting** is :func:`sidecar.forecast.sizing.suggest_gpu_memory_utilization` of the
  even share on that pool: ``u* = u0 + (C* − C0) × bytes_per_token ÷ M`` clamped to
  ``[forecast.utilization_min, forecast.utilization_max]``, with ``C*`` the share ÷ target in whole
  usable blocks plus the null block and ``M`` the GPU memory the sidecars size with
  (``kvcache_gpu_memory_bytes``);
- a replica whose own peak exceeds the even share by more than
  :data:`sidecar.forecast.policy.UNEVEN_MARGIN` is the finding "load is uneven across replicas".

This table computes those same figures from the ``namespace_model_workload:`` recording rules
(:func:`sidecar.artifacts.rules.workload_recording_rules`): on Capacity planning over the dashboard's
range (the report's figures, up to where the rules' minutes fall: :func:`workload_exprs`), on the
Fleet over ``forecast.peak_window`` (the window the daemon's own advice is sized on).
``tests/dashboards/test_workload_advice.py`` holds both against the report's functions for the same
history.

Where the memory setting cannot be computed the cell says why in words (:data:`FLAG_WHY`), never a
number: no sidecar exports M (no ``model.config``), the replicas run different pools, vLLM sizes the
pool by ``--kv-cache-memory-bytes`` (the weekly report gives that value), or the engine has no null
block to read its block size from. The policy's other branches (fp8, the warm-up gate) are the
weekly report's.
"""

from __future__ import annotations

from collections.abc import Callable

from ...forecast.policy import UNEVEN_MARGIN
from ...units import format_duration
from ..formatting import percent, promql_number
from ..rules import KEPT_LABELS, WORKLOAD_LABEL
from .display import colored_cells, enum_texts, mapped_cells, threshold_steps
from .inputs import DashboardParams
from .panel_kit import Q, Table
from .promql import Selectors

#: The title of the shared table (tests find it by this).
WORKLOAD_TABLE_TITLE = "Advice per workload"
WORKLOAD_NOW_TABLE_TITLE = "Advice per workload, now"

_LEVEL = "namespace_model_workload"
#: The recording rules the table reads, by role.
PEAK_RULE = f"{_LEVEL}:kvcache_demand_tokens:sum_max1m"
HOTTEST_RULE = f"{_LEVEL}:kvcache_demand_tokens:max_max1m"
REPLICAS_RULE = f"{_LEVEL}:kvcache_capacity_tokens:count"
USABLE_RULE = f"{_LEVEL}:kvcache_usable_tokens:min"
PER_TOKEN_RULES = (
    f"{_LEVEL}:kvcache_gpu_memory_utilization_per_token:min",
    f"{_LEVEL}:kvcache_gpu_memory_utilization_per_token:max",
)
NON_KV_RULES = (
    f"{_LEVEL}:kvcache_gpu_memory_utilization_non_kv:min",
    f"{_LEVEL}:kvcache_gpu_memory_utilization_non_kv:max",
)
BLOCK_RULE = f"{_LEVEL}:kvcache_block_size:max"
KV_BYTES_RULE = f"{_LEVEL}:kvcache_kv_cache_memory_bytes:count"
GPU_RULE = f"{_LEVEL}:kvcache_gpu_memory_bytes:count"

#: The column of the memory setting, and the words it shows where no value can be computed (by the
#: negative number the query gives then: a utilization is never negative).
FLAG_COLUMN = "--gpu-memory-utilization to set"
GPU_COLUMN = "GPU"
GPU_UNKNOWN = "GPU type unknown (set model.gpu_memory)"
FLAG_WHY = {
    "-1": "no GPU memory exported: give the sidecars model.config (and model.gpu_memory)",
    "-2": "replicas run different pools: the weekly report sizes on the smallest",
    "-3": "sized by --kv-cache-memory-bytes: the weekly report gives its value",
    "-4": "no null block (not vLLM): the weekly report gives the value",
}


def workload_exprs(p: DashboardParams, s: Selectors, *, over_range: bool) -> dict[str, str]:
    """The table's PromQL by column: instant queries over the ``namespace_model_workload:`` rules.

    ``over_range`` (Capacity planning): the report's figures over ``$__range``: the peak is the
    largest recorded sum, the replicas, the smallest pool and the memory terms those at the range's
    end. The rules' minutes end at the rule group's evaluation times, not on the minute as the
    report's do, so the peak can differ from the report's by the sum's change within a minute (the
    report counts every pod seen in its period, the table those at its end: the same unless pods
    were replaced). Otherwise (the Fleet): the same function over the last ``forecast.peak_window``,
    the window the daemon's per-pod advice is sized on, so that at midnight it still sizes for noon.

    Every operand is a rule aggregated by the same labels, so the binary operators match one to one.
    """
    m = s.model()
    window = "$__range" if over_range else format_duration(p.forecast.peak_window_s)

    def last(rule: str) -> str:
        return f"last_over_time({rule}{m}[{window}])" if over_range else f"{rule}{m}"

    peak = f"max_over_time({PEAK_RULE}{m}[{window}])"
    hottest = f"max_over_time({HOTTEST_RULE}{m}[{window}])"
    replicas, usable = last(REPLICAS_RULE), last(USABLE_RULE)
    target = promql_number(p.thresholds.target_usage)
    demand = "Peak demand (tokens)" if over_range else f"Peak demand, last {window} (tokens)"
    return {
        "Replicas running": replicas,
        demand: peak,
        "Usable tokens per replica": usable,
        "Even share per replica": f"{peak}\n/ {replicas}\n/ {usable}",
        # suggested_replicas: max(1, ceil(peak / (target × usable) − 1e-9)); the epsilon as there
        "Replicas needed at today's setting": f"clamp_min(ceil({peak}\n/ ({target} * {usable}) - 1e-09), 1)",
        "Hottest replica vs even share": f"{hottest}\n/ ({peak}\n/ {replicas})",
        FLAG_COLUMN: _flag_expr(p, peak, replicas, last),
        GPU_COLUMN: _gpu_expr(last(GPU_RULE), replicas),
    }


def _flag_expr(p: DashboardParams, peak: str, replicas: str, last: Callable[[str], str]) -> str:
    """``--gpu-memory-utilization`` for the even share on the workload's pool, else a negative code (:data:`FLAG_WHY`).

    ``u* = (u0 − C0 × k) + C* × k`` with ``k = bytes_per_token ÷ M`` (the recording rules' terms),
    ``C* = (⌈share ÷ target ÷ bs⌉ + 1) × bs`` (``required_capacity_tokens`` in
    ``sidecar/forecast/sizing.py``), clamped to the ``forecast:`` bounds as
    ``suggest_gpu_memory_utilization`` clamps it. Only where every replica has the same ``k`` and
    ``u0 − C0 × k`` (one pool, one GPU), no replica runs with ``--kv-cache-memory-bytes``, and the
    block size is known (vLLM's null block).
    """
    k_min, k_max = (last(r) for r in PER_TOKEN_RULES)
    a_min, a_max = (last(r) for r in NON_KV_RULES)
    bs, kv_set = last(BLOCK_RULE), last(KV_BYTES_RULE)
    target = promql_number(p.thresholds.target_usage)
    lo, hi = promql_number(p.forecast.utilization_min), promql_number(p.forecast.utilization_max)
    wanted = f"((ceil({peak}\n/ {replicas} / {target}\n/ {bs}) + 1) * {bs})"
    value = f"clamp({a_min}\n+ {wanted}\n* {k_min}, {lo}, {hi})"
    differ = f"({k_max} != {k_min})\nor ({a_max} != {a_min})"
    no_block = f"({bs} <= 0)"
    return (
        f"(\n{value}\nunless {kv_set}\nunless ({differ})\nunless {no_block}\n)\n"
        f"or ({kv_set} * 0 - 3)\n"
        f"or (({differ}) * 0 - 2)\n"
        f"or ({no_block} * 0 - 4)\n"
        f"or ({replicas} * 0 - 1)"
    )


def _gpu_expr(gpus: str, replicas: str) -> str:
    """One series per workload and GPU name (the ``gpu`` label), :data:`GPU_UNKNOWN` where none is known."""
    unknown = f'label_replace({replicas}, "gpu", "{GPU_UNKNOWN}", "", "")'
    named = f'label_replace({gpus}, "gpu", "{GPU_UNKNOWN}", "gpu", "")'
    labels = ", ".join((*KEPT_LABELS, "namespace", "model_name", WORKLOAD_LABEL))
    return f"{named}\nor on ({labels})\n{unknown}"


def workload_table(p: DashboardParams, s: Selectors, *, over_range: bool) -> Table:
    """The table: per workload the report's sizing figures (see :func:`workload_exprs`)."""
    exprs = workload_exprs(p, s, over_range=over_range)
    columns = list(exprs)
    target = p.thresholds.target_usage
    uneven = 1 + UNEVEN_MARGIN
    if over_range:
        title = WORKLOAD_TABLE_TITLE
        what = (
            "sized as the weekly report sizes it, over the dashboard's time range (set it to the report's week for "
            "the report's figures). Peak demand is the largest sum over the replicas of each one's largest demand in "
            "a minute; the minutes end at the recording rules' evaluations, the report's start on the minute, so a "
            "peak that straddles a minute can differ from the report's by the demand's change within it."
        )
    else:
        window = format_duration(p.forecast.peak_window_s)
        title = f"{WORKLOAD_NOW_TABLE_TITLE} (peak of the last {window})"
        what = (
            f"sized as the weekly report sizes it, on the peak of the last {window} (forecast.peak_window, the window "
            "the sidecar's own per-pod advice is sized on): the largest sum over the replicas of each one's largest "
            "demand in a minute, so at night it still sizes for the day's peak. The week's peak: Capacity planning."
        )
    lo, hi = p.forecast.utilization_min, p.forecast.utilization_max
    return Table(
        title,
        "One row per workload (namespace, model and, where the PodMonitor knows it, the Deployment or "
        f"StatefulSet), {what} The even share is that demand spread over the replicas, against the "
        "smallest replica's usable tokens (red: above 100%, the pool cannot hold it; orange: above the "
        f"{percent(target)} target). Replicas needed hold that demand at the {percent(target)} target at today's "
        "memory setting; more than running: scale out, or raise the memory setting first. "
        f"{FLAG_COLUMN}: the --gpu-memory-utilization at which the even share sits at the {percent(target)} target "
        f"on every replica (u0 + (C* - C0) x bytes per token / GPU memory, clamped to {lo:g}-{hi:g}, as the "
        "weekly report computes it); where it cannot be computed the cell says why. GPU: the model.gpu_memory the "
        "sidecars were given, when a GPU name. Hottest replica above "
        f"{percent(uneven)} of the even share: load is uneven across replicas (check the router before resizing).",
        [Q(expr) for expr in exprs.values()],
        {
            p.namespace_label: "Namespace",
            "model_name": "Model",
            WORKLOAD_LABEL: "Workload",
            "gpu": GPU_COLUMN,
            # the GPU query's value is its count: only its label is shown
            **{f"Value #{chr(ord('A') + i)}": column for i, column in enumerate(columns) if column != GPU_COLUMN},
        },
        units={
            "Replicas running": "none",
            columns[1]: "short",
            "Usable tokens per replica": "short",
            "Even share per replica": "percentunit",
            "Replicas needed at today's setting": "none",
            "Hottest replica vs even share": "percentunit",
            FLAG_COLUMN: "none",
        },
        styles={
            "Even share per replica": colored_cells(threshold_steps((None, "green"), (target, "orange"), (1, "red"))),
            "Hottest replica vs even share": colored_cells(threshold_steps((None, "green"), (uneven, "orange"))),
            FLAG_COLUMN: mapped_cells(enum_texts(FLAG_WHY)),
        },
        w=24,
        h=7,
        sort_by="Even share per replica",
    )
