"""Who runs this step, and how many tokens each computes: the mechanism every policy drives.

The decisions are a policy's (``engine/core/policy/``: the hooks, the view they read, the checks
on their answers); this module carries them out: slots, KV blocks, preemption by recompute, the
prefix cache. The built-ins, written with those hooks (``engine/core/policy/builtin.py``):

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

from engine.core import cost_model as costs
from engine.core.block_manager import BlockManager
from engine.core.config import EngineConfig
from engine.core.policy import registry
from engine.core.policy.base import Policy, own_hooks
from engine.core.policy.check import Guard, check_admit, check_budget, check_prefill, check_victim
from engine.core.policy.view import View, running_view, waiting_view
from engine.core.records import HOOKS
from engine.core.sequence import Sequence, Status

__all__ = ["HOOKS", "ScheduledBatch", "Scheduler", "ThisStep"]


@dataclass(slots=True)
class ScheduledBatch:
    # (sequence, new tokens this step)
    items: list[tuple[Sequence, int]] = field(default_factory=list)
    dead: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # admitted request id -> tokens from the prefix cache
    prefix_hits: dict[int, int] = field(default_factory=dict)
    # (sequence, its block table as scheduled, tokens it will have computed): what ``on_computed``
    # registers once the step has finished; the table's identity tells a later re-admission apart.
    spans: list[tuple[Sequence, list[int], int]] = field(default_factory=list)
    # the policy's refused decisions (``policy_error`` events for the step record)
    errors: list[dict] = field(default_factory=list)
    # the hooks a loaded policy answered itself this step (the step record's ``decided``)
    decided: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.items or self.dead)


@dataclass(slots=True)
class ThisStep:
    """One step's decisions in the making, handed from one part of ``schedule`` to the next."""

    now: float  # the engine's clock as the step is scheduled (the views' ``now``)
    guard: Guard  # asks the policy, checks its answers, keeps its refusals
    gang: bool  # the policy's ``batch``: admission waits for the batch to close, dead slots stay
    batch: ScheduledBatch  # what the step computes, built as the decisions are carried out
    # prefix-cache keys of full blocks the step in flight or this one computes (see Scheduler)
    in_flight: set[int]
    budget: int | None = None  # the policy's token budget; None: no limit
    left: int = 1 << 30  # tokens the budget still allows


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order; includes static dead slots
        self.batch_open = False  # a gang policy's (static's) batch is in flight
        self._tick = 0
        # Prefix cache: keys of full blocks the last scheduled step computes (findable once it has
        # finished). A flowing admission whose next block is among them, or among this step's
        # (``ThisStep.in_flight``), waits a step and takes it from the cache instead of computing
        # it a second time.
        self._computing: set[int] = set()
        self.cost_model: costs.CostModel | None = None  # the engine's, priced for the views
        # one instance per policy name (a policy may keep state), and the hooks it overrides
        self._policies: dict[str, tuple[Policy, frozenset[str]]] = {}

    def policy(self) -> tuple[Policy, frozenset[str]]:
        """The configured policy and the hooks it overrides (the others are ``Policy``'s)."""
        name = self.config.policy
        found = self._policies.get(name)
        if found is None:
            cls = registry.get(name)
            found = self._policies[name] = (cls(), own_hooks(cls))
        return found

    # -- lifecycle -------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def release(self, seq: Sequence) -> None:
        """``seq`` stopped generating: leave now, or stay dead until the static batch closes."""
        if seq in self.waiting:
            self.waiting.remove(seq)
            return
        if self.batch_open and self.policy()[0].batch:
            seq.dead = True
            return
        self._drop(seq)

    def _drop(self, seq: Sequence) -> None:
        self.blocks.release(seq)
        self.running.remove(seq)
        seq.slot = None

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self._drop(seq)
        seq.num_computed = 0
        seq.status = Status.PREEMPTED
        seq.preemptions += 1
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)

    def on_policy_change(self, old: str, new: str) -> None:
        if registry.get(new).batch:
            self.batch_open = bool(self.running)  # what runs now is the batch in flight
        elif registry.get(old).batch:
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
        """Every policy's step, its hooks asked in order (``engine/core/policy/base.py``): the
        budget, the running sequences, the queue. A gang policy's batch closes when its last live
        member has ended, and nobody is admitted while it is open."""
        self._tick += 1
        if self.blocks.caching != self.config.prefix_cache:  # a live switch: off forgets every key
            self.blocks.set_caching(self.config.prefix_cache)
        policy, own = self.policy()
        st = ThisStep(
            now, Guard(policy, own), policy.batch, ScheduledBatch(), self._keys_in_flight()
        )
        if st.gang and self.batch_open and not self.live():
            for seq in list(self.running):  # the whole batch ended: it closes, all KV comes back
                self._drop(seq)
            self.batch_open = False
        st.budget = self._ask(st, "token_budget", None, (), check_budget, ())
        st.left = st.budget if st.budget is not None else st.left
        self._serve_running(st)
        # after a preemption the pool is dry: admitting now would only preempt again
        if not st.batch.preempted and not (st.gang and self.batch_open):
            self._admit_waiting(st)
            self.batch_open = st.gang and bool(self.running)
        return self._close(st)

    def _keys_in_flight(self) -> set[int]:
        if not self.blocks.caching:
            return set()
        return {k for k in self._computing if not self.blocks.findable(k)}

    def _close(self, st: ThisStep) -> ScheduledBatch:
        """The step's batch as decided: its dead slots, the policy's refusals, the spans the
        prefix cache registers once it has been computed."""
        batch = st.batch
        # Dead slots ride along with live work; a step of nothing but dead slots (async: every live
        # member's last token already in flight) would be a forward thrown away whole.
        batch.dead = [s for s in self.running if s.dead] if batch.items else []
        batch.errors, batch.decided = st.guard.errors, st.guard.decided
        for seq, n in batch.items:
            seq.computed_prompt_tokens += max(0, min(n, seq.prefill_end - seq.num_computed))
            batch.spans.append((seq, seq.block_table, seq.num_computed + n))
        if self.blocks.caching:
            self._computing = {
                k
                for seq, n in batch.items
                if n > 1
                for k in self.blocks.keys_ahead(seq, seq.block_keys, seq.num_computed + n)
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

    # -- asking the policy ----------------------------------------------------------------
    def _view(self, now: float, tokens_left: int | None) -> View:
        cfg = self.config
        limits = (
            max(0, cfg.max_slots - len(self.running)),
            self.blocks.num_free,
            self.blocks.block_size,
            cfg.max_slots,
            cfg.chunk_budget,
            cfg.fill_timeout_s,
        )
        return View(
            now, tuple(self.waiting), self.live(), limits, tokens_left, self._price, self._itl
        )

    def _ask(self, st: ThisStep, hook: str, left: int | None, args: tuple, check, extra: tuple):
        return st.guard.call(hook, self._view(st.now, left), args, check, extra)

    def _price(self, tokens: int, rows: int, pairs: int) -> float | None:
        model = self.cost_model
        return None if model is None else model.predict_compute(costs.StepWork(tokens, rows, pairs))

    def _itl(self, factor: float) -> int | None:
        """``cost_model.itl_chunk_budget`` for the decodes running now and the longest prompt
        waiting or prefilling."""
        if self.cost_model is None:
            return None
        decoding = [s.num_tokens for s in self.live() if s.pending <= 1]
        prompts = [s.num_tokens for s in self.waiting] + [
            s.num_tokens for s in self.live() if s.pending > 1
        ]
        context = sum(decoding) // len(decoding) if decoding else 1
        prompt = max(prompts, default=context)
        return costs.itl_chunk_budget(
            self.cost_model, max(1, len(decoding)), context, prompt, factor, most=512
        )

    # -- carrying decisions out ------------------------------------------------------------
    def _serve_running(self, st: ThisStep) -> None:
        """Running sequences first (decodes before prefill chunks), so admission never starves
        them; the least recently served first, so a budget smaller than the decodes rotates
        among them. Each prefilling one computes what ``prefill_tokens`` says."""
        for seq in sorted(self.live(), key=lambda s: (s.pending > 1, s.last_served)):
            if seq not in self.running or st.left <= 0 or self._complete(seq):
                continue
            n = min(seq.pending, st.left)
            if seq.pending > 1:
                left = st.left if st.budget is not None else None
                args = (running_view(seq),)
                n = self._ask(st, "prefill_tokens", left, args, check_prefill, (seq.pending,))
            if self._grow_or_preempt(st, seq, seq.num_computed + n):
                st.batch.items.append((seq, n))
                seq.last_served = self._tick
                st.left -= n

    def _grow_or_preempt(self, st: ThisStep, seq: Sequence, target: int) -> bool:
        """Make room for ``seq`` to hold ``target`` tokens, preempting running sequences (the
        policy's ``preempt`` picks; by default the newest)."""
        while not self.blocks.can_grow(seq, target):
            served = [i[0] for i in st.batch.items]
            victims = [s for s in self.live() if s is not seq and s not in served]
            victim = seq
            if victims:
                ids = tuple(v.id for v in victims)
                args = (tuple(map(running_view, victims)),)
                pick = self._ask(st, "preempt", None, args, check_victim, (ids,))
                victim = victims[ids.index(pick)]
            self._preempt(victim, st.batch)
            if victim is seq:
                return False
        self.blocks.grow(seq, target)
        return True

    def _admit_waiting(self, st: ThisStep) -> None:
        """The queue, in the order ``admit`` names (at most the free slots), while a slot, KV and
        the budget allow: the first that does not fit stops admission for this step."""
        if not self.waiting or st.left <= 0 or len(self.running) >= self.config.max_slots:
            return  # nothing to admit, or nowhere to put it: the policy is not asked
        by_id = {s.id: s for s in self.waiting}
        left = st.left if st.budget is not None else None
        ids = self._ask(st, "admit", left, (), check_admit, (by_id.keys(),))
        for seq in [by_id[i] for i in ids]:
            if st.left <= 0 or len(self.running) >= self.config.max_slots:
                break
            if not self._admit(st, seq):
                break
            st.left -= st.batch.items[-1][1]

    def _admit_target(self, seq: Sequence, cached: int, first_chunk: int) -> int:
        if self.config.kv_layout == "reserved":
            return max(len(seq.prompt_ids) + seq.params.max_new_tokens, cached + first_chunk)
        return cached + first_chunk

    def _free_slot(self) -> int:
        taken = {s.slot for s in self.running}
        return next(i for i in range(len(self.running) + 1) if i not in taken)

    def _admit(self, st: ThisStep, seq: Sequence) -> bool:
        """Try to admit waiting ``seq``: the full blocks it shares with the prefix cache, then
        the prefill tokens ``prefill_tokens`` says (within the budget left)."""
        hits, keys = self.blocks.match(seq)
        if not st.gang and st.in_flight:
            # Its next block is being computed by a step in flight or by this one: wait a step.
            ahead = self.blocks.keys_ahead(
                seq, keys, min(seq.num_tokens - 1, (len(keys) + 1) * self.blocks.block_size)
            )
            if ahead and ahead[0] in st.in_flight:
                return False
        cached = len(hits) * self.blocks.block_size
        pending = seq.num_tokens - cached
        left = st.left if st.budget is not None else None
        n = pending if left is None else min(left, pending)
        if pending > 1:
            n = self._ask(
                st, "prefill_tokens", left, (waiting_view(seq),), check_prefill, (pending,)
            )
        target = self._admit_target(seq, cached, n)
        if not self.blocks.can_admit(hits, target):
            return False
        if self.waiting[0] is seq:
            self.waiting.popleft()
        else:
            self.waiting.remove(seq)
        self.blocks.admit(seq, hits, keys, target)
        seq.num_computed = cached
        seq.cached_tokens += cached
        seq.prefill_end = seq.num_tokens
        st.batch.prefix_hits[seq.id] = cached
        if self.blocks.caching and not st.gang:
            st.in_flight.update(self.blocks.keys_ahead(seq, keys, cached + n))
        seq.slot = self._free_slot()
        seq.status = Status.RUNNING
        self.running.append(seq)
        st.batch.admitted.append(seq)
        st.batch.items.append((seq, n))
        return True
