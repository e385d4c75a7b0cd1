"""Prefix caching, the block pool alone: a hypothesis state machine with content. Sequences built
from a few shared prefixes are admitted (taking cached blocks), compute, register, release, and the
pool is squeezed and switched off; reference counts equal the tables holding each block, a block
that is shared or registered is never written, a hit always holds the tokens asked for, and
eviction only ever takes unreferenced blocks, least recently used first.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from prefix_cache_helpers import BS, PROP, prompt_st

from engine.core.block_manager import BlockManager
from engine.core.sequence import SamplingParams, Sequence


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
        seq.num_computed = len(hits) * BS
        self.hit_blocks += len(hits)
        self.waiting.remove(seq)
        self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 100), n=st.integers(1, 9))
    def compute(self, pick: int, n: int) -> None:
        """Write K/V for the next ``n`` tokens (growing as needed), then register: what a step
        does."""
        bm, seq = self.bm, self.running[pick % len(self.running)]
        if seq.num_computed >= seq.num_tokens:  # decoding: a new token arrives first
            seq.output_ids.append(300 + seq.num_tokens % 3)
        n = min(n, seq.num_tokens - seq.num_computed)
        if not bm.can_grow(seq, seq.num_computed + n):
            return
        bm.grow(seq, seq.num_computed + n)
        for pos in range(seq.num_computed, seq.num_computed + n):
            b = seq.block_table[pos // BS]
            assert bm.ref(b) == 1, "a shared block is being written"
            assert b not in bm._key, "a registered block is being written"
            self.content[b] = tuple(seq.tokens((pos // BS) * BS, pos + 1))
        seq.num_computed += n
        bm.register(seq, seq.num_computed)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 100), preempt=st.booleans())
    def release(self, pick: int, preempt: bool) -> None:
        bm, seq = self.bm, self.running.pop(pick % len(self.running))
        table = list(seq.block_table)
        bm.release(seq)
        for b in table:
            assert bm.ref(b) >= 0
        seq.num_computed = 0
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
                self.bm.num_free_findable == 0
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
    assert bm.num_free_findable == 4 and bm.num_used == 0 and bm.num_free == 4
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
    assert set(d.block_table) == {a_blocks[0], b_blocks[1]} and bm.num_free_findable == 0
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
