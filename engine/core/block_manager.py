"""KV block pool: exact accounting of fixed-size blocks handed to sequences, with prefix caching.

The pool has a physical ``capacity`` (what the cache tensor holds) and a logical ``budget`` (what
the presenter allows); the budget can shrink below what is in use, and then nothing new is handed
out until sequences give blocks back.

Prefix caching (as vLLM's automatic prefix caching does it): a *full* block whose K/V have been
computed is registered under a key that hashes its tokens chained with the key of the block before
it, so a key names a whole prefix, not just 16 tokens. A new sequence whose tokens start with
registered blocks takes them (their reference count goes up) and computes only the rest. Every
block is in exactly one of three states:

- *referenced* (``ref > 0``): held by that many sequences; ``num_used`` counts these. A block
  with ``ref > 1`` is *shared*; only full, already-computed blocks are ever shared, and nothing
  writes them (new tokens always go past a sequence's cached prefix, into blocks of its own).
- *cached* (``ref == 0``, registered): free, but its content stays findable until the pool needs
  the room; reclaimed least recently used first.
- *plain free* (``ref == 0``, no content worth keeping): handed out before any cached block.

Cached blocks count as free in the budget: ``num_free`` includes them, because taking one back is
only bookkeeping. Eviction never takes a referenced block: it only ever pops the cached LRU list.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from engine.core.numbers import ceil_div
from engine.core.sequence import PLACEHOLDER, Sequence

ROOT = 0x5EED  # the "previous block" key of a sequence's first block


class OutOfBlocks(Exception):
    pass


def block_key(parent: int, tokens: tuple[int, ...]) -> int:
    """The key of a full block: its tokens chained with its parent's key (a whole-prefix hash)."""
    return hash((parent, tokens))


class BlockManager:
    def __init__(self, budget: int, block_size: int, capacity: int | None = None) -> None:
        self.block_size = block_size
        self.capacity = max(budget, capacity or 0)
        self.budget = budget
        self.caching = True  # the scheduler keeps this equal to EngineConfig.prefix_cache
        self._plain: deque[int] = deque(range(self.capacity))
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached free blocks, least recent first
        self._ref: list[int] = [0] * self.capacity
        self._used: set[int] = set()  # blocks with ref > 0
        self._key: dict[int, int] = {}  # registered block -> its key
        self._meta: dict[
            int, tuple[int, tuple[int, ...]]
        ] = {}  # block -> (parent key, tokens): exact check
        self._by_key: dict[int, int] = {}  # key -> the one block registered under it
        self.num_shared = 0  # blocks with ref > 1
        self.extra_refs = (
            0  # sum of (ref - 1) over shared blocks: tokens counted twice in sum(num_computed)
        )
        self.evictions = 0  # cached blocks reclaimed for new content, since the start
        self.hits = 0  # blocks taken from the cache at admission, since the start

    # -- counts ----------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    @property
    def num_used(self) -> int:
        return len(self._used)

    @property
    def num_free_findable(self) -> int:
        """Free blocks whose content is still findable (the prefix cache's LRU list)."""
        return len(self._lru)

    @property
    def _free(self) -> list[int]:
        """Every free block, plain ones first, then cached ones least recently used first."""
        return [*self._plain, *self._lru]

    @property
    def num_free(self) -> int:
        return max(0, min(self.budget - len(self._used), len(self._plain) + len(self._lru)))

    def ref(self, block: int) -> int:
        return self._ref[block]

    # -- reference counts -------------------------------------------------------------------
    def _inc(self, block: int) -> None:
        r = self._ref[block]
        if r == 0:
            self._lru.pop(block, None)  # a cached block comes back into use
            self._used.add(block)
        elif r == 1:
            self.num_shared += 1
        if r >= 1:
            self.extra_refs += 1
        self._ref[block] = r + 1

    def _dec(self, block: int) -> None:
        r = self._ref[block] - 1
        self._ref[block] = r
        if r >= 1:
            self.extra_refs -= 1
        if r == 1:
            self.num_shared -= 1
        elif r == 0:
            self._used.remove(block)
            if block in self._key:
                self._lru[block] = None  # most recently used end
            else:
                self._plain.append(block)

    def _take(self) -> int:
        """A free block for new content: a plain one, else the least recently used cached one."""
        if self._plain:
            block = self._plain.popleft()
        else:
            block, _ = self._lru.popitem(last=False)
            self._forget(block)
            self.evictions += 1
        self._inc(block)
        return block

    def _forget(self, block: int) -> None:
        key = self._key.pop(block, None)
        self._meta.pop(block, None)
        if key is not None and self._by_key.get(key) == block:
            del self._by_key[key]

    # -- growth and release -----------------------------------------------------------------
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
            seq.block_table.append(self._take())

    def release(self, seq: Sequence) -> None:
        """``seq`` gives its blocks back; registered ones stay findable (cached) until reclaimed.

        The tail goes back first, so it is reclaimed first: a sequence's first blocks are the ones
        other prompts are most likely to share."""
        for block in seq.block_table:
            if self._ref[block] <= 0:
                raise AssertionError(f"double free of block {block} by sequence {seq.id}")
        for block in reversed(seq.block_table):
            self._dec(block)
        seq.block_table = []
        seq.block_keys = []

    def set_budget(self, budget: int) -> None:
        if budget > self.capacity:
            self._plain.extend(range(self.capacity, budget))
            self._ref.extend([0] * (budget - self.capacity))
            self.capacity = budget
        self.budget = budget

    # -- prefix cache -----------------------------------------------------------------------
    def set_caching(self, on: bool) -> None:
        """Off: forget every key; cached blocks become plain free. Referenced blocks stay as they
        are (a shared block is only read, so it stays correct until its holders release it)."""
        self.caching = on
        if not on:
            self._key.clear()
            self._meta.clear()
            self._by_key.clear()
            self._plain.extend(self._lru)
            self._lru.clear()

    def match(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """The registered blocks ``seq``'s tokens start with, and their keys.

        At most ``num_tokens - 1`` tokens come from the cache: the last one is always computed, so
        the sequence samples its next token. Placeholders (async) end the search: only real tokens
        are hashed."""
        if not self.caching or not self._by_key:
            return [], []
        real = seq.num_tokens
        if seq.output_ids and PLACEHOLDER in seq.output_ids:
            real = len(seq.prompt_ids) + seq.output_ids.index(PLACEHOLDER)
        bs = self.block_size
        blocks: list[int] = []
        keys: list[int] = []
        parent = ROOT
        for i in range(min(real, seq.num_tokens - 1) // bs):
            tokens = tuple(seq.tokens(i * bs, (i + 1) * bs))
            key = block_key(parent, tokens)
            block = self._by_key.get(key)
            if block is None or self._meta[block] != (parent, tokens):  # miss, or a hash collision
                break
            blocks.append(block)
            keys.append(key)
            parent = key
        return blocks, keys

    def findable(self, key: int) -> bool:
        """A full block is registered under ``key``: an admission can take it from the cache."""
        return key in self._by_key

    def keys_ahead(self, seq: Sequence, keys: list[int], upto: int) -> list[int]:
        """Keys of ``seq``'s full blocks after the first ``len(keys)`` (whose keys those are), up to
        token ``upto``, stopping at a placeholder: the blocks a step is about to compute."""
        bs, out = self.block_size, []
        parent = keys[-1] if keys else ROOT
        for i in range(len(keys), upto // bs):
            tokens = tuple(seq.tokens(i * bs, (i + 1) * bs))
            if PLACEHOLDER in tokens:
                break
            parent = block_key(parent, tokens)
            out.append(parent)
        return out

    def can_admit(self, hits: list[int], num_tokens: int) -> bool:
        """Room for a sequence that takes ``hits`` from the cache and needs ``num_tokens`` slots.
        A hit that is cached (free) costs a block of the budget; one already referenced costs
        none."""
        new = max(0, self.blocks_for(num_tokens) - len(hits))
        taken = sum(self._ref[b] == 0 for b in hits)
        return new + taken <= self.num_free

    def admit(self, seq: Sequence, hits: list[int], keys: list[int], num_tokens: int) -> None:
        """Hand ``seq`` the ``hits`` (first, so growing cannot reclaim them), then new blocks."""
        if seq.block_table:
            raise AssertionError(f"sequence {seq.id} is admitted while holding blocks")
        if not self.can_admit(hits, num_tokens):
            raise OutOfBlocks(
                f"sequence {seq.id} does not fit: {len(hits)} cached blocks, {num_tokens} tokens"
            )
        for block in hits:
            self._inc(block)
        self.hits += len(hits)
        seq.block_table = list(hits)
        seq.block_keys = list(keys)
        self.grow(seq, num_tokens)

    def register(self, seq: Sequence, upto: int) -> None:
        """Make ``seq``'s full blocks below token ``upto`` findable. Call only once their K/V are
        computed (the step that wrote them has finished) and their tokens are real."""
        if not self.caching:
            return
        bs = self.block_size
        table, keys = seq.block_table, seq.block_keys
        for i in range(len(keys), min(upto // bs, len(table))):
            tokens = tuple(seq.tokens(i * bs, (i + 1) * bs))
            if PLACEHOLDER in tokens:
                return
            parent = keys[-1] if keys else ROOT
            key = block_key(parent, tokens)
            block = table[i]
            if key not in self._by_key and block not in self._key:
                self._by_key[key] = block
                self._key[block] = key
                self._meta[block] = (parent, tokens)
            # else: the same content is already registered under another block (two prompts with
            # the same prefix computed in the same step); this copy stays private, freed as plain.
            keys.append(key)

    # -- invariants ---------------------------------------------------------------------------
    def check(self, holders: list[Sequence] | None = None) -> None:
        """Invariants the property tests lean on: every block is exactly one of referenced, cached
        or plain free; a cached block is registered; keys and blocks map one to one; the shared
        counters add up; and, given every sequence holding blocks, each reference count equals the
        number of those sequences' tables that hold the block."""
        plain, lru = set(self._plain), set(self._lru)
        assert len(plain) == len(self._plain), "a block is free twice"
        assert not plain & lru, "a block is both plain free and cached"
        assert not (plain | lru) & self._used, "a block is both free and used"
        assert len(plain) + len(lru) + len(self._used) == self.capacity, "a block leaked"
        assert len(self._ref) == self.capacity
        assert self._used == {b for b, r in enumerate(self._ref) if r > 0}, (
            "used set != blocks with references"
        )
        assert all(r >= 0 for r in self._ref)
        assert lru <= set(self._key), "a cached block has no key"
        assert not plain & set(self._key), "a plain free block still has a key"
        assert all(self._by_key[k] == b for b, k in self._key.items()), (
            "keys and blocks do not map one to one"
        )
        assert len(self._by_key) == len(self._key) == len(self._meta)
        assert all(
            self._meta[b][0] is not None and len(self._meta[b][1]) == self.block_size
            for b in self._key
        )
        assert all(block_key(*self._meta[b]) == k for b, k in self._key.items()), (
            "a key does not match its tokens"
        )
        assert self.num_shared == sum(r > 1 for r in self._ref)
        assert self.extra_refs == sum(r - 1 for r in self._ref if r > 1)
        if not self.caching:
            assert not self._key and not lru, "prefix caching is off but blocks are registered"
        if holders is not None:
            count = [0] * self.capacity
            for seq in holders:
                assert len(seq.block_table) == len(set(seq.block_table)), (
                    f"sequence {seq.id} holds a block twice"
                )
                for b in seq.block_table:
                    count[b] += 1
            assert count == self._ref, (
                "a reference count differs from the sequences holding the block"
            )
