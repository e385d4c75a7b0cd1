"""Prefix caching, focused cases on the tiny float64 engine: a second request reuses a shared
prefix (every policy, layout and runner), concurrent holders share blocks and the records say so, a
re-admitted request hits its own blocks, the live switch, and the async runner.

The block pool alone: test_prefix_cache_pool.py; random programs: test_prefix_cache_programs.py.
"""

from __future__ import annotations

import pytest
from prefix_cache_helpers import BS, MAX_NEW, reference

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# a shared "document": 6 full blocks of 4, and 2 more tokens
DOC = [(3 * i + 11) % 250 for i in range(26)]


@pytest.mark.parametrize("runner", ["sync", "async"])
@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
@pytest.mark.parametrize("layout", ["paged", "reserved"])
def test_second_request_reuses_the_shared_prefix(make_tiny_engine, tiny, runner, policy, layout):
    model, _ = tiny
    engine = make_tiny_engine(runner=runner, policy=policy, kv_layout=layout)
    first = engine.submit(token_ids=DOC + [1, 2], max_new_tokens=6, ignore_eos=True)
    engine.run_until_idle()
    assert (
        engine.blocks.num_used == 0 and engine.blocks.num_free_findable >= 6
    )  # freed, still findable
    second = engine.submit(token_ids=DOC + [3, 4, 5], max_new_tokens=6, ignore_eos=True)
    engine.run_until_idle()
    assert first.token_ids == reference(model, DOC + [1, 2])[:6]
    assert second.token_ids == reference(model, DOC + [3, 4, 5])[:6]
    rec = engine.telemetry.requests[second.id]
    assert rec["cached_tokens"] == 24 and rec["computed_prompt_tokens"] == 29 - 24
    admit = next(r for r in engine.telemetry.steps if second.id in r["admitted"])
    assert admit["admitted_cached"] == {second.id: 24} and admit["cached_tokens"] == 24
    assert engine.telemetry.requests[first.id]["cached_tokens"] == 0


def test_concurrent_holders_share_blocks_and_records_say_so(make_tiny_engine, tiny):
    model, _ = tiny
    engine = make_tiny_engine(policy="continuous", max_slots=4)
    a = engine.submit(token_ids=DOC + [1], max_new_tokens=8, ignore_eos=True)
    engine.step()  # a's prompt is computed and registered
    b = engine.submit(token_ids=DOC + [2], max_new_tokens=8, ignore_eos=True)
    c = engine.submit(token_ids=DOC[:12] + [9, 9], max_new_tokens=8, ignore_eos=True)
    rec = engine.step()
    assert rec["admitted_cached"] == {b.id: 24, c.id: 12}
    assert rec["kv"]["blocks_shared"] == 6  # 3 blocks held by a, b, c; 3 more by a and b
    assert engine.blocks.extra_refs == 3 * 2 + 3
    # shared tokens count once: a holds 27 (26 + 1 output), b 25 + ..., but 6 shared blocks are one
    # copy
    kv = rec["kv"]
    assert kv["tokens_stored"] <= kv["tokens_allocated"] == kv["blocks_used"] * BS
    engine.run_until_idle()
    for h, p in ((a, DOC + [1]), (b, DOC + [2]), (c, DOC[:12] + [9, 9])):
        assert h.token_ids == reference(model, p)[:8]
    assert engine.blocks.num_shared == 0 and engine.blocks.num_free_findable > 0


def test_preempted_request_hits_its_own_blocks(make_tiny_engine, tiny):
    """A tight paged pool preempts the newest sequence; re-admitted, it finds its own blocks."""
    model, _ = tiny
    engine = make_tiny_engine(policy="continuous", kv_layout="paged", kv_blocks=12, max_slots=2)
    prompts = [[(17 * j + 5 * i) % 250 for j in range(17)] for i in range(2)]
    handles = [engine.submit(token_ids=p, max_new_tokens=MAX_NEW, ignore_eos=True) for p in prompts]
    engine.run_until_idle()
    victim = max(handles, key=lambda h: h.seq.preemptions)
    assert victim.seq.preemptions >= 1, "no preemption: the test would be meaningless"
    rec = engine.telemetry.requests[victim.id]
    assert rec["cached_tokens"] >= 16, rec  # its prompt's full blocks came back from the cache
    readmit = [r for r in engine.telemetry.steps if victim.id in r["admitted"]][1:]
    assert any(r["admitted_cached"][victim.id] >= 16 for r in readmit)
    for h, p in zip(handles, prompts, strict=False):
        assert h.token_ids == reference(model, p)
    engine.blocks.check(holders=[])


def test_live_switch_off_forgets_and_on_starts_again(make_tiny_engine, tiny):
    model, _ = tiny
    engine = make_tiny_engine(policy="chunked", chunk_budget=6)
    a = engine.submit(token_ids=DOC + [1], max_new_tokens=4, ignore_eos=True)
    engine.run_until_idle()
    # positions 0..29 computed (27 prompt + 3 outputs): 7 full blocks
    assert engine.blocks.num_free_findable == 7
    engine.reconfigure(prefix_cache=False)
    b = engine.submit(token_ids=DOC + [2], max_new_tokens=4, ignore_eos=True)
    engine.run_until_idle()
    assert (
        engine.blocks.num_free_findable == 0
        and engine.telemetry.requests[b.id]["cached_tokens"] == 0
    )
    assert any(
        ev["kind"] == "reconfigure" and ev["changes"] == {"prefix_cache": False}
        for r in engine.telemetry.steps
        for ev in r["events"]
    )
    engine.reconfigure(prefix_cache=True)
    c = engine.submit(token_ids=DOC + [3], max_new_tokens=4, ignore_eos=True)
    d_first = engine.step()  # c computes everything (nothing is cached) and registers it
    assert d_first["cached_tokens"] == 0
    engine.run_until_idle()
    d = engine.submit(token_ids=DOC + [4], max_new_tokens=4, ignore_eos=True)
    engine.run_until_idle()
    assert engine.telemetry.requests[d.id]["cached_tokens"] == 24
    for h, p in ((a, DOC + [1]), (b, DOC + [2]), (c, DOC + [3]), (d, DOC + [4])):
        assert h.token_ids == reference(model, p)[:4]


def test_switch_off_while_blocks_are_shared(make_tiny_engine, tiny):
    """Off while two sequences share blocks: they keep reading them, nothing is corrupted or
    leaked."""
    model, _ = tiny
    engine = make_tiny_engine(policy="continuous", runner="async")
    a = engine.submit(token_ids=DOC + [1], max_new_tokens=MAX_NEW, ignore_eos=True)
    for _ in range(3):
        engine.step()
    b = engine.submit(token_ids=DOC + [2], max_new_tokens=MAX_NEW, ignore_eos=True)
    for _ in range(3):
        engine.step()
    assert engine.blocks.num_shared == 6
    engine.reconfigure(prefix_cache=False, kv_blocks=40)
    engine.run_until_idle()
    assert a.token_ids == reference(model, DOC + [1]) and b.token_ids == reference(model, DOC + [2])
    assert engine.blocks.num_used == engine.blocks.num_free_findable == 0
    engine.blocks.check(holders=[])


def test_async_never_registers_a_placeholder(make_tiny_engine, tiny):
    """Under async the newest token is a placeholder when the next step is built; a block it ends
    must not become findable until the token is real."""
    model, _ = tiny
    engine = make_tiny_engine(policy="continuous", runner="async")
    prompt = DOC[:7]  # 7 prompt tokens: the 8th position (end of block 2) is the first output
    a = engine.submit(token_ids=prompt, max_new_tokens=MAX_NEW, ignore_eos=True)
    for _ in range(4):
        engine.step()
        for _b, (_parent, tokens) in engine.blocks._meta.items():
            assert -1 not in tokens
    engine.run_until_idle()
    out = reference(model, prompt)
    assert a.token_ids == out
    # the request's first output token is part of the second block: findable with its real value
    b = engine.submit(token_ids=prompt + out[:2], max_new_tokens=3, ignore_eos=True)
    engine.run_until_idle()
    assert engine.telemetry.requests[b.id]["cached_tokens"] == 8
    assert b.token_ids == reference(model, prompt + out[:2])[:3]


@pytest.mark.parametrize("runner", ["sync", "async"])
@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_same_prefix_arriving_together_is_computed_once(make_tiny_engine, tiny, runner, policy):
    """Three requests with one prefix queued at once: the first computes it, the others wait for it
    (a step, or the chunks it takes) and take it from the cache instead of computing it again."""
    model, _ = tiny
    engine = make_tiny_engine(runner=runner, policy=policy, chunk_budget=8)
    prompts = [DOC + [1 + i] for i in range(3)]
    handles = [engine.submit(token_ids=p, max_new_tokens=4, ignore_eos=True) for p in prompts]
    engine.run_until_idle()
    cached = [engine.telemetry.requests[h.id]["cached_tokens"] for h in handles]
    assert cached == [0, 24, 24], cached
    for h, p in zip(handles, prompts, strict=False):
        assert h.token_ids == reference(model, p)[:4]
