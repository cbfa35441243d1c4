"""A derivation layer that fails costs only its own gauges, and is logged once."""

from __future__ import annotations

import logging

from fixtures import CPU_032

from sidecar import parse
from sidecar.config import load_config
from sidecar.engines import vllm
from sidecar.state import TargetState, ingest_success


class Broken:
    def __call__(self, key, history, now, derived):
        raise RuntimeError("a bug in a layer")


def test_a_broken_layer_keeps_the_base_gauges_and_is_logged_once(caplog):
    scrape = vllm.normalise(parse.samples((CPU_032 / "gqa-6mib_full-a.txt").read_text()))
    state = TargetState(target=load_config(None, env={}).targets[0], history_s=300)
    with caplog.at_level(logging.ERROR, logger="kv_sidecar.state"):
        for t in range(3):
            ingest_success(
                state,
                scrape,
                sample_time=t,
                wall_time=t,
                duration_s=0.0,
                window_s=300,
                watermark=0.9,
                extenders=(Broken(),),
            )
    key = ("models/tiny-llama-gqa-bf16", "0")
    assert state.snapshot.up and state.snapshot.derived[key].free_tokens == 384
    assert state.snapshot.extra[key] == {}
    assert sum("derivation layer Broken failed" in r.getMessage() for r in caplog.records) == 1
