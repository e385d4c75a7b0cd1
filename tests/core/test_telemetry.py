"""The telemetry contract of the design, its exports, and the derived metrics."""

from __future__ import annotations

import json
from typing import get_args

from engine.core import metrics
from engine.core.records import OBSERVED_ONLY, KVRecord, Phase, RequestRecord, StepRecord

# The declared contract (engine/core/records.py): the records the engine emits must carry exactly
# these fields, so a field added on one side only fails here.
STEP_KEYS = set(StepRecord.__annotations__) - set(OBSERVED_ONLY)
REQUEST_KEYS = set(RequestRecord.__annotations__)
KV_KEYS = set(KVRecord.__annotations__)
PHASES = set(get_args(Phase))


def _run(engine):
    handles = [
        engine.submit(
            token_ids=[1 + i, 2, 3], max_new_tokens=3 + 4 * i, ignore_eos=True, client=f"c{i}"
        )
        for i in range(5)
    ]
    engine.run_until_idle()
    return handles


def test_step_and_request_records_follow_the_contract(make_tiny_engine):
    engine = make_tiny_engine(policy="static", max_slots=4)
    handles = _run(engine)
    steps = list(engine.telemetry.steps)
    assert steps and all(set(r) == STEP_KEYS for r in steps), STEP_KEYS ^ set(steps[0])
    json.dumps(steps)
    for r in steps:
        assert r["t_start"] <= r["t_end"]
        assert {s["phase"] for s in r["slots"]} <= PHASES
        assert set(r["kv"]) == KV_KEYS
        assert r["kv"]["tokens_stored"] <= r["kv"]["tokens_allocated"] == r["kv"]["blocks_used"] * 4
        lanes = [s["lane"] for s in r["spans"]]
        assert lanes[0] == "cpu_prepare" and "compute" in lanes and lanes[-1] == "cpu_update"
        # sync: each lane starts when the previous ends
        for a, b in zip(r["spans"], r["spans"][1:], strict=False):
            assert a["end"] <= b["start"] + 1e-9
    # static shows dead slots
    assert sum(s["phase"] == "dead" for r in steps for s in r["slots"]) > 0
    reqs = engine.telemetry.requests
    assert set(reqs) == {h.id for h in handles}
    for h in handles:
        rec = reqs[h.id]
        assert set(rec) == REQUEST_KEYS and rec["status"] == "finished"
        assert rec["arrival"] <= rec["admitted"] <= rec["first_token"] <= rec["finished"]
        assert len(rec["token_times"]) == len(h.token_ids)
    ended = [i for r in steps for i in r["finished"]]
    assert sorted(ended) == sorted(h.id for h in handles)


def test_exports(make_tiny_engine, tmp_path):
    engine = make_tiny_engine()
    _run(engine)
    engine.reconfigure(policy="chunked")
    engine.submit(token_ids=[5, 6], max_new_tokens=2, ignore_eos=True)
    engine.run_until_idle()
    path = tmp_path / "run.jsonl"
    engine.telemetry.to_jsonl(path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert {line["type"] for line in lines} == {"step", "request"}
    assert sum(line["type"] == "request" for line in lines) == 6
    trace = engine.telemetry.chrome_trace()
    json.dumps(trace)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert any(e["pid"] == 1 for e in spans) and any(
        e["pid"] == 2 and e["name"] == "decode" for e in spans
    )
    assert any(e["ph"] == "i" and e["name"] == "reconfigure" for e in trace["traceEvents"])


def test_metrics_on_known_records():
    slot = lambda phase: {"slot": 0, "request": 1, "phase": phase, "tokens": 1}  # noqa: E731
    steps = [
        {
            "t_start": 0.0,
            "t_end": 1.0,
            "slots": [slot("decode"), slot("dead")],
            "kv": {"tokens_stored": 30, "tokens_allocated": 40},
            "spans": [
                {"lane": "cpu_prepare", "start": 0.0, "end": 0.1},
                {"lane": "compute", "start": 0.1, "end": 0.9},
            ],
        },
        {
            "t_start": 1.0,
            "t_end": 2.0,
            "slots": [slot("decode"), slot("idle")],
            "kv": {"tokens_stored": 10, "tokens_allocated": 40},
            "spans": [{"lane": "compute", "start": 1.0, "end": 1.8}],
        },
    ]
    reqs = [
        {"arrival": 0.0, "first_token": 0.5, "token_times": [0.5, 1.0, 2.0]},
        {"arrival": 0.0, "first_token": 1.0, "token_times": [1.0, 1.5]},
    ]
    s = metrics.summarize(steps, reqs)
    assert s["useful_tokens"] == 5 and s["wall_s"] == 2.0 and s["throughput"] == 2.5
    assert s["itl_max"] == 1.0 and s["itl_p50"] == 0.5
    assert s["slot_utilization"] == 0.5 and s["dead_slot_fraction"] == 1 / 3
    assert s["kv_waste"] == 0.5
    assert abs(s["busy_fraction"] - 0.8) < 1e-12 and abs(s["overhead_fraction"] - 0.05) < 1e-12
    assert metrics.percentile([1, 2, 3, 4], 50) == 2.5 and metrics.percentile([7], 99) == 7


def test_bounded_telemetry_drops_oldest_ended_requests_first(tiny):
    from engine.core.config import EngineConfig
    from engine.core.engine import Engine

    model, tok = tiny
    engine = Engine(
        EngineConfig(model="tiny", dtype="float64", max_slots=2, kv_blocks=64, block_size=4),
        model=model,
        tokenizer=tok,
        max_telemetry_steps=5,
        max_telemetry_requests=3,
    )
    handles = [
        engine.submit(token_ids=[1 + i, 2], max_new_tokens=3, ignore_eos=True) for i in range(6)
    ]
    engine.run_until_idle()
    assert len(engine.telemetry.steps) == 5
    assert list(engine.telemetry.requests) == [h.id for h in handles[-3:]]
