"""Every configuration setting, one row each: the table the rest is generated from.

A row (:class:`Setting`) says where a setting lives in the YAML (section, key), how its
value is read and checked (its parser, from :mod:`sidecar.setting_parsers`), its default, its
``KV_SIDECAR_*`` environment variable and ``kv-sidecar run`` flag (when it has them) and a
one-line help. From these rows come:

- validation (:func:`sidecar.config.build_config`: unknown keys, each value's parser);
- the environment overrides (:data:`sidecar.config.ENV_VARS`);
- the ``run`` flags and the defaults their ``--help`` shows (:func:`sidecar.cli.add_run_flags`);
- the ``kv-sidecar rules render`` flags (:mod:`sidecar.artifacts.cli`, the rows with ``render_flag``);
- ``deploy/examples/sidecar.yaml`` and ``docs/configuration.md`` (``make generate``).

Three tables, read the same way: :data:`SETTINGS` (the sections the sidecar reads itself),
:data:`TARGET_SETTINGS` (the fields of each ``targets:`` entry) and :data:`ALERT_SETTINGS` (the
``alerts:`` section, which ``kv-sidecar rules render`` uses). Relations between settings (a timeout
shorter than the interval, ...) are checked in ``sidecar.config``, after each value has been read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .alert_params import RuleParams
from .engines import ADAPTERS
from .setting_parsers import (
    BaseUrl,
    Boolean,
    Choice,
    Duration,
    DurationList,
    Fraction,
    GpuMemory,
    JobLabel,
    ListenAddress,
    ModelPath,
    Namespace,
    Number,
    Parser,
    PromDuration,
    ReadableFile,
    Size,
    Text,
    TokenFile,
    Url,
    VllmVersion,
)
from .thresholds import Thresholds
from .units import format_duration

if TYPE_CHECKING:
    import argparse

DEFAULT_TARGET = "http://127.0.0.1:8000/metrics"  # vLLM's port in the same pod
#: The environment variable and flag that replace the whole ``targets:`` list by URLs.
TARGETS_ENV = "KV_SIDECAR_TARGET"  # comma-separated
TARGETS_FLAG = "--target"  # repeatable
MIN_INTERVAL_S = 0.1
#: A target's timeout when none is given: this fraction of the scrape interval, at most MAX_DEFAULT_TIMEOUT_S.
TIMEOUT_FRACTION = 0.8
MAX_DEFAULT_TIMEOUT_S = 10.0
#: The staleness when none is given: this many scrape intervals, at least MIN_STALENESS_S.
STALENESS_SCRAPES = 3
MIN_STALENESS_S = 60.0
#: ``targets[].engine``: read the engine whose signature families the page carries, detected at every scrape.
AUTO_ENGINE = "auto"
ENGINES = (AUTO_ENGINE, *ADAPTERS)  # auto, or one adapter per inference-server family (sidecar/engines/)
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("logfmt", "json")
CLOCKS = ("wall", "simulated")


def default_timeout(interval_s: float) -> float:
    """A target's timeout when none is given: TIMEOUT_FRACTION x the interval, at most MAX_DEFAULT_TIMEOUT_S."""
    return min(TIMEOUT_FRACTION * interval_s, MAX_DEFAULT_TIMEOUT_S)


def default_staleness(interval_s: float) -> float:
    """The staleness when none is given: STALENESS_SCRAPES x the interval, at least MIN_STALENESS_S."""
    return max(STALENESS_SCRAPES * interval_s, MIN_STALENESS_S)


def flag_name(section: str, key: str) -> str:
    """The flag spelling of a setting: ``("web", "listen_address")`` -> ``--web.listen-address``."""
    return f"--{section}.{key.replace('_', '-')}"


# ----------------------------------------------------------------------------- the tables


@dataclass(frozen=True)
class Setting:
    """One setting: where it lives, how it is read, its default, how to override it, what it means."""

    section: str
    key: str  # "tls.ca_file": a key of a nested mapping
    parse: Parser
    default: Any  # the value as read (seconds, bytes, ...); None = unset
    help: str  # one line, shown by --help, docs/configuration.md and the example config
    #: attribute of the config object that holds the value (default: the key)
    attr: str = ""
    env: str | None = None  # the KV_SIDECAR_* variable that overrides it
    run_flag: bool = False  # `kv-sidecar run` has a flag for it (spelled by flag_name)
    render_flag: bool = False  # `kv-sidecar rules render` has a flag for it (the same spelling)
    #: how the default reads when it is computed or empty ("max(3 x interval, 60s)")
    shown_default: str | None = None
    #: a value for the example config when the default is empty or computed (YAML text)
    example: str | None = None
    required: bool = False  # no default: missing is a problem

    @property
    def path(self) -> str:
        """``section.key``, as problems name it."""
        return f"{self.section}.{self.key}"

    @property
    def flag(self) -> str | None:
        """The ``kv-sidecar run`` flag (``--scrape.interval``), None when ``run`` has none."""
        return flag_name(self.section, self.key) if self.run_flag else None

    @property
    def dest(self) -> str:
        """The argparse destination of the flag: ``scrape.interval`` -> ``scrape_interval``."""
        return f"{self.section}_{self.key}"

    @property
    def field(self) -> str:
        """The attribute that holds the value: ``attr``, else the key (``tls.ca_file`` -> ``tls_ca_file``)."""
        return self.attr or self.key.replace(".", "_")

    def default_text(self) -> str:
        """The default as people read it: ``5s``, ``0.9``, ``max(3 x interval, 60s)``, ``none``."""
        if self.shown_default is not None:
            return self.shown_default
        return "none" if self.default is None else self.parse.show(self.default)


@dataclass(frozen=True)
class Section:
    """A top-level section of the YAML file and what it is for."""

    name: str
    doc: str


#: Every section, in the order of the example configuration.
SECTIONS = (
    Section("web", "Where the sidecar serves /metrics, /healthz and /readyz."),
    Section("scrape", "How often the inference servers are read."),
    Section("derive", "Windows of the rates and ratios derived from vLLM's counters."),
    Section("log", "Logging (to stderr)."),
    Section("targets", 'The inference servers to read. A plain URL is enough: "- http://127.0.0.1:8000/metrics".'),
    Section(
        "thresholds",
        "One source of thresholds: the sidecar's headroom/forecast gauges and the alert rules "
        "(kv-sidecar rules render) read the same numbers.",
    ),
    Section(
        "model",
        "What vLLM does not export about the served model; enables the theoretical-capacity gauges. "
        "config is found by the served model's name (vLLM's model_name label): a config.json, a model "
        "directory, a folder of model directories (the one named like the model), or a Hugging Face hub cache "
        "(models--org--name, its refs/main snapshot; nothing is read while a download is in progress, a new "
        "revision or model is picked up); kvcache_model_config_loaded says where it stands. Learnt from vLLM on "
        "every scrape, never set here: block size, KV dtype, num_gpu_blocks, kv_cache_memory_bytes, "
        "gpu_memory_utilization, max_model_len (vllm:cache_config_info). Not on the page: tensor/pipeline "
        "parallel sizes and the served dtype are read from vLLM's command line when the sidecar sees vLLM's "
        "process (process_discovery, a pod with shareProcessNamespace: true), else taken from here; the GPU's "
        "memory is always given here. Precedence, per setting: vLLM's page, then vLLM's command line, then this "
        "section, then vLLM's default. The command line wins over this section because it is what runs: a "
        "ConfigMap copy goes stale when vLLM's flags change, and a stale TP halves or doubles every "
        "theoretical figure; a value here that the command line contradicts is logged, and "
        "kvcache_model_setting_info says where each value came from. Set process_discovery: false to use this "
        "section alone. The *_memory fields replace the budget estimate's terms: copied from vLLM's start-up "
        "log, they give an estimate within a block of vLLM's own.",
    ),
    Section(
        "forecast",
        "Forecast and advice (kvcache_time_until_full_seconds, kvcache_suggested_gpu_memory_utilization, ...).",
    ),
    Section(
        "history",
        "The sidecar's own history of its series (one SQLite file, one row per series and minute), "
        "for `kv-sidecar report --history` where there is no Prometheus. Off unless path is set.",
    ),
    Section(
        "alerts",
        "Parameters of the alert rules, read by `kv-sidecar rules render` (the thresholds are the other half).",
    ),
)

_ESTIMATE = "the documented estimate (docs/capacity.md)"

#: The sections the sidecar reads itself, in validation order.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "web",
        "listen_address",
        ListenAddress(),
        ":9437",
        "where the sidecar serves /metrics, /healthz, /readyz",
        env="KV_SIDECAR_WEB_LISTEN_ADDRESS",
        run_flag=True,
    ),
    Setting(
        "scrape",
        "interval",
        Duration(at_least=MIN_INTERVAL_S),
        5.0,
        "how often each target is scraped",
        attr="scrape_interval_s",
        env="KV_SIDECAR_SCRAPE_INTERVAL",
        run_flag=True,
    ),
    Setting(
        "scrape",
        "staleness",
        Duration(),
        None,
        "derived gauges vanish when the last good scrape is older (vLLM answers slowly exactly when saturated)",
        attr="staleness_s",
        env="KV_SIDECAR_SCRAPE_STALENESS",
        run_flag=True,
        shown_default=f"max({STALENESS_SCRAPES} x interval, {MIN_STALENESS_S:g}s)",
        example="60s",
    ),
    Setting(
        "derive",
        "window",
        Duration(),
        300.0,
        "window of the hit-ratio and preemption-rate gauges",
        attr="derive_window_s",
        env="KV_SIDECAR_DERIVE_WINDOW",
        run_flag=True,
    ),
    Setting(
        "log",
        "level",
        Choice(LOG_LEVELS),
        "info",
        "log level",
        attr="log_level",
        env="KV_SIDECAR_LOG_LEVEL",
        run_flag=True,
    ),
    Setting(
        "log",
        "format",
        Choice(LOG_FORMATS),
        "logfmt",
        "log format",
        attr="log_format",
        env="KV_SIDECAR_LOG_FORMAT",
        run_flag=True,
    ),
    Setting(
        "thresholds",
        "watermark",
        Number(),
        Thresholds.watermark,
        "usage watermark for headroom and paging (critical KVCacheAlmostFull)",
        env="KV_SIDECAR_THRESHOLDS_WATERMARK",
        run_flag=True,
        render_flag=True,
    ),
    Setting(
        "thresholds",
        "warning",
        Number(),
        Thresholds.warning,
        "usage that opens a ticket (warning KVCacheAlmostFull)",
        render_flag=True,
    ),
    Setting(
        "thresholds",
        "target_usage",
        Number(),
        Thresholds.target_usage,
        "usage the suggested gpu_memory_utilization puts the peak demand at (below warning)",
        render_flag=True,
    ),
    Setting(
        "model",
        "config",
        ModelPath(),
        None,
        "the served model's config.json, its directory, a folder of model directories, or the Hugging Face cache "
        "vLLM downloads into (HF_HOME or its hub/): the served model is found by vLLM's model_name",
        env="KV_SIDECAR_MODEL_CONFIG",
        run_flag=True,
        example="/models/llama-3.1-8b",
    ),
    Setting(
        "model",
        "dtype",
        Text(metavar="DTYPE"),
        None,
        "vLLM's --dtype",
        env="KV_SIDECAR_MODEL_DTYPE",
        run_flag=True,
        shown_default="auto = config dtype, float32 served as bfloat16",
        example="bfloat16",
    ),
    Setting(
        "model",
        "tensor_parallel_size",
        Number(int, minimum=1, metavar="N"),
        1,
        "vLLM's --tensor-parallel-size (vLLM does not export it: give it, unless process_discovery reads it)",
        env="KV_SIDECAR_MODEL_TENSOR_PARALLEL_SIZE",
        run_flag=True,
    ),
    Setting(
        "model",
        "pipeline_parallel_size",
        Number(int, minimum=1, metavar="N"),
        1,
        "vLLM's --pipeline-parallel-size",
        env="KV_SIDECAR_MODEL_PIPELINE_PARALLEL_SIZE",
        run_flag=True,
    ),
    Setting(
        "model",
        "process_discovery",
        Boolean(),
        True,
        "learn vLLM's --tensor-parallel-size, --pipeline-parallel-size and serving flags from its command line "
        "in /proc (a pod with shareProcessNamespace: true); what vLLM runs wins over model.* "
        '(docs/kubernetes.md, "Tensor and pipeline parallelism")',
    ),
    Setting(
        "model",
        "gpu_memory",
        GpuMemory(),
        None,
        "GPU memory per rank: 80GiB, 80GB or a GPU name such as H100-80GB (for estimated budgets)",
        env="KV_SIDECAR_MODEL_GPU_MEMORY",
        run_flag=True,
        example="H100-80GB",
    ),
    Setting(
        "model",
        "weights_memory",
        Size(),
        None,
        'replaces the weights estimate; vLLM logs it as "Model loading took X GiB"',
        shown_default=_ESTIMATE,
        example="14.99GiB",
    ),
    Setting(
        "model",
        "activation_memory",
        Size(),
        None,
        'replaces the activation estimate; vLLM logs it as "PyTorch activation peak memory takes X GiB"',
        shown_default=_ESTIMATE,
        example="1.2GiB",
    ),
    Setting(
        "model",
        "non_torch_memory",
        Size(),
        None,
        'replaces the non-torch estimate; vLLM logs it as "non_torch_memory takes X GiB"',
        shown_default=_ESTIMATE,
        example="0.2GiB",
    ),
    Setting(
        "model",
        "cudagraph_memory",
        Size(),
        None,
        'replaces the CUDA-graph estimate; vLLM (>= 0.21) logs it as "Estimated CUDA graph memory: X GiB"',
        shown_default=_ESTIMATE,
        example="0.5GiB",
    ),
    Setting(
        "model",
        "vllm_version",
        VllmVersion(),
        None,
        "the vLLM version whose memory-profile rules the estimated budget follows (batch defaults, sampler,"
        " CUDA graphs); the scraped page's labels win when they show a later one",
        shown_default="newest rules",
        example="0.11.0",
    ),
    Setting(
        "forecast",
        "window",
        Duration(),
        600.0,
        "the shortest window of the fill-rate trend (follows fast ramps); the burst gauges also wait this long "
        "after an engine's start",
        attr="window_s",
        run_flag=True,
    ),
    Setting(
        "forecast",
        "long_windows",
        DurationList(),
        (1200.0, 2400.0),
        "longer trend windows for slow ramps; the earliest time until full wins ([] = off)",
        attr="long_windows_s",
    ),
    Setting(
        "forecast",
        "min_samples",
        Number(int, minimum=2, metavar="N"),
        5,
        "the fill rate is published once this many samples ...",
        attr="min_samples",
    ),
    Setting("forecast", "min_span", Duration(), 10.0, "... span at least this long", attr="min_span_s"),
    Setting(
        "forecast",
        "segment",
        Duration(zero_ok=True),
        0.0,
        "minimum width of the trend's time slices (0 = each window / 6)",
        attr="segment_s",
        shown_default="0",
    ),
    Setting(
        "forecast",
        "peak_window",
        Duration(),
        86400.0,
        "the window of the peak demand the suggested settings are sized for: a day, so that the advice at "
        "the night's trough still holds the day's peak (a shorter window gives back memory the next peak needs)",
        attr="peak_window_s",
    ),
    Setting(
        "forecast",
        "burst_window",
        Duration(at_least=60.0),
        3600.0,
        "the window kvcache_burst_tokens keeps the largest one-minute rise of the demand over (the burst "
        "kvcache_burst_headroom_ratio is measured against); at least 1m",
        attr="burst_window_s",
    ),
    Setting("forecast", "utilization_min", Number(), 0.5, "suggested utilizations are clamped to at least this ..."),
    Setting("forecast", "utilization_max", Number(), 0.95, "... and at most this"),
    Setting(
        "history",
        "path",
        Text(metavar="PATH"),
        None,
        "the history file (created if missing; a file that is not a kv-sidecar history is left alone and "
        "the sidecar serves without a history); none = off",
        env="KV_SIDECAR_HISTORY_PATH",
        run_flag=True,
        shown_default="none (off)",
        example="/var/lib/kv-sidecar/history.sqlite",
    ),
    Setting(
        "history",
        "retention",
        Duration(at_least=3600.0),
        8 * 86400.0,
        "minutes older than this are deleted (a weekly report needs a week and a bit)",
        attr="retention_s",
    ),
    Setting(
        "history",
        "max_size",
        Size(positive=True),
        64 * 2**20,
        "the file (with its WAL) never grows past this; the oldest minutes go first",
        attr="max_bytes",
    ),
)

#: The fields of each entry of ``targets:`` (a plain URL string is ``{url: ...}``).
TARGET_SETTINGS: tuple[Setting, ...] = (
    Setting("targets", "name", Text(), None, "the `target` label", shown_default="the URL's host:port", example="vllm"),
    Setting(
        "targets",
        "url",
        Url(example=DEFAULT_TARGET),
        None,
        "the server's /metrics (vLLM's port in the same pod)",
        example=DEFAULT_TARGET,
        required=True,
    ),
    Setting(
        "targets",
        "engine",
        Choice(ENGINES, template="{text!r} is not supported (supported: {options})"),
        AUTO_ENGINE,
        "the adapter that reads the server's metrics (sidecar/engines/); auto: the engine whose families the "
        'page carries, found at every scrape (a page with two engines\' fails: reason="mixed_engines"); '
        "naming one skips the detection",
    ),
    Setting(
        "targets",
        "capacity_tokens",
        Number(int, minimum=1, metavar="TOKENS"),
        None,
        "the engine's KV capacity in tokens when its page does not say it (TGI: max_batch_total_tokens as "
        "logged at start-up, 'Setting max batch total tokens to N'; llama.cpp: --ctx-size); SGLang (per DP "
        "rank) and TensorRT-LLM use it only when their page has none; vLLM ignores it",
        shown_default="none (the page's own figure)",
        example="262144",
    ),
    Setting(
        "targets",
        "timeout",
        Duration(),
        None,
        "of the whole exchange; shorter than scrape.interval",
        attr="timeout_s",
        shown_default=f"{TIMEOUT_FRACTION:g} x scrape.interval, at most {format_duration(MAX_DEFAULT_TIMEOUT_S)}",
        example="4s",
    ),
    Setting(
        "targets",
        "body_size_limit",
        Size(positive=True),
        4 * 2**20,
        'larger answers are dropped and counted as reason="too_large"',
        attr="body_size_limit_bytes",
    ),
    Setting(
        "targets",
        "sample_limit",
        Number(int, minimum=0, metavar="COUNT"),
        10_000,
        'more sample lines of the families read (a vLLM engine has ~60) fail the scrape: reason="sample_limit"; '
        "0 = no limit",
    ),
    Setting(
        "targets",
        "label_limit",
        Number(int, minimum=0, metavar="COUNT"),
        64,
        'a series read with more labels fails the scrape: reason="label_limit"; 0 = no limit',
    ),
    Setting(
        "targets",
        "label_name_length_limit",
        Number(int, minimum=0, metavar="COUNT"),
        128,
        'a longer label name in a series read fails the scrape: reason="label_limit"; 0 = no limit',
    ),
    Setting(
        "targets",
        "label_value_length_limit",
        Number(int, minimum=0, metavar="COUNT"),
        2048,
        'a longer label value in a series read fails the scrape: reason="label_limit"; 0 = no limit',
    ),
    Setting(
        "targets",
        "engine_limit",
        Number(int, minimum=0, metavar="COUNT"),
        256,
        'more (model_name, engine) pairs in one answer fail the scrape: reason="too_large"; 0 = no limit',
    ),
    Setting(
        "targets",
        "label_values_limit",
        Number(int, minimum=0, metavar="COUNT"),
        32,
        "distinct values of an exported label per engine (waiting reasons); the rest are dropped and counted; "
        "0 = no limit",
    ),
    Setting(
        "targets",
        "bearer_token_file",
        TokenFile(),
        None,
        'sent as "Authorization: Bearer <its content>", read at every scrape; never inline',
        example="/var/run/secrets/vllm/token",
    ),
    Setting("targets", "tls.insecure_skip_verify", Boolean(), False, "only for self-signed test set-ups"),
    Setting(
        "targets",
        "tls.ca_file",
        ReadableFile(),
        None,
        "CA bundle that signed the server's certificate",
        example="/etc/ssl/vllm-ca.pem",
    ),
    Setting(
        "targets",
        "clock",
        Choice(CLOCKS, lower=False, template="{text!r} is not one of {options}"),
        "wall",
        "wall: the sidecar's clock; simulated: the built-in simulator's (replays only)",
    ),
)

#: The ``alerts:`` section: one row per :class:`RuleParams` field, its default taken from there.
ALERT_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "alerts",
        "sidecar_job",
        JobLabel(),
        RuleParams.sidecar_job,
        "the job label Prometheus gives the sidecar (a PodMonitor defaults to <namespace>/<name>: set jobLabel "
        "or this)",
        render_flag=True,
    ),
    Setting(
        "alerts",
        "namespace",
        Namespace(),
        RuleParams.namespace,
        'the namespace every rule reads (namespace="..." on each series), so that installations in several '
        "namespaces of one Prometheus never alert or record twice; unset: every namespace",
        example="llm-prod",
        render_flag=True,
    ),
    Setting(
        "alerts",
        "runbook_base_url",
        BaseUrl(),
        RuleParams.runbook_base_url,
        "runbook_url = this + /<AlertName>.md (default: this repository's docs/runbooks)",
        render_flag=True,
    ),
    Setting(
        "alerts",
        "dashboard_base_url",
        BaseUrl(),
        RuleParams.dashboard_base_url,
        "your Grafana's root URL; dashboard_url = this + /d/<uid>?var-... (unset: no dashboard_url; each "
        "runbook names its dashboard)",
        example="https://grafana.example.com",
        render_flag=True,
    ),
    Setting(
        "alerts",
        "evaluation_interval",
        PromDuration(),
        RuleParams.evaluation_interval,
        "rule-group evaluation interval (default: Prometheus' global one)",
        example="30s",
    ),
    Setting(
        "alerts",
        "gap_window",
        PromDuration(),
        RuleParams.gap_window,
        "max_over_time window under the warning and KVCacheRequestsWaitingForKV: a missed scrape or a dip "
        "does not reset for: (it lengthens every excursion by as much)",
    ),
    Setting(
        "alerts",
        "warning_for",
        PromDuration(),
        RuleParams.warning_for,
        "KVCacheAlmostFull warning: above thresholds.warning this long",
    ),
    Setting(
        "alerts",
        "critical_window",
        PromDuration(),
        RuleParams.critical_window,
        "KVCacheAlmostFull critical (the page): the peaks keep reaching thresholds.watermark, i.e. the "
        "critical_quantile of usage over this window is above it (no for:) ...",
    ),
    Setting(
        "alerts",
        "critical_quantile",
        Fraction(),
        RuleParams.critical_quantile,
        "... that quantile: 0.95 pages once usage was above the watermark for 5% of the window ...",
    ),
    Setting(
        "alerts",
        "critical_keep_firing_for",
        PromDuration(),
        RuleParams.critical_keep_firing_for,
        "... and the page stays firing this long after the peaks stop (one page per saturation)",
    ),
    Setting(
        "alerts",
        "full_soon_within",
        PromDuration(),
        RuleParams.full_soon_within,
        "KVCacheFullSoon: the forecast says full within this ...",
    ),
    Setting("alerts", "full_soon_for", PromDuration(), RuleParams.full_soon_for, "... for this long"),
    Setting(
        "alerts",
        "preemptions_per_second",
        Number(minimum=0.0, metavar="RATE"),
        RuleParams.preemptions_per_second,
        "KVCachePreemptions: preemption rate over 5m above this (per second; the floor below which "
        "preemptions are the scheduler at work) ...",
    ),
    Setting("alerts", "preemptions_for", PromDuration(), RuleParams.preemptions_for, "... for this long"),
    Setting(
        "alerts",
        "waiting_for",
        PromDuration(),
        RuleParams.waiting_for,
        "KVCacheRequestsWaitingForKV: requests wait for capacity above the watermark this long",
    ),
    Setting(
        "alerts",
        "prefix_hit_ratio_low",
        Fraction(),
        RuleParams.prefix_hit_ratio_low,
        "KVCachePrefixHitRatioLow: namespace/model hit ratio (tokens) below this ...",
    ),
    Setting(
        "alerts",
        "prefix_hit_ratio_usual",
        Fraction(),
        RuleParams.prefix_hit_ratio_usual,
        "... only where its median over prefix_hit_ratio_baseline is at least this (a workload with shared "
        "prefixes: one without them never fires) ...",
    ),
    Setting(
        "alerts",
        "prefix_hit_ratio_baseline",
        PromDuration(),
        RuleParams.prefix_hit_ratio_baseline,
        "... the window of that median ...",
    ),
    Setting("alerts", "prefix_hit_ratio_for", PromDuration(), RuleParams.prefix_hit_ratio_for, "... for this long"),
    Setting(
        "alerts",
        "capacity_mismatch_tolerance",
        Fraction(),
        RuleParams.capacity_mismatch_tolerance,
        "KVCacheCapacityMismatch: |actual/theoretical - 1| above this (exact budgets only) ...",
    ),
    Setting("alerts", "capacity_mismatch_for", PromDuration(), RuleParams.capacity_mismatch_for, "... for this long"),
    Setting(
        "alerts",
        "overprovisioned_below",
        Fraction(),
        RuleParams.overprovisioned_below,
        "KVCacheOverProvisioned (info): awake-time usage quantile below this ...",
    ),
    Setting(
        "alerts", "overprovisioned_quantile", Fraction(), RuleParams.overprovisioned_quantile, "... the quantile ..."
    ),
    Setting(
        "alerts",
        "overprovisioned_window",
        PromDuration(),
        RuleParams.overprovisioned_window,
        "... over this window ...",
    ),
    Setting("alerts", "overprovisioned_for", PromDuration(), RuleParams.overprovisioned_for, "... for this long"),
    Setting(
        "alerts",
        "scrape_failing_for",
        PromDuration(),
        RuleParams.scrape_failing_for,
        "KVCacheSidecarScrapeFailing: failing this long (only after a first good scrape)",
    ),
    Setting(
        "alerts",
        "model_config_missing_for",
        PromDuration(),
        RuleParams.model_config_missing_for,
        "KVCacheModelConfigMissing: model.config set but not loaded this long (kvcache_model_config_loaded 0)",
    ),
    Setting(
        "alerts",
        "sidecar_down_for",
        PromDuration(),
        RuleParams.sidecar_down_for,
        "KVCacheSidecarDown: down or absent this long",
    ),
)


#: Settings that are no longer read: a file that still has one loads, and the message (logged as a
#: warning once per load) says what replaced it. ``section.key`` -> message.
DEPRECATED_SETTINGS: dict[str, str] = {
    "alerts.critical_for": (
        "alerts.critical_for: deprecated and ignored: the page (KVCacheAlmostFull critical) no longer waits "
        "for usage to stay above the watermark (real bursts are shorter than any such for:); it fires when "
        "the alerts.critical_quantile (default 0.95) of usage over alerts.critical_window (default 10m) is "
        "above it. Remove critical_for; tune critical_window/critical_quantile instead"
    ),
}


@dataclass(frozen=True)
class FileFlag:
    """A ``kv-sidecar run`` flag that is no setting of the file: where the files are and how they are watched."""

    flag: str
    metavar: str
    help: str

    @property
    def dest(self) -> str:
        """``--web.config.file`` -> ``web_config_file``."""
        return self.flag.removeprefix("--").replace(".", "_").replace("-", "_")


#: How often the configuration files are read for a change when ``--config.auto-reload-interval`` is not given.
DEFAULT_AUTO_RELOAD_INTERVAL = "5s"
#: The flags of ``kv-sidecar run`` outside the settings table, in the order ``--help`` shows them.
FILE_FLAGS: tuple[FileFlag, ...] = (
    FileFlag(
        "--config.file",
        "FILE",
        "YAML configuration (example: deploy/examples/sidecar.yaml); read again on SIGHUP, POST /-/reload "
        "and when its content changes",
    ),
    FileFlag(
        "--web.config.file",
        "FILE",
        "TLS, client certificates, basic auth and response headers of the endpoint, in the Prometheus "
        "exporter-toolkit format (docs/security.md); read again like --config.file",
    ),
    FileFlag(
        "--config.auto-reload-interval",
        "DURATION",
        f"how often both files are read for a new content; 0 = only on SIGHUP and POST /-/reload "
        f"(default: {DEFAULT_AUTO_RELOAD_INTERVAL})",
    ),
)

_BY_PATH = {s.path: s for s in SETTINGS + TARGET_SETTINGS + ALERT_SETTINGS}


def setting(path: str) -> Setting:
    """The row of ``section.key``."""
    return _BY_PATH[path]


def default(path: str) -> Any:
    """The default of the setting ``section.key`` (the dataclasses of ``sidecar.config`` take theirs from here)."""
    return _BY_PATH[path].default


def add_flag(parser: argparse.ArgumentParser, row: Setting, default: str) -> None:
    """``row``'s flag on ``parser``: its one spelling (:func:`flag_name`), the value's name (the parser's
    metavar, or the choices) and the row's help followed by ``(default: <default>)``."""
    options = row.parse.options if isinstance(row.parse, Choice) else None
    parser.add_argument(
        flag_name(row.section, row.key),
        dest=row.dest,
        choices=options,
        metavar=None if options else row.parse.metavar,
        help=f"{row.help} (default: {default})",
    )


def section_keys(rows: tuple[Setting, ...], section: str) -> tuple[str, ...]:
    """The keys a section (or a target entry) may hold, nested keys by their first part, in table order."""
    return tuple(dict.fromkeys(s.key.split(".")[0] for s in rows if s.section == section))
