"""The KV block pool alone, as a hypothesis state machine: grow / release / set_budget keep exact
accounting (no block held twice, used + free = capacity, free = budget - used)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple, rule

from engine.core.block_manager import BlockManager, OutOfBlocks
from engine.core.sequence import SamplingParams, Sequence

EOS = 258
BLOCK_SIZE = 4
MAX_PROMPT = 20
MAX_NEW = 12
POLICIES = ("static", "continuous", "chunked")

PROP = dict(
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


# --------------------------------------------------------------------------------------------------
# 1. BlockManager alone
# --------------------------------------------------------------------------------------------------


def _fake_seq() -> Sequence:
    return Sequence(prompt_ids=[0], params=SamplingParams())


class BlockPoolMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    @initialize(
        target=seqs,
        budget=st.integers(1, 24),
        block_size=st.integers(1, 8),
        extra=st.one_of(st.none(), st.integers(0, 16)),
    )
    def setup(self, budget: int, block_size: int, extra: int | None):
        capacity = None if extra is None else budget + extra
        self.bm = BlockManager(budget, block_size, capacity)
        assert self.bm.capacity == max(budget, capacity or 0)
        assert self.bm.num_used == 0 and self.bm.num_free == budget
        # every sequence made (tables may be empty)
        self.held: list[Sequence] = [_fake_seq() for _ in range(3)]
        return multiple(*self.held)

    @rule(target=seqs)
    def new_seq(self) -> Sequence:
        seq = _fake_seq()
        self.held.append(seq)
        return seq

    @rule(seq=seqs, num_tokens=st.integers(0, 80))
    def grow(self, seq: Sequence, num_tokens: int) -> None:
        bm = self.bm
        need = bm.blocks_for(num_tokens) - len(seq.block_table)
        used, table = bm.num_used, list(seq.block_table)
        can = bm.can_grow(seq, num_tokens)
        assert can == (need <= bm.num_free)
        if can:
            bm.grow(seq, num_tokens)
            assert len(seq.block_table) == max(len(table), bm.blocks_for(num_tokens))
            assert seq.block_table[: len(table)] == table  # existing blocks are kept, in order
            if need > 0:
                assert bm.num_used == used + need
                assert bm.num_used <= bm.budget, "a grow went over the budget"
        else:
            with pytest.raises(OutOfBlocks):
                bm.grow(seq, num_tokens)
            assert seq.block_table == table and bm.num_used == used, "a failed grow changed state"

    @rule(seq=seqs)
    # a released sequence may grow again, as a preempted one does
    def release(self, seq: Sequence) -> None:
        bm = self.bm
        used, n, table = bm.num_used, len(seq.block_table), list(seq.block_table)
        bm.release(seq)
        assert seq.block_table == [] and bm.num_used == used - n
        # releasing the same sequence again is a no-op (its table is empty now) ...
        bm.release(seq)
        assert bm.num_used == used - n
        # ... but handing the same blocks back a second time is a double free, and is refused
        if table:
            stale = _fake_seq()
            stale.block_table = list(table)
            with pytest.raises(AssertionError, match="double free"):
                bm.release(stale)
            assert bm.num_used == used - n, "a refused double free changed state"

    @rule(budget=st.integers(1, 40))
    def set_budget(self, budget: int) -> None:
        bm = self.bm
        used, capacity = bm.num_used, bm.capacity
        bm.set_budget(budget)
        assert bm.budget == budget and bm.capacity == max(capacity, budget)
        assert bm.num_used == used  # shrinking never takes blocks away from holders
        if used >= budget:
            assert bm.num_free == 0
            probe = _fake_seq()
            assert not bm.can_grow(probe, 1)

    @invariant()
    def accounting(self) -> None:
        bm = self.bm
        bm.check()
        tables = [b for s in self.held for b in s.block_table]
        assert len(tables) == len(set(tables)), "a block is held by two sequences"
        assert set(tables) == bm._used
        assert bm.num_used + len(bm._free) == bm.capacity
        assert bm.num_free == max(0, bm.budget - bm.num_used)
        assert all(0 <= b < bm.capacity for b in tables)


BlockPoolMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, **PROP)
test_block_pool_state_machine = BlockPoolMachine.TestCase
