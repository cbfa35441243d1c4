"""One recommendation per workload: the table the Fleet and the Capacity planning dashboards share.

The weekly report sizes a workload (namespace + model, + the owner Deployment/StatefulSet where the
PodMonitor's ``workload`` label knows it) with :func:`sidecar.forecast.policy.advise_workload`:

- its **peak** is the largest sum over its replicas, at one minute, of each replica's largest demand
  in that minute (``sidecar.report.figures``, "A model");
- its **pool** is the smallest replica's (a setting sized on it holds on every replica);
- the **even share** is peak ÷ replicas, what a balanced router gives each;
- **replicas needed** are :func:`sidecar.forecast.sizing.suggested_replicas` of the peak:
  ``max(1, ⌈peak ÷ (target_usage × usable)⌉)``;
- a replica whose own peak exceeds the even share by more than
  :data:`sidecar.forecast.policy.UNEVEN_MARGIN` is the finding "load is uneven across replicas".

This table computes those same figures from the ``namespace_model_workload:`` recording rules
(:func:`sidecar.artifacts.rules.workload_recording_rules`): on Capacity planning over the dashboard's
range (the report's figures, up to where the rules' minutes fall: :func:`workload_exprs`), on the
Fleet on the last minute's demand. ``tests/dashboards/test_workload_advice.py`` holds both against
the report's functions for the same history.

What PromQL cannot express: the memory setting (``--gpu-memory-utilization``) and the replicas with
it applied. They need the GPU's memory, which no series carries (the report has it from
``model.config`` or inverts it from the sidecars' own suggestions), and the policy's branches
(fp8, warm-up gate). The table shows the closest exact figures instead: the replicas needed *at
today's setting* (the report's ``replicas_needed_now``) and where the even share sits on the smallest
pool; the panel's description says so and
points at the weekly report for the flag value.
"""

from __future__ import annotations

from ...forecast.policy import UNEVEN_MARGIN
from ..formatting import percent, promql_number
from ..rules import WORKLOAD_LABEL
from .display import colored_cells, threshold_steps
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


def workload_exprs(p: DashboardParams, s: Selectors, *, over_range: bool) -> dict[str, str]:
    """The table's PromQL by column: instant queries over the ``namespace_model_workload:`` rules.

    ``over_range`` (Capacity planning): the report's figures over ``$__range``: the peak is the
    largest recorded sum, the replicas and the smallest pool those at the range's end. The rules'
    minutes end at the rule group's evaluation times, not on the minute as the report's do, so the
    peak can differ from the report's by the sum's change within a minute (the report counts every
    pod seen in its period, the table those at its end: the same unless pods were replaced).
    Otherwise (the Fleet, whose panels have no fixed windows): the same function on the last
    minute's demand, what the workload needs right now.

    Every operand is a rule aggregated by the same labels, so the binary operators match one to one.
    """
    m = s.model()
    if over_range:
        peak = f"max_over_time({PEAK_RULE}{m}[$__range])"
        replicas = f"last_over_time({REPLICAS_RULE}{m}[$__range])"
        usable = f"last_over_time({USABLE_RULE}{m}[$__range])"
        hottest = f"max_over_time({HOTTEST_RULE}{m}[$__range])"
    else:
        rules = (PEAK_RULE, REPLICAS_RULE, USABLE_RULE, HOTTEST_RULE)
        peak, replicas, usable, hottest = (f"{rule}{m}" for rule in rules)
    target = promql_number(p.thresholds.target_usage)
    demand = "Peak demand (tokens)" if over_range else "Demand in the last minute (tokens)"
    return {
        "Replicas running": replicas,
        demand: peak,
        "Usable tokens per replica": usable,
        "Even share per replica": f"{peak}\n/ {replicas}\n/ {usable}",
        # suggested_replicas: max(1, ceil(peak / (target × usable) − 1e-9)); the epsilon as there
        "Replicas needed at today's setting": f"clamp_min(ceil({peak}\n/ ({target} * {usable}) - 1e-09), 1)",
        "Hottest replica vs even share": f"{hottest}\n/ ({peak}\n/ {replicas})",
    }


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
        title = WORKLOAD_NOW_TABLE_TITLE
        what = (
            "sized as the weekly report sizes it, on the last minute's demand (the sum over the replicas of each "
            "one's largest demand in that minute): what the workload needs now. The week's peak: Capacity planning."
        )
    return Table(
        title,
        "One row per workload (namespace, model and, where the PodMonitor knows it, the Deployment or "
        f"StatefulSet), {what} The even share is that demand spread over the replicas, against the "
        "smallest replica's usable tokens (red: above 100%, the pool cannot hold it; orange: above the "
        f"{percent(target)} target). Replicas needed hold that demand at the {percent(target)} target at today's "
        "memory setting; more than running: scale out, or raise the memory setting first. The flag value "
        "(--gpu-memory-utilization, --kv-cache-memory-bytes) needs the GPU's memory, which no series carries: "
        "the weekly report gives it. Hottest replica above "
        f"{percent(uneven)} of the even share: load is uneven across replicas (check the router before resizing).",
        [Q(expr) for expr in exprs.values()],
        {
            p.namespace_label: "Namespace",
            "model_name": "Model",
            WORKLOAD_LABEL: "Workload",
            **{f"Value #{chr(ord('A') + i)}": column for i, column in enumerate(columns)},
        },
        units={
            "Replicas running": "none",
            columns[1]: "short",
            "Usable tokens per replica": "short",
            "Even share per replica": "percentunit",
            "Replicas needed at today's setting": "none",
            "Hottest replica vs even share": "percentunit",
        },
        styles={
            "Even share per replica": colored_cells(threshold_steps((None, "green"), (target, "orange"), (1, "red"))),
            "Hottest replica vs even share": colored_cells(threshold_steps((None, "green"), (uneven, "orange"))),
        },
        w=24,
        h=6,
        sort_by="Even share per replica",
    )
