"""Configuration: YAML file + environment + flags -> frozen dataclasses.

Precedence, highest first: command-line flag, environment variable
(``KV_SIDECAR_*``, for containers), the YAML file (``--config.file``), the
built-in default. The whole configuration is validated before anything is
served and **every** problem is reported at once, each naming the field and
the fix (:class:`ConfigError`); the CLI turns that into exit code 2. That
includes the capacity model's checks of the ``model:`` section (a
tensor-parallel size that does not divide the model's heads, ...).

What each setting is, its default, parser, variable and flag: the table in
:mod:`sidecar.settings`. The annotated example with every field,
``deploy/examples/sidecar.yaml``, and ``docs/configuration.md`` are generated
from it (``make generate``).
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from . import capacity as cap
from . import input_files
from .alert_params import RuleParams
from .model_discovery import is_hub_cache
from .setting_parsers import Invalid, read_bearer_token
from .settings import (
    ALERT_SETTINGS,
    DEFAULT_TARGET,
    DEPRECATED_SETTINGS,
    SECTIONS,
    SETTINGS,
    TARGET_SETTINGS,
    TARGETS_ENV,
    TARGETS_FLAG,
    Setting,
    default,
    default_staleness,
    default_timeout,
    flag_name,
    section_keys,
)
from .thresholds import Thresholds
from .units import format_duration

log = logging.getLogger("kv_sidecar.config")

__all__ = [
    "ENV_VARS",
    "HOLDERS",
    "Config",
    "ConfigError",
    "ForecastSettings",
    "ModelSettings",
    "TargetConfig",
    "build_config",
    "did_you_mean",
    "load_config",
    "load_rule_params",
    "merge_overrides",
    "model_problems",
    "print_config_errors",
    "read_bearer_token",
    "read_yaml",
]


class ConfigError(Exception):
    """All problems found in a configuration, each ``field: problem (fix)``."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        self.source = source
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


#: Problems printed of one file: a 1 MiB file of 30,000 bad entries is summed up after these.
MAX_PRINTED_PROBLEMS = 100


def print_config_errors(e: ConfigError, file: str | None = None) -> None:
    """Every problem on its own line on stderr, after the file it is in (``file`` when the error does not say)."""
    source = file if e.source == "config" and file else e.source
    print(
        f"kv-sidecar: invalid configuration ({len(e.problems)} problem{'s' if len(e.problems) > 1 else ''}):",
        file=sys.stderr,
    )
    for p in e.problems[:MAX_PRINTED_PROBLEMS]:
        print(f"  {source}: {p}", file=sys.stderr)
    if len(e.problems) > MAX_PRINTED_PROBLEMS:
        more = len(e.problems) - MAX_PRINTED_PROBLEMS
        print(f"  {source}: ... and {more} more problems (fix these first)", file=sys.stderr)


@dataclass(frozen=True)
class TargetConfig:
    """One entry of ``targets:``."""

    name: str
    url: str
    engine: str = default("targets.engine")
    timeout_s: float = default_timeout(default("scrape.interval"))
    body_size_limit_bytes: int = default("targets.body_size_limit")
    #: Bounds on what reaches the parser and the output (docs/limits.md); 0 = no limit.
    sample_limit: int = default("targets.sample_limit")
    label_limit: int = default("targets.label_limit")
    label_name_length_limit: int = default("targets.label_name_length_limit")
    label_value_length_limit: int = default("targets.label_value_length_limit")
    engine_limit: int = default("targets.engine_limit")
    label_values_limit: int = default("targets.label_values_limit")
    #: The KV capacity in tokens for an engine whose page does not export it (TGI, llama.cpp); None = unset.
    capacity_tokens: int | None = None
    bearer_token_file: str | None = None
    tls_insecure_skip_verify: bool = default("targets.tls.insecure_skip_verify")
    tls_ca_file: str | None = None
    #: ``wall``: samples are stamped with the sidecar's clock (production).
    #: ``simulated``: with the ``X-Simulated-Time`` header of the built-in
    #: simulator, so that replays at any ``--speed`` give the same gauges.
    clock: str = default("targets.clock")


@dataclass(frozen=True)
class ModelSettings:
    """What vLLM does not export about the served model (``model:``; docs/capacity.md)."""

    config: str | None = default("model.config")  # config.json or a model directory
    dtype: str | None = default("model.dtype")  # served dtype; None = vLLM's "auto"
    tensor_parallel_size: int = default("model.tensor_parallel_size")
    pipeline_parallel_size: int = default("model.pipeline_parallel_size")
    #: learn TP, PP and the serving flags from vLLM's command line in /proc (sidecar.process_discovery)
    process_discovery: bool = default("model.process_discovery")
    gpu_memory: str | None = default("model.gpu_memory")  # "80GiB", "80GB" or a GPU name such as "H100-80GB"
    #: Overrides of the budget estimator's terms (bytes); None = the documented estimate.
    #: Take them from vLLM's start-up log ("Model loading took", memory profiling lines).
    weights_memory: int | None = default("model.weights_memory")
    activation_memory: int | None = default("model.activation_memory")
    non_torch_memory: int | None = default("model.non_torch_memory")
    cudagraph_memory: int | None = default("model.cudagraph_memory")
    #: vLLM's version for the budget's rules (docs/capacity.md, "Versions"); None = the newest
    vllm_version: str | None = default("model.vllm_version")


@dataclass(frozen=True)
class ForecastSettings:
    """The ``forecast:`` section (docs/forecast.md)."""

    window_s: float = default("forecast.window")  # the shortest fill-rate trend window
    #: longer trend windows for slow ramps (sidecar.forecast.earliest_full); () = the window alone
    long_windows_s: tuple[float, ...] = default("forecast.long_windows")
    min_samples: int = default("forecast.min_samples")
    min_span_s: float = default("forecast.min_span")
    #: minimum width of the trend's time slices (0 = each window / 6); see sidecar.forecast.fill_rate
    segment_s: float = default("forecast.segment")
    peak_window_s: float = default("forecast.peak_window")  # peak demand for the suggested utilization
    #: the largest one-minute rise of demand is kept over this window (kvcache_burst_tokens)
    burst_window_s: float = default("forecast.burst_window")
    utilization_min: float = default("forecast.utilization_min")
    utilization_max: float = default("forecast.utilization_max")

    @property
    def windows_s(self) -> tuple[float, ...]:
        """Every trend window, shortest first."""
        return (self.window_s, *self.long_windows_s)


@dataclass(frozen=True)
class HistorySettings:
    """The ``history:`` section: the embedded history (sidecar.history); off while ``path`` is None."""

    path: str | None = default("history.path")
    retention_s: float = default("history.retention")
    max_bytes: int = default("history.max_size")


@dataclass(frozen=True)
class Config:
    """The validated configuration."""

    targets: tuple[TargetConfig, ...]
    listen_address: str = default("web.listen_address")
    scrape_interval_s: float = default("scrape.interval")
    staleness_s: float = default_staleness(default("scrape.interval"))
    derive_window_s: float = default("derive.window")
    log_level: str = default("log.level")
    log_format: str = default("log.format")
    thresholds: Thresholds = field(default_factory=Thresholds)
    model: ModelSettings = field(default_factory=ModelSettings)
    forecast: ForecastSettings = field(default_factory=ForecastSettings)
    history: HistorySettings = field(default_factory=HistorySettings)
    #: The ``alerts:`` section, parsed: what ``kv-sidecar rules render`` renders with.
    alerts: RuleParams = field(default_factory=RuleParams)

    @property
    def listen_host_port(self) -> tuple[str, int]:
        host, _, port = self.listen_address.rpartition(":")
        return host.strip("[]"), int(port)


#: The rows of each mapping section (every section but the ``targets:`` list), in validation order.
_ROWS: dict[str, tuple[Setting, ...]] = {
    sect.name: tuple(r for r in SETTINGS + ALERT_SETTINGS if r.section == sect.name)
    for sect in SECTIONS
    if sect.name != "targets"
}
#: The sections held by a dataclass of their own (``Config.<section>``, one field per row); the
#: fields of the other mapping sections are :class:`Config`'s own, and a ``targets:`` entry's are
#: :class:`TargetConfig`'s. ``tests/test_artifacts.py`` checks that every row has its field.
HOLDERS: dict[str, type] = {
    "thresholds": Thresholds,
    "model": ModelSettings,
    "forecast": ForecastSettings,
    "history": HistorySettings,
    "alerts": RuleParams,
}
_SECTION_NAMES = tuple(sect.name for sect in SECTIONS)
_TARGET_KEYS = section_keys(TARGET_SETTINGS, "targets")
_TLS_KEYS = tuple(s.key.removeprefix("tls.") for s in TARGET_SETTINGS if s.key.startswith("tls."))

#: environment variable -> (section, key); KV_SIDECAR_TARGET (comma-separated URLs) replaces ``targets``.
ENV_VARS: dict[str, tuple[str, str]] = {s.env: (s.section, s.key) for s in SETTINGS if s.env}


def did_you_mean(word: str, options: tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``options``, else `` (allowed: a, b, c)``."""
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(options)})"


def read_yaml(
    path: str, sections: tuple[str, ...] = _SECTION_NAMES, duplicates: list[str] | None = None
) -> dict[str, Any]:
    """The YAML mapping in ``path``; a ConfigError naming the file when it is unreadable.

    ``duplicates``: where duplicate keys go when the caller reports them with the other problems
    (else they are a ConfigError of their own).

    Read by :func:`sidecar.input_files.read_yaml`: a regular file of at most 1 MiB, strict UTF-8, no
    duplicate key, aliases and nesting bounded.

    ``sections``: the top-level keys the file may hold, named when the top level is not a mapping.
    """
    try:
        data = input_files.read_yaml(path, duplicates=duplicates)
    except input_files.FileProblem as e:
        raise ConfigError(e.problems, path) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"the top level must be a mapping of sections ({', '.join(sections)}), got {type(data).__name__}"],
            path,
        )
    return data


def merge_overrides(
    file_data: Mapping[str, Any],
    env: Mapping[str, str],
    flags: Mapping[tuple[str, str], Any],
    flag_targets: Sequence[str | Mapping[str, Any]] | None,
    origins: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Layer environment and flags over the file's mapping (flags win).

    ``origins`` (when given) receives ``"section.key" -> "KV_SIDECAR_..."`` or
    ``"--flag"`` for every overridden field, so errors can say where a bad value came from.
    """
    data: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in file_data.items()}
    origins = {} if origins is None else origins

    def put(section: str, key: str, value: Any, origin: str) -> None:
        sect = data.get(section)
        if not isinstance(sect, dict):
            sect = {}
            data[section] = sect
        sect[key] = value
        origins[f"{section}.{key}"] = origin

    for var, (section, key) in ENV_VARS.items():
        if env.get(var, "") != "":
            put(section, key, env[var], var)
    if env.get(TARGETS_ENV):
        data["targets"] = [u.strip() for u in env[TARGETS_ENV].split(",") if u.strip()]
        origins["targets"] = TARGETS_ENV
    for (section, key), value in flags.items():
        if value is not None:
            put(section, key, value, flag_name(section, key))
    if flag_targets:
        data["targets"] = list(flag_targets)
        origins["targets"] = TARGETS_FLAG
    return data


def _attribute(problems: list[str], origins: Mapping[str, str]) -> list[str]:
    """``scrape.interval: ...`` -> ``scrape.interval (from KV_SIDECAR_SCRAPE_INTERVAL): ...``."""
    out = []
    for p in problems:
        field_name = p.split(":", 1)[0]
        base = field_name.split("[", 1)[0]
        origin = origins.get(field_name) or origins.get(base)
        out.append(p.replace(field_name, f"{field_name} (from {origin})", 1) if origin else p)
    return out


# ----------------------------------------------------------------------------- reading values


def _lookup(mapping: Mapping[str, Any], key: str) -> Any:
    """``mapping[key]``, following dots into nested mappings; None when absent."""
    value: Any = mapping
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _read(rows: tuple[Setting, ...], mapping: Mapping[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    """Each row's value from ``mapping`` (its default when absent or bad), keyed by the row's field.

    ``where`` replaces the rows' section in problems (``targets[0]``); each parser problem becomes
    ``where.key: problem``.
    """
    values: dict[str, Any] = {}
    for row in rows:
        raw = _lookup(mapping, row.key)
        values[row.field] = row.default
        path = f"{where}.{row.key}"
        if raw is None:
            if row.required:
                problems.append(f"{path}: missing (e.g. {row.example})")
            continue
        try:
            values[row.field] = row.parse(raw)
        except Invalid as e:
            problems.extend(f"{path}{at}: {message}" for at, message in e.problems)
        except ValueError as e:
            problems.append(f"{path}: {e}")
    return values


def _sections(
    data: Mapping[str, Any], problems: list[str], names: tuple[str, ...] = tuple(_ROWS)
) -> dict[str, dict[str, Any]]:
    """The mapping of each section of ``names`` (``{}`` when absent); unknown sections, unknown keys of
    ``names`` and sections of ``names`` that are not mappings are problems."""
    for name in data:
        if name not in _SECTION_NAMES:
            problems.append(f"{name}: unknown section{did_you_mean(str(name), _SECTION_NAMES)}")
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        value = data.get(name) or {}
        if not isinstance(value, dict):
            problems.append(f"{name}: must be a mapping, got {type(value).__name__}")
            value = {}
        allowed = section_keys(_ROWS[name], name)
        for key in value:
            if f"{name}.{key}" in DEPRECATED_SETTINGS:  # still loads; the message says what replaced it
                log.warning("%s", DEPRECATED_SETTINGS[f"{name}.{key}"])
            elif key not in allowed:
                problems.append(f"{name}.{key}: unknown field{did_you_mean(str(key), allowed)}")
        out[name] = value
    return out


def _resolve_staleness(staleness: float | None, raw: Any, interval: float, problems: list[str]) -> float:
    """The staleness: its default (which follows the interval) when unset; when given, at least the interval."""
    if staleness is None:
        return default_staleness(interval)
    if staleness < interval:
        problems.append(
            f"scrape.staleness: must be at least scrape.interval ({format_duration(interval)}), got {raw!r}"
        )
    return staleness


def _check_derive(window: float, raw: Any, interval: float, problems: list[str]) -> None:
    if raw is not None and window < 2 * interval:
        problems.append(
            f"derive.window: must cover at least two scrapes (>= {format_duration(2 * interval)}), got {raw!r}"
        )


def _check_forecast(fc: ForecastSettings, raw: Mapping[str, Any], interval: float, problems: list[str]) -> None:
    """The forecast settings against each other and the scrape interval."""
    if any(w <= fc.window_s for w in fc.long_windows_s):
        problems.append(
            f"forecast.long_windows: each must be longer than forecast.window "
            f"({format_duration(fc.window_s)}), got {raw.get('long_windows')!r}"
        )
    if not 0 < fc.utilization_min < fc.utilization_max <= 1:
        problems.append(
            "forecast.utilization_min/utilization_max: need 0 < min < max <= 1 "
            f"(got {fc.utilization_min}, {fc.utilization_max})"
        )
    if fc.window_s < max(fc.min_span_s, (fc.min_samples - 1) * interval):
        problems.append(
            f"forecast.window: {format_duration(fc.window_s)} cannot hold forecast.min_samples "
            f"({fc.min_samples}) scrapes spanning forecast.min_span "
            f"({format_duration(fc.min_span_s)}): the fill rate would never be published"
        )


#: The capacity model's errors name the calculator's flags; the sidecar's fields are these.
_FIELD_OF_FLAG = {
    "--model-config": "model.config",
    "--tensor-parallel-size": "model.tensor_parallel_size",
    "--pipeline-parallel-size": "model.pipeline_parallel_size",
    "--dtype": "model.dtype",
    "--gpu-memory": "model.gpu_memory",
}


def model_problems(model: ModelSettings, *, missing_ok: bool = False) -> list[str]:
    """The capacity model's checks of the ``model:`` section, as config problems (``model.<field>: ...``).

    Loads ``model.config`` and lays the KV cache out for the configured TP/PP/dtype with the pure
    :mod:`sidecar.capacity` functions, so a tensor-parallel size that does not divide the model's
    heads (which vLLM refuses too) is reported with every other problem, before anything starts.

    ``missing_ok``: a ``model.config`` that names no file yet is no problem (``run``: a sidecar starts
    before vLLM, which may still be downloading the model; the capacity layer waits for the file).
    ``check-config`` is strict.
    """
    if model.config is None or is_hub_cache(model.config):
        return []  # a hub cache: the model is the one vLLM says it serves, checked when it does
    try:
        spec = cap.load_model(model.config)
        cap.kv_layout(spec, tp=model.tensor_parallel_size, pp=model.pipeline_parallel_size, dtype=model.dtype)
    except cap.ModelFileMissing:
        return [] if missing_ok else [missing_model_problem(model.config)]
    except cap.CapacityError as e:
        return [_as_config_problem(problem, model.config) for problem in e.problems]
    return []


def missing_model_problem(path: str) -> str:
    """``model.config: ... does not exist`` (or, for a directory, ``holds no config.json``) with the fix."""
    if Path(path).is_dir():
        return f"model.config: directory {path!r} holds no config.json (give a model directory holding one)"
    return f"model.config: {path!r} does not exist (give a config.json or a model directory holding one)"


def _as_config_problem(problem: str, path: str) -> str:
    """A capacity-model problem with the calculator flag it starts with replaced by the sidecar's field;
    a problem of the model's config.json (``config.json: head_dim: ...``) names the file."""
    flag, sep, rest = problem.partition(": ")
    if sep and flag in _FIELD_OF_FLAG:
        return f"{_FIELD_OF_FLAG[flag]}: {rest}"
    if sep and flag == "config.json":
        return f"model.config: {path}: {rest}"
    return f"model: {problem}"


def build_config(data: Mapping[str, Any], source: str = "config", *, model_missing_ok: bool = False) -> Config:
    """Validate a merged mapping into a :class:`Config`; every problem at once.

    ``model_missing_ok``: a ``model.config`` naming no file yet passes (:func:`model_problems`).
    """
    problems: list[str] = []
    sections = _sections(data, problems)
    values = {name: _read(rows, sections[name], name, problems) for name, rows in _ROWS.items()}
    own = {key: value for name in _ROWS if name not in HOLDERS for key, value in values[name].items()}
    interval = own["scrape_interval_s"]
    own["staleness_s"] = _resolve_staleness(own["staleness_s"], sections["scrape"].get("staleness"), interval, problems)
    _check_derive(own["derive_window_s"], sections["derive"].get("window"), interval, problems)

    held = {name: holder(**values[name]) for name, holder in HOLDERS.items()}
    problems.extend(held["thresholds"].problems())
    problems.extend(model_problems(held["model"], missing_ok=model_missing_ok))
    _check_forecast(held["forecast"], sections["forecast"], interval, problems)
    targets = _targets(data.get("targets"), interval, problems)

    if problems:
        raise ConfigError(problems, source)
    return Config(targets=tuple(targets), **own, **held)


# ----------------------------------------------------------------------------- targets


def _default_name(url: str, i: int) -> str:
    """The ``target`` label when none is given: the URL's host:port, else ``target<i>``."""
    try:
        parsed = urlparse(url)
        host = parsed.hostname
        return host + (f":{parsed.port}" if parsed.port else "") if host else f"target{i}"
    except ValueError:  # a port out of range; the URL's own problem is reported already
        return f"target{i}"


def _target(item: Any, i: int, interval: float, problems: list[str]) -> TargetConfig | None:
    """One entry of ``targets:`` (a URL or a mapping), every problem appended."""
    where = f"targets[{i}]"
    if isinstance(item, str):
        item = {"url": item}
    if not isinstance(item, dict):
        problems.append(f"{where}: must be a URL or a mapping with 'url', got {type(item).__name__}")
        return None
    for key in item:
        if key not in _TARGET_KEYS:
            problems.append(f"{where}.{key}: unknown field{did_you_mean(str(key), _TARGET_KEYS)}")
    tls = item.get("tls") or {}
    if not isinstance(tls, dict):
        problems.append(f"{where}.tls: must be a mapping with {', '.join(_TLS_KEYS)}")
        item = {**item, "tls": {}}
    else:
        for key in tls:
            if key not in _TLS_KEYS:
                problems.append(f"{where}.tls.{key}: unknown field{did_you_mean(str(key), _TLS_KEYS)}")
    v = _read(TARGET_SETTINGS, item, where, problems)
    v["name"] = v["name"] or _default_name(v["url"] or "", i)
    if v["timeout_s"] is None:
        v["timeout_s"] = default_timeout(interval)
    elif v["timeout_s"] >= interval:
        # equal is not enough: parsing adds to the exchange, and the next scrape would be skipped
        problems.append(
            f"{where}.timeout: {item['timeout']!r} is not shorter than scrape.interval "
            f"({format_duration(interval)}); scrapes would overlap and every other one "
            f"be skipped (use less than the interval, e.g. {format_duration(default_timeout(interval))})"
        )
    v["url"] = v["url"] or ""
    return TargetConfig(**v)


def _targets(raw: Any, interval: float, problems: list[str]) -> list[TargetConfig]:
    """The ``targets:`` list (default: vLLM in the same pod); names must be unique."""
    if raw is None:
        raw = [DEFAULT_TARGET]
    if not isinstance(raw, list) or not raw:
        problems.append("targets: must be a non-empty list of URLs or mappings with at least 'url'")
        return []
    out: list[TargetConfig] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        target = _target(item, i, interval, problems)
        if target is None:
            continue
        if target.name in names:
            problems.append(f"targets[{i}].name: {target.name!r} is used by another target (names must be unique)")
        names.add(target.name)
        out.append(target)
    return out


def load_config(
    path: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[tuple[str, str], Any] | None = None,
    flag_targets: Sequence[str | Mapping[str, Any]] | None = None,
    model_missing_ok: bool = False,
) -> Config:
    """Read, merge and validate; raises :class:`ConfigError` listing every problem.

    ``flag_targets`` are ``--target`` URLs, or whole ``targets:`` entries (replays use those).
    ``model_missing_ok``: see :func:`build_config` (``run`` passes True, ``check-config`` False).
    """
    duplicates: list[str] = []
    file_data = read_yaml(path, duplicates=duplicates) if path else {}
    origins: dict[str, str] = {}
    merged = merge_overrides(file_data, os.environ if env is None else env, flags or {}, flag_targets, origins)
    try:
        config = build_config(merged, source=path or "config", model_missing_ok=model_missing_ok)
    except ConfigError as e:
        raise ConfigError(duplicates + _attribute(e.problems, origins), e.source) from None
    if duplicates:
        raise ConfigError(duplicates, path or "config")
    return config


def load_forecast_params(path: str | None = None) -> ForecastSettings:
    """The ``forecast:`` section of ``path`` (checked against the file's scrape interval): what
    ``kv-sidecar dashboards render`` sizes the workload advice with (its peak window and utilization
    bounds), so that the dashboards advise what the sidecars configured by the same file do. Like
    :func:`load_rule_params`, the file alone. Raises :class:`ConfigError` listing every problem."""
    file_data = read_yaml(path) if path else {}
    origins: dict[str, str] = {}
    merged = merge_overrides(file_data, {}, {}, None, origins)
    problems: list[str] = []
    sections = _sections(merged, problems, ("scrape", "forecast"))
    interval = _read(_ROWS["scrape"], sections["scrape"], "scrape", problems)["scrape_interval_s"]
    forecast = ForecastSettings(**_read(_ROWS["forecast"], sections["forecast"], "forecast", problems))
    _check_forecast(forecast, sections["forecast"], interval, problems)
    if problems:
        raise ConfigError(_attribute(problems, origins), path or "config")
    return forecast


def load_rule_params(
    path: str | None = None, *, flags: Mapping[tuple[str, str], Any] | None = None
) -> tuple[Thresholds, RuleParams]:
    """The ``thresholds:`` and ``alerts:`` sections of ``path``, with ``flags`` over them: what
    ``kv-sidecar rules render`` renders with. Raises :class:`ConfigError` listing every problem.

    The file alone: no ``KV_SIDECAR_*`` variable of the shell changes the rules. Only these two
    sections are validated (and the section names, so that a misspelt ``alerts:`` is not silently
    ignored): a production file whose ``model.config`` names a path of another machine renders too.
    """
    file_data = read_yaml(path) if path else {}
    origins: dict[str, str] = {}
    merged = merge_overrides(file_data, {}, flags or {}, None, origins)
    problems: list[str] = []
    sections = _sections(merged, problems, ("thresholds", "alerts"))
    thresholds = Thresholds(**_read(_ROWS["thresholds"], sections["thresholds"], "thresholds", problems))
    problems.extend(thresholds.problems())
    alerts = RuleParams(**_read(_ROWS["alerts"], sections["alerts"], "alerts", problems))
    if problems:
        raise ConfigError(_attribute(problems, origins), path or "config")
    return thresholds, alerts
