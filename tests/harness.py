"""An in-process sidecar scraping a FaultServer, with a wall clock the test steps."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from sidecar.config import load_config
from sidecar.daemon import Sidecar
from sidecar.layers import build_extenders

KEY = {"model_name": "models/tiny-llama-gqa-bf16", "engine": "0"}


class Clock:
    def __init__(self):
        self.now = 1_800_000_000.0

    def __call__(self):
        return self.now


class Harness:
    """A sidecar in-process against a FaultServer; the test steps the wall clock."""

    def __init__(self, server, flags=None, **target):
        self.server = server
        self.clock = Clock()
        self.config = load_config(
            None, env={}, flags={("scrape", "interval"): "5s", **(flags or {})}, flag_targets=[server.url]
        )
        if target:
            self.config = replace(self.config, targets=(replace(self.config.targets[0], **target),))
        self.sidecar = Sidecar(self.config, build_extenders(self.config), clock=self.clock)
        self.loop = asyncio.new_event_loop()
        self.name = self.config.targets[0].name

    def scrape(self, advance_s: float = 1.0):
        self.clock.now += advance_s
        self.loop.run_until_complete(self.sidecar.scrape_once(self.sidecar.states[0]))

    def value(self, name, **labels):
        if name.startswith("kvcache_sidecar"):
            labels = {"target": self.name, **labels}
        else:
            labels = {"target": self.name, **KEY, **labels}
        return self.sidecar.registry.get_sample_value(name, labels)

    def errors(self, reason):
        return self.value("kvcache_sidecar_scrape_errors_total", reason=reason)

    def close(self):
        self.loop.run_until_complete(self.sidecar.aclose())
        self.loop.close()
