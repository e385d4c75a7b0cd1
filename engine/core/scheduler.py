"""Who runs this step, and how many tokens each computes: the three policies.

- static: a batch forms when ``max_slots`` requests wait (or the oldest waited ``fill_timeout_s``)
  and then runs until every member ends; ended members stay as dead slots, computed and holding KV.
- continuous: every step, ended sequences leave and waiting ones enter while a slot and KV are
  free; a new prompt is prefilled whole.
- chunked: as continuous under a per-step token budget; running decodes first, prefill chunks after.

Under every policy an admission first takes the full blocks its tokens share with the prefix cache
(``EngineConfig.prefix_cache``) and schedules only the rest; cached tokens cost no chunk budget.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.core.block_manager import BlockManager
from engine.core.config import EngineConfig
from engine.core.sequence import Sequence, Status


@dataclass(slots=True)
class ScheduledBatch:
    # (sequence, new tokens this step)
    items: list[tuple[Sequence, int]] = field(default_factory=list)
    dead: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # admitted request id -> tokens from the prefix cache
    cached: dict[int, int] = field(default_factory=dict)
    # (sequence, its block table as scheduled, tokens it will have computed): what ``on_computed``
    # registers once the step has finished; the table's identity tells a later re-admission apart.
    spans: list[tuple[Sequence, list[int], int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.items or self.dead)


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order; includes static dead slots
        self.batch_open = False  # static: a batch is in flight
        self._tick = 0
        # Prefix cache: keys of full blocks the last scheduled step computes (findable once it has
        # finished), and those of this step so far. A flowing admission whose next block is among
        # them waits a step and takes it from the cache instead of computing it a second time.
        self._computing: set[int] = set()
        self._pending: set[int] = set()

    # -- lifecycle -------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def release(self, seq: Sequence) -> None:
        """``seq`` stopped generating: leave now, or stay dead until the static batch closes."""
        if seq in self.waiting:
            self.waiting.remove(seq)
            return
        if self.config.policy == "static" and self.batch_open:
            seq.dead = True
            return
        self._drop(seq)

    def _drop(self, seq: Sequence) -> None:
        self.blocks.release(seq)
        self.running.remove(seq)
        seq.slot = None

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self._drop(seq)
        seq.num_cached = 0
        seq.status = Status.PREEMPTED
        seq.preemptions += 1
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)

    def on_policy_change(self, old: str, new: str) -> None:
        if new == "static":
            self.batch_open = bool(self.running)  # what runs now is the batch in flight
        elif old == "static":
            for seq in [s for s in self.running if s.dead]:
                self._drop(seq)
            self.batch_open = False

    def live(self) -> list[Sequence]:
        return [s for s in self.running if not s.dead]

    @staticmethod
    def _complete(seq: Sequence) -> bool:
        """Its last token is already being computed (async runner): nothing more to schedule."""
        return len(seq.output_ids) >= seq.params.max_new_tokens

    # -- one step --------------------------------------------------------------------------
    def schedule(self, now: float) -> ScheduledBatch:
        self._tick += 1
        if self.blocks.caching != self.config.prefix_cache:  # a live switch: off forgets every key
            self.blocks.set_caching(self.config.prefix_cache)
        batch = ScheduledBatch()
        self._pending = (
            {k for k in self._computing if k not in self.blocks._by_key}
            if self.blocks.caching
            else set()
        )
        if self.config.policy == "static":
            self._schedule_static(batch, now)
        else:
            budget = self.config.chunk_budget if self.config.policy == "chunked" else None
            self._schedule_flowing(batch, budget)
        for seq, n in batch.items:
            seq.computed_prompt_tokens += max(0, min(n, seq.prefill_end - seq.num_cached))
            batch.spans.append((seq, seq.block_table, seq.num_cached + n))
        if self.blocks.caching:
            self._computing = {
                k
                for seq, n in batch.items
                if n > 1
                for k in self.blocks.keys_ahead(seq, seq.block_keys, seq.num_cached + n)
            }
        return batch

    def on_computed(self, batch: ScheduledBatch) -> None:
        """``batch``'s step has finished: its sequences' full blocks are now real K/V of real
        tokens, so they become findable. Never earlier: under the async runner the newest token is
        a placeholder when the next step is scheduled, and a failed step never gets here."""
        if not self.blocks.caching:
            return
        for seq, table, upto in batch.spans:
            if seq.block_table is table:  # not released (or preempted and re-admitted) meanwhile
                self.blocks.register(seq, upto)

    def _grow_or_preempt(self, seq: Sequence, target: int, batch: ScheduledBatch) -> bool:
        """Make room for ``seq`` to hold ``target`` tokens, preempting the newest running
        sequences."""
        while not self.blocks.can_grow(seq, target):
            victims = [
                s for s in self.live() if s is not seq and s not in (i[0] for i in batch.items)
            ]
            victim = victims[-1] if victims else seq
            self._preempt(victim, batch)
            if victim is seq:
                return False
        self.blocks.grow(seq, target)
        return True

    def _admit_target(self, seq: Sequence, cached: int, first_chunk: int) -> int:
        if self.config.kv_layout == "reserved":
            return max(len(seq.prompt_ids) + seq.params.max_new_tokens, cached + first_chunk)
        return cached + first_chunk

    def _free_slot(self) -> int:
        taken = {s.slot for s in self.running}
        return next(i for i in range(len(self.running) + 1) if i not in taken)

    def _admit(self, batch: ScheduledBatch, chunk: int | None) -> bool:
        """Try to admit the head of the queue with ``chunk`` prefill tokens (None = all of them)."""
        seq = self.waiting[0]
        hits, keys = self.blocks.match(seq)
        if self.config.policy != "static" and self._pending:
            # Its next block is being computed by a step in flight or by this one: wait a step.
            ahead = self.blocks.keys_ahead(
                seq, keys, min(seq.num_tokens - 1, (len(keys) + 1) * self.blocks.block_size)
            )
            if ahead and ahead[0] in self._pending:
                return False
        cached = len(hits) * self.blocks.block_size
        pending = seq.num_tokens - cached
        n = pending if chunk is None else min(chunk, pending)
        target = self._admit_target(seq, cached, n)
        if not self.blocks.can_admit(hits, target):
            return False
        self.waiting.popleft()
        self.blocks.admit(seq, hits, keys, target)
        seq.num_cached = cached
        seq.cached_tokens += cached
        seq.prefill_end = seq.num_tokens
        batch.cached[seq.id] = cached
        if self.blocks.caching and self.config.policy != "static":
            self._pending.update(self.blocks.keys_ahead(seq, keys, cached + n))
        seq.slot = self._free_slot()
        seq.status = Status.RUNNING
        self.running.append(seq)
        batch.admitted.append(seq)
        batch.items.append((seq, n))
        return True

    def _schedule_flowing(self, batch: ScheduledBatch, budget: int | None) -> None:
        left = budget if budget is not None else 1 << 30
        # Running sequences first (decodes before prefill chunks), so admission never starves them;
        # the least recently served first, so a budget smaller than the decodes rotates among them.
        for seq in sorted(self.live(), key=lambda s: (s.pending > 1, s.last_served)):
            if seq not in self.running or left <= 0 or self._complete(seq):
                continue
            n = min(seq.pending, left)
            if self._grow_or_preempt(seq, seq.num_cached + n, batch):
                batch.items.append((seq, n))
                seq.last_served = self._tick
                left -= n
        if batch.preempted:
            return  # the pool is dry: admitting now would only preempt again
        while self.waiting and len(self.running) < self.config.max_slots and left > 0:
            if not self._admit(batch, left if budget is not None else None):
                break
            left -= batch.items[-1][1]

    def _schedule_static(self, batch: ScheduledBatch, now: float) -> None:
        if self.batch_open and not self.live():
            for seq in list(self.running):  # the whole batch ended: it closes, all KV comes back
                self._drop(seq)
            self.batch_open = False
        if not self.batch_open:
            ready = len(self.waiting) >= self.config.max_slots or (
                self.waiting and now - self.waiting[0].arrival >= self.config.fill_timeout_s
            )
            if not ready:
                return
            while (
                self.waiting
                and len(self.running) < self.config.max_slots
                and self._admit(batch, None)
            ):
                pass
            self.batch_open = bool(self.running)
            return
        for seq in self.live():
            if seq not in self.running or self._complete(seq):
                continue
            if self._grow_or_preempt(seq, seq.num_cached + seq.pending, batch):
                batch.items.append((seq, seq.pending))
        # Dead slots ride along with live work; a step of nothing but dead slots (async: every live
        # member's last token already in flight) would be a forward thrown away whole.
        batch.dead = [s for s in self.running if s.dead] if batch.items else []
