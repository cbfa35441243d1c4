"""Configuration: YAML file + environment + flags -> frozen dataclasses.

Precedence, highest first: command-line flag, environment variable
(``KV_SIDECAR_*``, for containers), the YAML file (``--config.file``), the
built-in default. The whole configuration is validated before anything is
served and **every** problem is reported at once, each naming the field and
the fix (:class:`ConfigError`); the CLI turns that into exit code 2.

The annotated example with every field is ``deploy/examples/sidecar.yaml``.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse

import yaml

from .thresholds import Thresholds
from .units import format_duration, parse_duration, parse_size

DEFAULT_TARGET = "http://127.0.0.1:8000/metrics"  # vLLM's port in the same pod
DEFAULT_LISTEN = ":9437"
DEFAULT_INTERVAL_S = 5.0
DEFAULT_BODY_LIMIT = 16 * 2**20
MAX_DEFAULT_TIMEOUT_S = 10.0
MIN_STALENESS_S = 60.0
MIN_INTERVAL_S = 0.1
ENGINES = ("vllm",)
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("logfmt", "json")
CLOCKS = ("wall", "simulated")


class ConfigError(Exception):
    """All problems found in a configuration, each ``field: problem (fix)``."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        self.source = source
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


@dataclass(frozen=True)
class TargetConfig:
    name: str
    url: str
    engine: str = "vllm"
    timeout_s: float = 4.0
    body_size_limit_bytes: int = DEFAULT_BODY_LIMIT
    bearer_token_file: str | None = None
    tls_insecure_skip_verify: bool = False
    tls_ca_file: str | None = None
    #: ``wall``: samples are stamped with the sidecar's clock (production).
    #: ``simulated``: with the ``X-Simulated-Time`` header of the built-in
    #: simulator, so that replays at any ``--speed`` give the same gauges.
    clock: str = "wall"


@dataclass(frozen=True)
class ModelSettings:
    """What vLLM does not export about the served model (issue 4 §3)."""

    config: str | None = None  # config.json or a model directory
    dtype: str | None = None  # served dtype; None = vLLM's "auto"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory: str | None = None  # "80GiB", "80GB" or a GPU name such as "H100-80GB"
    #: Overrides of the budget estimator's terms (bytes); None = the documented estimate.
    #: Take them from vLLM's start-up log ("Model loading took", memory profiling lines).
    weights_memory: int | None = None
    activation_memory: int | None = None
    non_torch_memory: int | None = None
    cudagraph_memory: int | None = None


@dataclass(frozen=True)
class ForecastSettings:
    window_s: float = 600.0  # the shortest fill-rate trend window
    #: longer trend windows for slow ramps (sidecar.forecast.earliest_full); () = the window alone
    long_windows_s: tuple[float, ...] = (1200.0, 2400.0)
    min_samples: int = 5
    min_span_s: float = 10.0
    #: minimum width of the trend's time slices (0 = each window / 6); see sidecar.forecast.fill_rate
    segment_s: float = 0.0
    peak_window_s: float = 3600.0  # peak demand for the suggested utilization
    utilization_min: float = 0.5
    utilization_max: float = 0.95

    @property
    def windows_s(self) -> tuple[float, ...]:
        """Every trend window, shortest first."""
        return (self.window_s, *self.long_windows_s)


@dataclass(frozen=True)
class Config:
    targets: tuple[TargetConfig, ...]
    listen_address: str = DEFAULT_LISTEN
    scrape_interval_s: float = DEFAULT_INTERVAL_S
    staleness_s: float = MIN_STALENESS_S
    derive_window_s: float = 300.0
    log_level: str = "info"
    log_format: str = "logfmt"
    thresholds: Thresholds = field(default_factory=Thresholds)
    model: ModelSettings = field(default_factory=ModelSettings)
    forecast: ForecastSettings = field(default_factory=ForecastSettings)
    #: The ``alerts:`` section, kept raw for ``kv-sidecar rules render``.
    alerts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def listen_host_port(self) -> tuple[str, int]:
        host, _, port = self.listen_address.rpartition(":")
        return host.strip("[]"), int(port)


# The YAML schema: section -> allowed keys. Unknown keys are errors (typos
# would otherwise silently fall back to defaults).
_SCHEMA: dict[str, tuple[str, ...] | None] = {
    "targets": None,
    "web": ("listen_address",),
    "scrape": ("interval", "staleness"),
    "derive": ("window",),
    "log": ("level", "format"),
    "thresholds": ("watermark", "warning", "target_usage"),
    "model": ("config", "dtype", "tensor_parallel_size", "pipeline_parallel_size", "gpu_memory",
              "weights_memory", "activation_memory", "non_torch_memory", "cudagraph_memory"),
    "forecast": ("window", "long_windows", "min_samples", "min_span", "segment", "peak_window", "utilization_min",
                 "utilization_max"),
    "alerts": None,  # validated by sidecar.rules
}
_TARGET_KEYS = ("name", "url", "engine", "timeout", "body_size_limit", "bearer_token_file", "tls", "clock")
_TLS_KEYS = ("insecure_skip_verify", "ca_file")

#: environment variable -> (section, key); KV_SIDECAR_TARGET is comma-separated URLs.
ENV_VARS: dict[str, tuple[str, str]] = {
    "KV_SIDECAR_WEB_LISTEN_ADDRESS": ("web", "listen_address"),
    "KV_SIDECAR_SCRAPE_INTERVAL": ("scrape", "interval"),
    "KV_SIDECAR_SCRAPE_STALENESS": ("scrape", "staleness"),
    "KV_SIDECAR_DERIVE_WINDOW": ("derive", "window"),
    "KV_SIDECAR_LOG_LEVEL": ("log", "level"),
    "KV_SIDECAR_LOG_FORMAT": ("log", "format"),
    "KV_SIDECAR_MODEL_CONFIG": ("model", "config"),
    "KV_SIDECAR_MODEL_DTYPE": ("model", "dtype"),
    "KV_SIDECAR_MODEL_TENSOR_PARALLEL_SIZE": ("model", "tensor_parallel_size"),
    "KV_SIDECAR_MODEL_PIPELINE_PARALLEL_SIZE": ("model", "pipeline_parallel_size"),
    "KV_SIDECAR_MODEL_GPU_MEMORY": ("model", "gpu_memory"),
    "KV_SIDECAR_THRESHOLDS_WATERMARK": ("thresholds", "watermark"),
}


#: RFC 6750 §2.1 ``b64token``: what may follow "Bearer " in an Authorization header.
_TOKEN_RE = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def read_bearer_token(path: str) -> str:
    """The token in ``path``: one line of RFC 6750 ``b64token`` characters, surrounding whitespace removed.

    Raises ``ValueError`` with a message that never contains the file's content: a token with a
    newline or a non-ASCII byte would otherwise reach h11's "Illegal header value" error, which
    quotes the header, or fail to encode (Kubernetes service-account tokens and most API keys fit).
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{path!r} cannot be read ({e.strerror or type(e).__name__})") from None
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ValueError(f"{path!r} holds non-ASCII bytes (write the token alone, as plain ASCII)") from None
    if not token:
        raise ValueError(f"{path!r} is empty (write the token into it)")
    if not _TOKEN_RE.fullmatch(token):
        raise ValueError(f"{path!r} is not one token: only A-Z a-z 0-9 - . _ ~ + / and trailing = may appear, "
                         "on one line (write the token alone)")
    return token


def _did_you_mean(word: str, options: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(options)})"


def read_yaml(path: str) -> dict[str, Any]:
    """The YAML mapping in ``path``; a ConfigError naming the file when it is unreadable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"cannot read the file: {e.strerror or e} (check the path)"], path) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError([f"{where}not valid YAML: {getattr(e, 'problem', e)}"], path) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"the top level must be a mapping of sections ({', '.join(_SCHEMA)}), "
                           f"got {type(data).__name__}"], path)
    return data


def merge_overrides(file_data: Mapping[str, Any], env: Mapping[str, str],
                    flags: Mapping[tuple[str, str], Any], flag_targets: list[str] | None,
                    origins: dict[str, str] | None = None) -> dict[str, Any]:
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
    if env.get("KV_SIDECAR_TARGET"):
        data["targets"] = [u.strip() for u in env["KV_SIDECAR_TARGET"].split(",") if u.strip()]
        origins["targets"] = "KV_SIDECAR_TARGET"
    for (section, key), value in flags.items():
        if value is not None:
            put(section, key, value, f"--{section}.{key.replace('_', '-')}")
    if flag_targets:
        data["targets"] = list(flag_targets)
        origins["targets"] = "--target"
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


def build_config(data: Mapping[str, Any], source: str = "config") -> Config:
    """Validate a merged mapping into a :class:`Config`; every problem at once."""
    problems: list[str] = []

    for section in data:
        if section not in _SCHEMA:
            problems.append(f"{section}: unknown section{_did_you_mean(str(section), tuple(_SCHEMA))}")

    def section(name: str) -> dict[str, Any]:
        value = data.get(name) or {}
        if not isinstance(value, dict):
            problems.append(f"{name}: must be a mapping, got {type(value).__name__}")
            return {}
        allowed = _SCHEMA[name]
        if allowed is not None:
            for key in value:
                if key not in allowed:
                    problems.append(f"{name}.{key}: unknown field{_did_you_mean(str(key), allowed)}")
        return value

    def duration(where: str, value: Any, default: float, minimum: float = 0.0) -> float:
        if value is None:
            return default
        try:
            seconds = parse_duration(value)
        except ValueError as e:
            problems.append(f"{where}: {e}")
            return default
        if seconds <= minimum:
            problems.append(f"{where}: must be greater than {format_duration(minimum)}, got {value!r}")
            return default
        return seconds

    def number(where: str, value: Any, default: float, kind: type = float) -> Any:
        if value is None:
            return default
        try:
            if isinstance(value, bool):
                raise ValueError
            as_float = float(value)
            if not math.isfinite(as_float) or (kind is int and not as_float.is_integer()):
                raise ValueError
            return kind(as_float)
        except (TypeError, ValueError):
            problems.append(f"{where}: must be a {'whole number' if kind is int else 'finite number'}, got {value!r}")
            return default

    def choice(where: str, value: Any, default: str, options: tuple[str, ...]) -> str:
        if value is None:
            return default
        text = str(value).lower()
        if text not in options:
            problems.append(f"{where}: {value!r} is not one of {', '.join(options)}")
            return default
        return text

    scrape = section("scrape")
    interval = duration("scrape.interval", scrape.get("interval"), DEFAULT_INTERVAL_S)
    if interval < MIN_INTERVAL_S:
        problems.append(f"scrape.interval: must be at least {format_duration(MIN_INTERVAL_S)}, "
                        f"got {scrape.get('interval')!r}")
        interval = DEFAULT_INTERVAL_S
    staleness_default = max(3 * interval, MIN_STALENESS_S)
    staleness = duration("scrape.staleness", scrape.get("staleness"), staleness_default)
    if scrape.get("staleness") is not None and staleness < interval:
        problems.append(f"scrape.staleness: must be at least scrape.interval ({format_duration(interval)}), "
                        f"got {scrape['staleness']!r}")

    web = section("web")
    listen = str(web.get("listen_address", DEFAULT_LISTEN))
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        problems.append(f"web.listen_address: {listen!r} is not HOST:PORT (use e.g. :9437 or 127.0.0.1:9437)")
    elif int(port) > 65535:
        problems.append(f"web.listen_address: port {port} is out of range (0-65535; 0 = any free port)")

    derive = section("derive")
    window = duration("derive.window", derive.get("window"), 300.0)
    if derive.get("window") is not None and window < 2 * interval:
        problems.append(f"derive.window: must cover at least two scrapes (>= {format_duration(2 * interval)}), "
                        f"got {derive['window']!r}")

    log = section("log")
    level = choice("log.level", log.get("level"), "info", LOG_LEVELS)
    fmt = choice("log.format", log.get("format"), "logfmt", LOG_FORMATS)

    th = section("thresholds")
    defaults = Thresholds()
    thresholds = Thresholds(
        watermark=number("thresholds.watermark", th.get("watermark"), defaults.watermark),
        warning=number("thresholds.warning", th.get("warning"), defaults.warning),
        target_usage=number("thresholds.target_usage", th.get("target_usage"), defaults.target_usage),
    )
    problems.extend(thresholds.problems())

    model = _model(section("model"), problems, number)
    fc = section("forecast")
    forecast = ForecastSettings(
        window_s=duration("forecast.window", fc.get("window"), 600.0),
        long_windows_s=_long_windows(fc.get("long_windows"), duration, problems),
        min_samples=number("forecast.min_samples", fc.get("min_samples"), 5, int),
        min_span_s=duration("forecast.min_span", fc.get("min_span"), 10.0),
        segment_s=0.0 if fc.get("segment") in (None, 0, "0", "0s") else duration("forecast.segment", fc.get("segment"), 0.0),
        peak_window_s=duration("forecast.peak_window", fc.get("peak_window"), 3600.0),
        utilization_min=number("forecast.utilization_min", fc.get("utilization_min"), 0.5),
        utilization_max=number("forecast.utilization_max", fc.get("utilization_max"), 0.95),
    )
    if any(w <= forecast.window_s for w in forecast.long_windows_s):
        problems.append(f"forecast.long_windows: each must be longer than forecast.window "
                        f"({format_duration(forecast.window_s)}), got {fc.get('long_windows')!r}")
    if not 0 < forecast.utilization_min < forecast.utilization_max <= 1:
        problems.append("forecast.utilization_min/utilization_max: need 0 < min < max <= 1 "
                        f"(got {forecast.utilization_min}, {forecast.utilization_max})")
    if forecast.min_samples < 2:
        problems.append(f"forecast.min_samples: must be at least 2, got {forecast.min_samples}")
    elif forecast.window_s < max(forecast.min_span_s, (forecast.min_samples - 1) * interval):
        problems.append(f"forecast.window: {format_duration(forecast.window_s)} cannot hold forecast.min_samples "
                        f"({forecast.min_samples}) scrapes spanning forecast.min_span "
                        f"({format_duration(forecast.min_span_s)}): the fill rate would never be published")

    alerts = data.get("alerts") or {}
    if not isinstance(alerts, dict):
        problems.append(f"alerts: must be a mapping, got {type(alerts).__name__}")
        alerts = {}
    else:
        from .rules import RuleParams  # the rules generator owns that section's schema
        problems.extend(RuleParams.from_mapping(alerts)[1])

    targets = _targets(data.get("targets"), interval, problems)

    if problems:
        raise ConfigError(problems, source)
    return Config(
        targets=tuple(targets), listen_address=listen, scrape_interval_s=interval, staleness_s=staleness,
        derive_window_s=window, log_level=level, log_format=fmt, thresholds=thresholds, model=model,
        forecast=forecast, alerts=alerts,
    )


def _long_windows(value: Any, duration, problems: list[str]) -> tuple[float, ...]:
    """``forecast.long_windows``: a YAML list of durations or a comma-separated string; ``[]`` turns them off."""
    if value is None:
        return ForecastSettings.long_windows_s
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list):
        problems.append(f"forecast.long_windows: must be a list of durations such as [20m, 40m], got {value!r}")
        return ForecastSettings.long_windows_s
    windows = [duration(f"forecast.long_windows[{i}]", item.strip() if isinstance(item, str) else item, 0.0)
               for i, item in enumerate(items) if not (isinstance(item, str) and not item.strip())]
    return tuple(sorted(set(w for w in windows if w > 0)))


def _model(m: dict[str, Any], problems: list[str], number) -> ModelSettings:
    tp = number("model.tensor_parallel_size", m.get("tensor_parallel_size"), 1, int)
    pp = number("model.pipeline_parallel_size", m.get("pipeline_parallel_size"), 1, int)
    for name, v in (("tensor_parallel_size", tp), ("pipeline_parallel_size", pp)):
        if v < 1:
            problems.append(f"model.{name}: must be at least 1, got {v}")
    path = m.get("config")
    if path is not None and not Path(str(path)).exists():
        problems.append(f"model.config: {path!r} does not exist (give a config.json or a model directory holding one)")
    elif path is not None and Path(str(path)).is_dir() and not (Path(str(path)) / "config.json").is_file():
        problems.append(f"model.config: directory {path!r} holds no config.json")
    gpu = m.get("gpu_memory")
    if gpu is not None:
        try:
            from .capacity import CapacityError, parse_memory  # the capacity model owns GPU names
        except ImportError:  # pragma: no cover - capacity package is part of the distribution
            parse_memory, CapacityError = None, ValueError
        if parse_memory is not None:
            try:
                parse_memory(str(gpu), name="model.gpu_memory")
            except (CapacityError, ValueError) as e:
                problems.append(str(e))
    dtype = m.get("dtype")
    sizes: dict[str, int | None] = {}
    for name in ("weights_memory", "activation_memory", "non_torch_memory", "cudagraph_memory"):
        sizes[name] = None
        if m.get(name) is not None:
            try:
                sizes[name] = parse_size(m[name])
            except ValueError as e:
                problems.append(f"model.{name}: {e}")
    return ModelSettings(config=None if path is None else str(path), dtype=None if dtype is None else str(dtype),
                         tensor_parallel_size=tp, pipeline_parallel_size=pp,
                         gpu_memory=None if gpu is None else str(gpu), **sizes)


def _targets(raw: Any, interval: float, problems: list[str]) -> list[TargetConfig]:
    if raw is None:
        raw = [DEFAULT_TARGET]
    if not isinstance(raw, list) or not raw:
        problems.append("targets: must be a non-empty list of URLs or mappings with at least 'url'")
        return []
    default_timeout = min(0.8 * interval, MAX_DEFAULT_TIMEOUT_S)
    out: list[TargetConfig] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        where = f"targets[{i}]"
        if isinstance(item, str):
            item = {"url": item}
        if not isinstance(item, dict):
            problems.append(f"{where}: must be a URL or a mapping with 'url', got {type(item).__name__}")
            continue
        for key in item:
            if key not in _TARGET_KEYS:
                problems.append(f"{where}.{key}: unknown field{_did_you_mean(str(key), _TARGET_KEYS)}")
        url = str(item.get("url", ""))
        parsed = urlparse(url)
        if not url:
            problems.append(f"{where}.url: missing (e.g. {DEFAULT_TARGET})")
        elif parsed.scheme not in ("http", "https") or not parsed.netloc:
            hint = f"http://{url}" if "://" not in url else DEFAULT_TARGET
            if "://" not in url and ":" not in url and "/" not in url:
                hint = f"http://{url}:8000/metrics"
            problems.append(f"{where}.url: not an http(s) URL: {url!r} (did you mean {hint}?)")
        if parsed.username or parsed.password:
            problems.append(f"{where}.url: credentials in the URL would end up in labels and logs "
                            f"(remove user:password@ and use {where}.bearer_token_file)")
        default_name = parsed.hostname + (f":{parsed.port}" if parsed.port else "") if parsed.hostname else ""
        name = str(item.get("name") or default_name or f"target{i}")
        if name in names:
            problems.append(f"{where}.name: {name!r} is used by another target (names must be unique)")
        names.add(name)
        timeout = default_timeout
        if item.get("timeout") is not None:
            try:
                timeout = parse_duration(item["timeout"])
                if timeout <= 0:
                    raise ValueError(f"must be greater than 0s, got {item['timeout']!r}")
                if timeout >= interval:
                    # equal is not enough: parsing adds to the exchange, and the next scrape would be skipped
                    problems.append(f"{where}.timeout: {item['timeout']!r} is not shorter than scrape.interval "
                                    f"({format_duration(interval)}); scrapes would overlap and every other one "
                                    f"be skipped (use less than the interval, e.g. {format_duration(default_timeout)})")
            except ValueError as e:
                problems.append(f"{where}.timeout: {e}")
        limit = DEFAULT_BODY_LIMIT
        if item.get("body_size_limit") is not None:
            try:
                limit = parse_size(item["body_size_limit"])
                if limit <= 0:
                    raise ValueError(f"must be positive, got {item['body_size_limit']!r}")
            except ValueError as e:
                problems.append(f"{where}.body_size_limit: {e}")
        engine = str(item.get("engine", "vllm")).lower()
        if engine not in ENGINES:
            problems.append(f"{where}.engine: {engine!r} is not supported (supported: {', '.join(ENGINES)})")
        token_file = item.get("bearer_token_file")
        if token_file is not None and not os.path.isfile(str(token_file)):
            problems.append(f"{where}.bearer_token_file: {token_file!r} is not a readable file "
                            "(mount the token as a file; tokens are never given inline)")
        elif token_file is not None:
            try:
                read_bearer_token(str(token_file))
            except ValueError as e:
                problems.append(f"{where}.bearer_token_file: {e}")
        tls = item.get("tls") or {}
        if not isinstance(tls, dict):
            problems.append(f"{where}.tls: must be a mapping with {', '.join(_TLS_KEYS)}")
            tls = {}
        for key in tls:
            if key not in _TLS_KEYS:
                problems.append(f"{where}.tls.{key}: unknown field{_did_you_mean(str(key), _TLS_KEYS)}")
        ca = tls.get("ca_file")
        if ca is not None and not os.path.isfile(str(ca)):
            problems.append(f"{where}.tls.ca_file: {ca!r} is not a readable file")
        insecure = tls.get("insecure_skip_verify", False)
        if not isinstance(insecure, bool):
            problems.append(f"{where}.tls.insecure_skip_verify: must be true or false, got {insecure!r}")
            insecure = False
        clock = str(item.get("clock", "wall"))
        if clock not in CLOCKS:
            problems.append(f"{where}.clock: {clock!r} is not one of {', '.join(CLOCKS)}")
        out.append(TargetConfig(name=name, url=url, engine=engine, timeout_s=timeout, body_size_limit_bytes=limit,
                                bearer_token_file=None if token_file is None else str(token_file),
                                tls_insecure_skip_verify=insecure, tls_ca_file=None if ca is None else str(ca),
                                clock=clock))
    return out


def load_config(path: str | None = None, *, env: Mapping[str, str] | None = None,
                flags: Mapping[tuple[str, str], Any] | None = None,
                flag_targets: list[str] | None = None) -> Config:
    """Read, merge and validate; raises :class:`ConfigError` listing every problem."""
    file_data = read_yaml(path) if path else {}
    origins: dict[str, str] = {}
    merged = merge_overrides(file_data, os.environ if env is None else env, flags or {}, flag_targets, origins)
    try:
        return build_config(merged, source=path or "config")
    except ConfigError as e:
        raise ConfigError(_attribute(e.problems, origins), e.source) from None
