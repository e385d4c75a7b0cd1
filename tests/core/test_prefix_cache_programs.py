"""Prefix caching under random programs on the tiny float64 engine (policies, layouts, runners,
chunking, preemption, live switches of ``prefix_cache`` and the KV budget): after every step the
pool's invariants hold with the running sequences as holders, the K/V of every registered block is
unchanged, every request ends exactly once, nothing leaks, and greedy outputs equal the reference.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from prefix_cache_helpers import BS, MAX_NEW, PROP, check_engine, prompt_st, reference

from engine.core.errors import FluxoError
from engine.core.sequence import Status

pytestmark = pytest.mark.usefixtures("one_torch_thread")

submit_st = st.tuples(st.just("submit"), prompt_st, st.integers(1, MAX_NEW))
ops_st = st.lists(
    st.one_of(
        submit_st,
        submit_st,
        st.tuples(st.just("step"), st.integers(1, 5)),
        st.tuples(st.just("step"), st.integers(1, 5)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(
            st.just("reconfigure"),
            st.fixed_dictionaries(
                {},
                optional={
                    "prefix_cache": st.booleans(),
                    "policy": st.sampled_from(("static", "continuous", "chunked")),
                    "runner": st.sampled_from(("sync", "async")),
                    "kv_layout": st.sampled_from(("paged", "reserved")),
                    "kv_blocks": st.integers(6, 20),
                    "chunk_budget": st.integers(1, 10),
                    "max_slots": st.integers(1, 4),
                },
            ),
        ),
    ),
    min_size=4,
    max_size=22,
)
# Requests first, a few steps (their prompts get computed and registered), then anything: later
# admissions then have something to hit.
program_st = st.tuples(st.lists(submit_st, min_size=1, max_size=4), st.integers(1, 4), ops_st).map(
    lambda t: [*t[0], ("step", t[1]), *t[2]]
)

start_st = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(("static", "continuous", "chunked")),
        "runner": st.sampled_from(("sync", "async")),
        "kv_layout": st.sampled_from(("paged", "reserved")),
        "kv_blocks": st.integers(7, 16),
        "chunk_budget": st.integers(1, 10),
        "max_slots": st.integers(1, 4),
        "prefix_cache": st.booleans(),
    }
)


@settings(max_examples=60, **PROP)
@given(start=start_st, ops=program_st)
def test_random_programs_share_blocks_safely(make_tiny_engine, tiny, start, ops):
    model, _ = tiny
    engine = make_tiny_engine(**start)
    handles, logs = _run_program(engine, ops)
    assert not engine.has_work()
    bm = engine.blocks
    assert bm.num_used == 0 and bm.num_shared == 0, "a block leaked"
    bm.check(holders=[])
    for h in handles:
        _check_request(engine, model, h, logs[h.id])
    _check_step_records(engine)


def _run_program(engine, ops: list[tuple]) -> tuple[list, dict[str, list]]:
    """``ops``, then steps until the engine is idle, checking the pool after every step; the
    handles of the requests it took and each one's events."""
    handles, logs, snap = [], {}, {}
    for op in ops:
        if op[0] == "submit":
            log: list = []
            try:
                h = engine.submit(
                    token_ids=op[1], max_new_tokens=op[2], ignore_eos=True, sink=log.append
                )
            except FluxoError as e:
                assert e.code == "kv_budget_too_small"
                continue
            handles.append(h)
            logs[h.id] = log
        elif op[0] == "step":
            for _ in range(op[1]):
                engine.step()
                snap = check_engine(engine, snap)
        elif op[0] == "cancel" and handles:
            engine.cancel(handles[op[1] % len(handles)].id)
        elif op[0] == "reconfigure":
            engine.reconfigure(**op[1])
    for _ in range(2000):
        if not engine.has_work():
            break
        engine.step()
        snap = check_engine(engine, snap)
    return handles, logs


def _check_request(engine, model, h, log: list) -> None:
    """Ended exactly once, greedy output equal to the reference, cached tokens recorded right."""
    terminal = [ev for ev in log if ev.kind != "token"]
    assert len(terminal) == 1 and log[-1] is terminal[0], "a request did not end exactly once"
    ref = reference(model, h.seq.prompt_ids)
    if h.seq.status is Status.FINISHED:
        assert h.token_ids == ref[: h.seq.params.max_new_tokens], (
            h.seq.prompt_ids,
            h.token_ids,
        )
    else:
        assert h.token_ids == ref[: len(h.token_ids)]
    rec = engine.telemetry.requests[h.id]
    assert rec["cached_tokens"] == h.seq.cached_tokens and rec["cached_tokens"] % BS == 0
    if h.seq.preemptions == 0 and h.seq.status is Status.FINISHED:
        assert rec["cached_tokens"] + rec["computed_prompt_tokens"] == len(h.seq.prompt_ids)


def _check_step_records(engine) -> None:
    """Every step record's prefix-cache fields agree with each other (and hypothesis hears which
    of the interesting things happened)."""
    steps = list(engine.telemetry.steps)
    for name, seen in (
        ("a prefix-cache hit", any(r["cached_tokens"] for r in steps)),
        ("a block shared by running sequences", any(r["kv"]["blocks_shared"] for r in steps)),
        ("a preemption", any(r["preempted"] for r in steps)),
        ("a cached block evicted", engine.blocks.evictions > 0),
    ):
        if seen:
            event(name)
    for rec in steps:
        assert rec["cached_tokens"] == sum(rec["admitted_cached"].values())
        assert set(rec["admitted_cached"]) == set(rec["admitted"])
        assert rec["kv"]["tokens_stored"] <= rec["kv"]["tokens_allocated"]
        assert rec["kv"]["blocks_shared"] <= rec["kv"]["blocks_used"]
