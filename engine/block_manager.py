"""KV block pool: exact accounting of fixed-size blocks handed to sequences.

The pool has a physical ``capacity`` (what the cache tensor holds) and a logical ``budget`` (what
the presenter allows); the budget can shrink below what is in use, and then nothing new is handed
out until sequences give blocks back.
"""
from __future__ import annotations

from collections import deque

from engine.sequence import Sequence


class OutOfBlocks(Exception):
    pass


class BlockManager:
    def __init__(self, budget: int, block_size: int, capacity: int | None = None) -> None:
        self.block_size = block_size
        self.capacity = max(budget, capacity or 0)
        self.budget = budget
        self._free: deque[int] = deque(range(self.capacity))
        self._used: set[int] = set()

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @property
    def num_used(self) -> int:
        return len(self._used)

    @property
    def num_free(self) -> int:
        return max(0, min(self.budget - len(self._used), len(self._free)))

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) - len(seq.block_table) <= self.num_free

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Give ``seq`` enough blocks to hold ``num_tokens`` tokens."""
        need = self.blocks_for(num_tokens) - len(seq.block_table)
        if need <= 0:
            return
        if need > self.num_free:
            raise OutOfBlocks(f"sequence {seq.id} needs {need} blocks, {self.num_free} free")
        for _ in range(need):
            block = self._free.popleft()
            self._used.add(block)
            seq.block_table.append(block)

    def release(self, seq: Sequence) -> None:
        for block in seq.block_table:
            if block not in self._used:
                raise AssertionError(f"double free of block {block} by sequence {seq.id}")
            self._used.remove(block)
            self._free.append(block)
        seq.block_table = []

    def set_budget(self, budget: int) -> None:
        if budget > self.capacity:
            self._free.extend(range(self.capacity, budget))
            self.capacity = budget
        self.budget = budget

    def check(self) -> None:
        """Invariants the property tests lean on: every block is exactly one of used or free."""
        free = set(self._free)
        assert len(free) == len(self._free), "a block is free twice"
        assert not free & self._used, "a block is both free and used"
        assert len(free) + len(self._used) == self.capacity, "a block leaked"
