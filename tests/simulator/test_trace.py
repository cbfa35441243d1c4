"""Arrival traces: the three formats on real samples, every bad file named by its line, the replay knobs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.simulator import SimConfig, Simulator
from sidecar.simulator.simulation import peak_used_blocks, pool_for_peak
from sidecar.simulator.trace import TraceError, TracePlay, TraceWorkload, load_trace, parse_trace

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
CONVERSATION = TRACES / "mooncake-conversation-5min.jsonl"
SYNTHETIC = TRACES / "mooncake-synthetic-3min.jsonl"
AZURE = TRACES / "azure-code-2023-2min.csv"


def test_mooncake_conversation_sample_as_its_readme_says():
    trace = load_trace(str(CONVERSATION))
    first = json.loads(CONVERSATION.read_text().splitlines()[0])
    assert trace.format == "mooncake" and len(trace.requests) == 918
    assert (trace.requests[0].prompt_tokens, trace.requests[0].output_tokens) == (
        first["input_length"],
        first["output_length"],
    )
    last = json.loads(CONVERSATION.read_text().splitlines()[-1])
    assert trace.duration_s == pytest.approx(last["timestamp"] / 1000.0)  # milliseconds, from 0
    assert trace.duration_s < 300


def test_azure_csv_times_are_relative_seconds_from_the_first_request():
    trace = load_trace(str(AZURE))
    assert trace.format == "azure" and len(trace.requests) == 63
    # 2023-11-16 18:17:03.9799600 and 18:17:04.0319600: 0.052 s apart
    assert trace.requests[0].arrival_s == 0.0
    assert trace.requests[1].arrival_s == pytest.approx(0.052, abs=1e-6)
    assert (trace.requests[0].prompt_tokens, trace.requests[0].output_tokens) == (4808, 10)
    assert trace.duration_s < 120


def test_plain_csv_and_jsonl():
    csv_trace = parse_trace("arrival_s,prompt_tokens,output_tokens\n0.5,100,20\n1.5,200,30\n", "t.csv")
    jsonl_trace = parse_trace(
        '{"arrival_s": 0.5, "prompt_tokens": 100, "output_tokens": 20}\n'
        '{"arrival_s": 1.5, "prompt_tokens": 200, "output_tokens": 30}\n',
        "t.jsonl",
    )
    for t in (csv_trace, jsonl_trace):
        assert t.format == "plain"
        assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in t.requests] == [(0.0, 100, 20), (1.0, 200, 30)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "t: the file is empty"),
        ("\n\n", "t: the file is empty"),
        ("arrival_s,prompt_tokens,output_tokens\n", "t: a header but no request"),
        ("arrival_s,prompt,output_tokens\n0,1,1\n", "t:1: missing columns"),
        (
            "arrival_s,prompt_tokens,output_tokens\n0,1,1\n2,1,1\n1,1,1\n",
            "t:4: arrival 1 s is earlier than the line before",
        ),
        ("arrival_s,prompt_tokens,output_tokens\n0,1,1\n-1,1,1\n", "t:3: arrival_s '-1' is negative"),
        ("arrival_s,prompt_tokens,output_tokens\n0,-5,1\n", "t:2: prompt tokens '-5' is negative"),
        ("arrival_s,prompt_tokens,output_tokens\n0,1.5,1\n", "t:2: prompt tokens '1.5' is not a whole number"),
        ("arrival_s,prompt_tokens,output_tokens\n0,1,many\n", "t:2: output tokens 'many' is not a number"),
        ("arrival_s,prompt_tokens,output_tokens\n0,1,nan\n", "t:2: output tokens 'nan' is not a number"),
        ("arrival_s,prompt_tokens,output_tokens\n0,1\n", "t:2: 2 columns, the header has 3"),
        ('{"timestamp": 0, "input_length": 1}\n', "t:1: missing keys"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": 5,\n', "t:2: not a JSON object"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1}\n[1, 2, 3]\n', "t:2: not a JSON object"),
        (
            '{"timestamp": 9, "input_length": 1, "output_length": 1}\n{"timestamp": 3, "input_length": 1, '
            '"output_length": 1}\n',
            "t:2: arrival 0.003 s is earlier than the line before (0.009 s)",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", "t:2: TIMESTAMP 'yesterday' is not a date"),
        (
            '{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [0]}\n',
            "t:1: 1 hash_ids for 1000 prompt tokens; Mooncake gives one per 512-token block, 2 here",
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": "0"}\n',
            "t:1: hash_ids must be a list of integers",
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1.5]}\n',
            "t:1: hash_ids must be a list of integers",
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-3]}\n',
            "t:1: hash_ids holds a negative id",
        ),
    ],
)
def test_a_bad_trace_is_refused_naming_the_line(text, message):
    with pytest.raises(TraceError) as e:
        parse_trace(text, "t")
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_a_huge_trace_is_refused_before_it_is_replayed(tmp_path):
    with pytest.raises(TraceError, match=r"more than 100 requests \(cut the trace"):
        parse_trace(CONVERSATION.read_text(), "t", max_requests=100)
    with pytest.raises(TraceError, match="is 60,340 bytes, more than the 1KiB a trace file may hold"):
        load_trace(str(CONVERSATION), max_bytes=1024)
    with pytest.raises(TraceError, match="is a directory"):
        load_trace(str(tmp_path))


def test_speed_offset_and_loop():
    trace = parse_trace("arrival_s,prompt_tokens,output_tokens\n0,10,1\n10,10,1\n20,10,1\n", "t")
    w = TraceWorkload(trace, 8192, speed=2.0, offset_s=10.0, loop=True)
    times = []
    for _ in range(5):
        times.append(w.next_time())
        w.pop()
    # from 10 s in, twice as fast: 0, 5; then again one mean gap (10 s) after the last one, at half speed
    assert times == [0.0, 5.0, 10.0, 15.0, 20.0]
    once = TraceWorkload(trace, 8192)
    for _ in range(3):
        once.pop()
    assert once.next_time() == math.inf


def test_long_requests_are_cut_to_max_model_len_not_dropped():
    trace = parse_trace("arrival_s,prompt_tokens,output_tokens\n0,126195,2000\n1,10,0\n", "t")
    w = TraceWorkload(trace, 8192)
    a, b = w.pop(), w.pop()
    assert (a.prompt_tokens, a.output_tokens) == (8191, 1)
    assert (b.prompt_tokens, b.output_tokens) == (10, 1)


def test_the_simulator_serves_the_trace_arrivals():
    play = TracePlay(load_trace(str(SYNTHETIC)))
    config = SimConfig(max_model_len=131072, num_gpu_blocks_override=200_000)
    sim = Simulator(config, play.scenario(config), 0, play)
    sim.advance_to(60.0)
    arrived = sum(r.arrival_s <= 60.0 for r in play.trace.requests)
    assert sim.workload.sent == arrived > 100
    assert sim.preemptions == 0


def test_the_pool_knob_makes_the_peaks_reach_the_asked_usage():
    play = TracePlay(load_trace(str(CONVERSATION)))
    server = SimConfig(max_model_len=131072, max_num_batched_tokens=16384, step_seconds_per_token=2e-6)
    peak = peak_used_blocks(play, server)
    for usage in (0.8, 0.95):
        sized = pool_for_peak(play, server, usage)
        assert sized.usable_blocks == math.ceil(peak / usage)
        sim = Simulator(sized, play.scenario(sized), 0, play)
        top = 0.0
        while sim.now < play.duration_s:
            sim.advance(5.0)
            top = max(top, sim.usage())
        # what a scrape every 5 s sees; between two scrapes a peak can go higher (at 0.95: 3 preemptions)
        assert usage - 0.05 < top <= usage
    assert sim.preemptions < 10
    tight = pool_for_peak(play, server, 1.3)
    sim = Simulator(tight, play.scenario(tight), 0, play)
    sim.advance_to(play.duration_s)
    assert sim.preemptions > 0


def test_simulate_refuses_a_bad_trace_with_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n5,1,1\n4,1,1\n")
    assert main(["simulate", "--trace", str(bad), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"kv-sidecar simulate: --trace: {bad}:3: arrival 4 s is earlier than the line before (5 s); "
        "sort the trace by arrival time"
    ]
    assert main(["simulate", "--trace", str(AZURE), "--trace-speed", "0", "--port", "0"]) == 2
    assert "--trace-speed: must be > 0" in capsys.readouterr().err
    assert main(["simulate", "--trace-peak-usage", "0.9", "--port", "0"]) == 2
    assert "--trace-peak-usage: needs --trace FILE" in capsys.readouterr().err
