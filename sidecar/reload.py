"""Reloading the configuration without a restart: ``SIGHUP``, ``POST /-/reload`` and the watched files.

A reload reads everything again as at start (``--config.file`` with the same flags and environment,
and ``--web.config.file``), validates it whole, and either applies all of it or none of it:

* a configuration with a problem is refused: the problems are logged on one line naming the file
  and the fields, counted (``kvcache_sidecar_config_reloads_total{result="failure"}``,
  ``kvcache_sidecar_config_last_reload_successful`` 0), and the running configuration stays;
* a change to a setting that only a restart can apply (:data:`RESTART_ONLY`: the listen address,
  the history file, turning TLS on or off) refuses the reload in the same way, naming the setting,
  so a half-applied configuration never runs;
* a good one is applied by the daemon (``apply``: targets that are unchanged keep their state and
  scrape jobs, see :meth:`sidecar.scrape_loop.Sidecar.apply`).

A file is read only when it holds a whole configuration: one caught empty, or without the
``targets:`` section it had when last applied (an editor or a ConfigMap update writing it, a
truncated copy), is a refused reload like any bad file, never the defaults (which would scrape
``127.0.0.1:8000`` and then re-add the real target as a new one, its history window lost). A
configuration equal to the running one is not applied again (``unchanged``): nothing restarts.

The files are watched by content (:func:`fingerprint`, every ``--config.auto-reload-interval``): a
Kubernetes ConfigMap or Secret volume swaps its files by renaming a ``..data`` symlink, so the
path's own mtime says nothing, but its content does. A content that was refused is not tried again
until it changes, so a bad ConfigMap is logged once, not every few seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from . import input_files
from .config import Config, ConfigError
from .reload_status import ReloadStatus as ReloadStatus  # re-exported: the old import path works
from .units import format_duration
from .webconfig import WebConfig

log = logging.getLogger("kv_sidecar.reload")

#: How often the watched files are read when ``--config.auto-reload-interval`` is not given.
DEFAULT_WATCH_INTERVAL_S = 5.0
#: A watched file is hashed up to this size: the most a configuration file may hold.
MAX_WATCHED_BYTES = input_files.YAML_MAX_BYTES

#: Settings a running daemon cannot change: (field, its value in a Config, why).
RESTART_ONLY: tuple[tuple[str, Callable[[Config], object], str], ...] = (
    ("web.listen_address", lambda c: c.listen_address, "the socket is bound at start"),
    ("history.path", lambda c: c.history.path, "the history file is opened at start"),
    ("history.retention", lambda c: c.history.retention_s, "the history file is opened with it"),
    ("history.max_size", lambda c: c.history.max_bytes, "the history file is opened with it"),
)


@dataclass(frozen=True)
class Sources:
    """Where the daemon's configuration comes from, to read it again as it was read at start."""

    load: Callable[[], Config]  # --config.file with the flags and environment of the start
    load_web: Callable[[], WebConfig]  # --web.config.file
    watched: tuple[str, ...] = ()  # files whose content is polled
    watch_interval_s: float = DEFAULT_WATCH_INTERVAL_S  # 0: not polled

    @classmethod
    def fixed(cls, config: Config, web: WebConfig | None = None) -> Sources:
        """A configuration that never changes (the demo, tests): a reload re-applies it."""
        return cls(load=lambda: config, load_web=lambda: web or WebConfig())


def fingerprint(path: str) -> str:
    """A digest of the file's content as the path reads now (symlinks followed), or why it cannot be read.

    Read as the configuration is (:func:`sidecar.input_files.read_bytes`): a regular file only, without
    blocking (a FIFO would block the poll), up to :data:`MAX_WATCHED_BYTES`; a larger file's
    fingerprint is its size, which the configuration refuses anyway.
    """
    try:
        content = input_files.read_bytes(path, max_bytes=MAX_WATCHED_BYTES, what="a configuration file")
    except input_files.FileProblem as e:
        return "not a regular file" if e.reason.endswith("not a regular file") else f"unreadable: {e.reason}"
    return hashlib.sha256(content).hexdigest()


def shape(path: str) -> frozenset[str] | None:
    """The top-level keys of the YAML mapping in ``path`` (empty: the file holds nothing); None when it
    cannot be read or parsed (the configuration's own reading says why)."""
    try:
        data = input_files.read_yaml(path)
    except input_files.FileProblem:
        return None
    if data is None:
        return frozenset()
    return frozenset(str(k) for k in data) if isinstance(data, dict) else None


def incomplete_problems(applied: dict[str, frozenset[str] | None], now: dict[str, frozenset[str] | None]) -> list[str]:
    """The files that hold less than a whole configuration compared with what was last applied: empty
    where they held something, or without the ``targets:`` section they had."""
    problems = []
    for path, before in applied.items():
        after = now.get(path)
        if not before or after is None:
            continue
        if not after:
            problems.append(
                f"{path}: the file is empty (caught while being written?); an empty file is not read as the "
                "defaults: write the whole file, or rename a complete one into place"
            )
        elif "targets" in before and "targets" not in after:
            problems.append(
                f"{path}: targets: missing where the running configuration has it (a partial file?); the "
                "default target is not put in place of yours: write the whole file"
            )
    return problems


def restart_problems(old: Config, new: Config, old_web: WebConfig, new_web: WebConfig) -> list[str]:
    """The changes only a restart applies, each as a problem naming the setting."""
    problems = []
    for name, value, why in RESTART_ONLY:
        if value(old) != value(new):
            problems.append(
                f"{name}: changed from {_shown(value(old))} to {_shown(value(new))}, which needs a restart "
                f"({why}); nothing of the new configuration was applied (restart the sidecar, or put the old "
                "value back)"
            )
    if old_web.scheme != new_web.scheme:
        problems.append(
            f"tls_server_config: {'added' if new_web.tls else 'removed'}; switching between HTTP and HTTPS needs a "
            "restart (Prometheus and the probes change scheme with it); nothing of the new configuration was applied"
        )
    return problems


def _shown(value: object) -> str:
    return format_duration(value) if isinstance(value, float) else repr(value)


#: Applies a validated configuration (on the event loop); returns what changed, for the log.
Apply = Callable[[Config, WebConfig], Awaitable[str]]


class Reloader:
    """Reads the configuration again on request or when a watched file changes, and applies it or refuses it."""

    def __init__(
        self,
        sources: Sources,
        config: Config,
        web: WebConfig,
        apply: Apply,
        clock: Callable[[], float] = time.time,
    ):
        self.sources = sources
        self.config = config
        self.web = web
        self._apply = apply
        self._clock = clock
        self.status = ReloadStatus(successful=True, last_success_s=clock())
        self._seen = self._fingerprints()
        self._applied = self._shapes()  # the watched files' top-level keys when last applied
        self._lock = asyncio.Lock()  # one reload at a time, whoever asks

    def _fingerprints(self) -> tuple[str, ...]:
        return tuple(fingerprint(p) for p in self.sources.watched)

    def _shapes(self) -> dict[str, frozenset[str] | None]:
        return {p: shape(p) for p in self.sources.watched}

    def _read(self) -> tuple[Config, WebConfig, dict[str, frozenset[str] | None]]:
        """Both files, validated; every problem of both in one ConfigError per file."""
        shapes = self._shapes()
        incomplete = incomplete_problems(self._applied, shapes)
        if incomplete:
            raise _Refused(incomplete)
        errors: list[ConfigError] = []
        config: Config | None = None
        web: WebConfig | None = None
        try:
            config = self.sources.load()
        except ConfigError as e:
            errors.append(e)
        try:
            web = self.sources.load_web()
        except ConfigError as e:
            errors.append(e)
        if errors:
            raise _Refused([f"{e.source}: {p}" for e in errors for p in e.problems])
        assert config is not None and web is not None
        problems = restart_problems(self.config, config, self.web, web)
        if problems:
            raise _Refused(problems)
        return config, web, shapes

    async def reload(self, trigger: str) -> tuple[bool, str]:
        """Read, validate and apply (or refuse) the configuration; (applied, what happened in one line)."""
        async with self._lock:
            seen = await asyncio.to_thread(self._fingerprints)
            try:
                # Off the event loop: the model's config.json is read and checked with the rest.
                config, web, shapes = await asyncio.to_thread(self._read)
                if (config, web) == (self.config, self.web):
                    changes = "unchanged: the configuration read equals the running one; nothing was applied"
                else:
                    changes = await self._apply(config, web)
            except _Refused as e:
                return self._refused(trigger, seen, e.problems)
            except Exception as e:  # e.g. the model file changed between its check and its use; nothing was swapped
                log.debug("reload failed trigger=%s", trigger, exc_info=True)
                return self._refused(trigger, seen, [f"could not be applied: {e}"])
            self.config, self.web, self._seen, self._applied = config, web, seen, shapes
            self.status = replace(
                self.status, successful=True, last_success_s=self._clock(), successes=self.status.successes + 1
            )
            log.info("configuration reloaded trigger=%s %s", trigger, changes)
            return True, changes

    def _refused(self, trigger: str, seen: tuple[str, ...], problems: list[str]) -> tuple[bool, str]:
        """Count and log a refusal (one line); the running configuration stays."""
        self._seen = seen  # not tried again by the watcher until the files change again
        self.status = replace(self.status, successful=False, failures=self.status.failures + 1)
        message = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}: " + "; ".join(problems)
        log.error("configuration reload refused trigger=%s, the running configuration stays: %s", trigger, message)
        return False, message

    async def poll(self) -> None:
        """Reload when a watched file's content differs from what was last read (applied or refused)."""
        if not self.sources.watched or self._lock.locked():
            return
        now = await asyncio.to_thread(self._fingerprints)
        if now != self._seen:
            changed = [p for p, a, b in zip(self.sources.watched, self._seen, now, strict=True) if a != b]
            await self.reload(f"file-changed:{','.join(changed)}")


class _Refused(Exception):
    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems
