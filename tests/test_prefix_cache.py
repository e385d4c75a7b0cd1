"""Prefix caching: shared KV blocks, reference counts, LRU eviction, and unchanged greedy output.

1. The block pool alone, as a hypothesis state machine with content: sequences built from a few
   shared prefixes are admitted (taking cached blocks), compute, register, release, and the pool
   is squeezed and switched off; reference counts equal the tables holding each block, a block
   that is shared or registered is never written, a hit always holds the tokens asked for, and
   eviction only ever takes unreferenced blocks.
2. Random programs on the tiny float64 engine (policies, layouts, runners, chunking, preemption,
   live switches of ``prefix_cache`` and the KV budget): after every step the pool's invariants
   hold with the running sequences as holders, the K/V of every registered block is unchanged,
   every request ends exactly once, nothing leaks, and greedy outputs equal the reference.
3. Focused cases: a re-admitted request hits its own blocks, eviction is least recently used,
   the telemetry fields, the live switch, and the async runner.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.core.block_manager import BlockManager
from engine.core.errors import FluxoError
from engine.core.sequence import SamplingParams, Sequence, Status

BS = 4  # the tiny engine's block size (conftest)
MAX_NEW = 10
PROP = dict(
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
# A few prefixes many prompts start with (a system preamble, a shared document), in blocks of 4.
PREFIXES = (
    [7, 7, 7, 7, 1, 2, 3, 4, 9, 9, 9, 9],
    [200, 201, 202, 203, 204, 205, 206, 207],
    [5, 5, 5, 5],
)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny model gains nothing from intra-op threads; on a busy 2-core box they cost ~100x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def shared_prompt(prefix: int, cut: int, tail: list[int]) -> list[int]:
    return PREFIXES[prefix][:cut] + tail if cut or tail else PREFIXES[prefix][:1]


# Most prompts start with a shared prefix (whole blocks of it, or a cut inside one), some with none.
prompt_st = st.builds(
    shared_prompt,
    st.integers(0, len(PREFIXES) - 1),
    st.sampled_from((12, 12, 8, 6, 4, 0)),
    st.lists(st.integers(0, 255), max_size=6),
)


# --------------------------------------------------------------------------------------------------
# 1. The pool alone, with content
# --------------------------------------------------------------------------------------------------


class PrefixPoolMachine(RuleBasedStateMachine):
    """``content[b]`` is what block ``b`` holds (the tokens written there); a hit must hold exactly
    the tokens the sequence asked for, and nothing registered or shared is ever written."""

    @initialize(budget=st.integers(2, 14))
    def setup(self, budget: int) -> None:
        self.bm = BlockManager(budget, BS)
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.content: dict[int, tuple[int, ...]] = {}
        self.hit_blocks = 0

    @rule(prompt=prompt_st)
    def new_seq(self, prompt: list[int]) -> None:
        self.waiting.append(Sequence(prompt_ids=prompt, params=SamplingParams()))

    @precondition(lambda self: self.waiting)
    @rule(pick=st.integers(0, 100), extra=st.integers(0, 6))
    def admit(self, pick: int, extra: int) -> None:
        bm, seq = self.bm, self.waiting[pick % len(self.waiting)]
        hits, keys = bm.match(seq)
        assert len(hits) * BS <= seq.num_tokens - 1, "a whole sequence came from the cache"
        for i, b in enumerate(hits):
            assert self.content[b] == tuple(seq.tokens(i * BS, (i + 1) * BS)), (
                "a hit holds other tokens"
            )
        target = len(hits) * BS + 1 + extra
        refs = [bm.ref(b) for b in hits]
        if not bm.can_admit(hits, target):
            return
        bm.admit(seq, hits, keys, target)
        assert seq.block_table[: len(hits)] == hits
        assert [bm.ref(b) for b in hits] == [r + 1 for r in refs]
        seq.num_cached = len(hits) * BS
        self.hit_blocks += len(hits)
        self.waiting.remove(seq)
        self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 100), n=st.integers(1, 9))
    def compute(self, pick: int, n: int) -> None:
        """Write K/V for the next ``n`` tokens (growing as needed), then register: what a step
        does."""
        bm, seq = self.bm, self.running[pick % len(self.running)]
        if seq.num_cached >= seq.num_tokens:  # decoding: a new token arrives first
            seq.output_ids.append(300 + seq.num_tokens % 3)
        n = min(n, seq.num_tokens - seq.num_cached)
        if not bm.can_grow(seq, seq.num_cached + n):
            return
        bm.grow(seq, seq.num_cached + n)
        for pos in range(seq.num_cached, seq.num_cached + n):
            b = seq.block_table[pos // BS]
            assert bm.ref(b) == 1, "a shared block is being written"
            assert b not in bm._key, "a registered block is being written"
            self.content[b] = tuple(seq.tokens((pos // BS) * BS, pos + 1))
        seq.num_cached += n
        bm.register(seq, seq.num_cached)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 100), preempt=st.booleans())
    def release(self, pick: int, preempt: bool) -> None:
        bm, seq = self.bm, self.running.pop(pick % len(self.running))
        table = list(seq.block_table)
        bm.release(seq)
        for b in table:
            assert bm.ref(b) >= 0
        seq.num_cached = 0
        if preempt:  # back to the queue: a re-admission should find its own registered blocks
            self.waiting.append(seq)

    @rule(budget=st.integers(1, 16))
    def set_budget(self, budget: int) -> None:
        used = self.bm.num_used
        self.bm.set_budget(budget)
        assert self.bm.num_used == used

    @rule(on=st.booleans())
    def switch(self, on: bool) -> None:
        self.bm.set_caching(on)
        if not on:
            assert (
                self.bm.num_cached == 0
                and not self.bm.match(Sequence([1] * 9, SamplingParams()))[0]
            )

    @invariant()
    def pool_is_exact(self) -> None:
        bm = self.bm
        bm.check(holders=self.running)
        held = {b for s in self.running for b in s.block_table}
        assert held == bm._used, "referenced blocks != blocks held"
        assert not held & set(bm._lru), "a referenced block is on the eviction list"
        assert bm.num_free == max(0, min(bm.budget - bm.num_used, bm.capacity - bm.num_used))


PrefixPoolMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=50, **PROP)
test_prefix_pool_state_machine = PrefixPoolMachine.TestCase


def test_pool_evicts_least_recently_used_and_never_a_referenced_block():
    bm = BlockManager(4, BS)
    a = Sequence(prompt_ids=list(range(9)), params=SamplingParams())  # 2 full blocks + 1 token
    b = Sequence(prompt_ids=list(range(100, 109)), params=SamplingParams())
    for seq in (a, b):
        bm.admit(seq, [], [], 8)
        bm.register(seq, 8)
    a_blocks, b_blocks = list(a.block_table), list(b.block_table)
    bm.release(a)  # a's blocks are cached first: least recently used
    bm.release(b)
    assert bm.num_cached == 4 and bm.num_used == 0 and bm.num_free == 4
    # the tail of a sequence goes back first, so it is reclaimed first
    assert list(bm._lru) == [a_blocks[1], a_blocks[0], b_blocks[1], b_blocks[0]]
    # shares b's first block
    c = Sequence(prompt_ids=list(range(100, 107)), params=SamplingParams())
    hits, keys = bm.match(c)
    assert hits == [b_blocks[0]]
    bm.admit(c, hits, keys, 8)  # takes b's first block back, then one new: a's tail is evicted
    assert c.block_table == [b_blocks[0], a_blocks[1]] and bm.evictions == 1
    assert bm.match(Sequence(prompt_ids=list(range(9)), params=SamplingParams()))[0] == [
        a_blocks[0]
    ]
    d = Sequence(prompt_ids=[50] * 20, params=SamplingParams())
    # two free blocks are left (a's first, b's second): 3 do not fit
    assert not bm.can_admit([], 12)
    bm.admit(d, [], [], 8)
    assert set(d.block_table) == {a_blocks[0], b_blocks[1]} and bm.num_cached == 0
    assert bm.ref(b_blocks[0]) == 1  # the referenced block survived every eviction
    bm.check(holders=[c, d])


def test_pool_refuses_a_double_free_without_changing_state():
    bm = BlockManager(4, BS)
    a = Sequence(prompt_ids=list(range(9)), params=SamplingParams())
    bm.admit(a, [], [], 9)
    stale = Sequence(prompt_ids=[1], params=SamplingParams())
    stale.block_table = list(a.block_table)
    bm.release(a)
    with pytest.raises(AssertionError, match="double free"):
        bm.release(stale)
    bm.check(holders=[])


# --------------------------------------------------------------------------------------------------
# 2. The engine under random programs with shared prefixes
# --------------------------------------------------------------------------------------------------

_REF: dict[tuple[int, ...], list[int]] = {}


def reference(model, prompt: list[int]) -> list[int]:
    """Greedy continuation by transformers' own forward (tiny float64 model), MAX_NEW tokens."""
    key = tuple(prompt)
    if key not in _REF:
        ids = list(prompt)
        with torch.inference_mode():
            for _ in range(MAX_NEW):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        _REF[key] = ids[len(prompt) :]
    return _REF[key]


def registered_kv(engine) -> dict[int, tuple[int, torch.Tensor]]:
    """Key and K/V of every registered block, read once the step in flight (async) has landed."""
    engine.device_pool.submit(lambda: None).result()
    cache, bs = engine.runner.cache, engine.config.block_size
    return {
        b: (
            k,
            torch.cat(
                [cache.k[:, b * bs : (b + 1) * bs], cache.v[:, b * bs : (b + 1) * bs]]
            ).clone(),
        )
        for b, k in engine.blocks._key.items()
    }


def check_engine(engine, before: dict) -> dict:
    sch, bm = engine.scheduler, engine.blocks
    bm.check(holders=sch.running)
    for s in sch.waiting:
        assert s.block_table == [] and s.num_cached == 0
    for s in sch.running:  # a sequence's cached prefix lies in its own table
        assert len(s.block_table) * bm.block_size >= s.num_cached
    after = registered_kv(engine)
    for b, (key, kv) in after.items():
        if b in before and before[b][0] == key:
            assert torch.equal(before[b][1], kv), f"registered block {b} was written"
    return after


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
    assert not engine.has_work()
    bm = engine.blocks
    assert bm.num_used == 0 and bm.num_shared == 0, "a block leaked"
    bm.check(holders=[])
    for h in handles:
        log = logs[h.id]
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
    steps = list(engine.telemetry.steps)
    for name, seen in (
        ("a prefix-cache hit", any(r["cached_tokens"] for r in steps)),
        ("a block shared by running sequences", any(r["kv"]["blocks_shared"] for r in steps)),
        ("a preemption", any(r["preempted"] for r in steps)),
        ("a cached block evicted", bm.evictions > 0),
    ):
        if seen:
            event(name)
    for rec in steps:
        assert rec["cached_tokens"] == sum(rec["admitted_cached"].values())
        assert set(rec["admitted_cached"]) == set(rec["admitted"])
        assert rec["kv"]["tokens_stored"] <= rec["kv"]["tokens_allocated"]
        assert rec["kv"]["blocks_shared"] <= rec["kv"]["blocks_used"]


# --------------------------------------------------------------------------------------------------
# 3. Focused cases
# --------------------------------------------------------------------------------------------------

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
    assert engine.blocks.num_used == 0 and engine.blocks.num_cached >= 6  # freed, still findable
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
    assert engine.blocks.num_shared == 0 and engine.blocks.num_cached > 0


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
    assert engine.blocks.num_cached == 7
    engine.reconfigure(prefix_cache=False)
    b = engine.submit(token_ids=DOC + [2], max_new_tokens=4, ignore_eos=True)
    engine.run_until_idle()
    assert engine.blocks.num_cached == 0 and engine.telemetry.requests[b.id]["cached_tokens"] == 0
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
    assert engine.blocks.num_used == engine.blocks.num_cached == 0
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
