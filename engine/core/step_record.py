"""What a step's telemetry record is made of (``StepTrace``) and the record itself: the slots
view, the KV view, the counts the cost model prices, the step record (the contract:
``engine/core/records.py``). Nothing here executes a step (``engine/core/execute.py`` does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from engine.core.cost_model import CostModel, StepWork
from engine.core.records import (
    Event,
    Hook,
    KVRecord,
    Phase,
    Runner,
    SlotRecord,
    SpanRecord,
    StepRecord,
    TokenCounts,
)

if TYPE_CHECKING:  # types only: what the views below read
    from engine.core.block_manager import BlockManager
    from engine.core.scheduler import ScheduledBatch
    from engine.core.sequence import Sequence


@dataclass(slots=True, eq=False)
class StepTrace:
    """The parts of one step's record, gathered from prepare to finish (the executing state is
    ``execute.InFlight``'s)."""

    t_start: float
    policy: str  # as scheduled: a switch applied while this step executes must not relabel it
    runner: str
    slots: list[SlotRecord]
    admitted: list[int]
    preempted: list[int]
    prefix_hits: dict[int, int]  # request id -> prompt tokens its admission took from the cache
    decided: list[str]  # hooks a loaded policy answered itself
    events: list[dict] = field(default_factory=list)  # switches applied before this step
    cost: StepWork | None = None  # what the cost model prices (engine/core/cost_model.py)
    kv: KVRecord = field(default_factory=lambda: cast(KVRecord, {}))  # at launch: kv_view
    spans: list[SpanRecord] = field(default_factory=list)


def slots_view(batch: ScheduledBatch, running: list[Sequence], max_slots: int) -> list[SlotRecord]:
    """Every slot of the step: the request holding it, its phase and the tokens it computes."""
    scheduled = {s.id: n for s, n in batch.items}
    by_slot = {s.slot: s for s in running}
    width = max([max_slots] + [k + 1 for k in by_slot if k is not None])
    slots: list[SlotRecord] = []
    for i in range(width):
        seq = by_slot.get(i)
        if seq is None:
            slots.append({"slot": i, "request": None, "phase": "idle", "tokens": 0})
            continue
        n = scheduled.get(seq.id, 0)
        phase: Phase
        if seq.dead:
            phase, n = "dead", 1
        elif n > 1 or seq.num_computed + max(n, 1) < seq.num_tokens or not seq.output_ids:
            phase = "prefill"
        else:
            phase = "decode"
        slots.append({"slot": i, "request": seq.id, "phase": phase, "tokens": n})
    return slots


def kv_view(blocks: BlockManager, running: list[Sequence], block_size: int) -> KVRecord:
    """The KV pool as the step leaves it (``engine/core/records.py``'s ``KVRecord``)."""
    return {
        "blocks_total": blocks.budget,
        "blocks_used": blocks.num_used,
        # A shared block is full and counted once per holder in num_computed: count it once.
        "tokens_stored": sum(s.num_computed for s in running) - blocks.extra_refs * block_size,
        "tokens_allocated": blocks.num_used * block_size,
        "blocks_shared": blocks.num_shared,  # referenced by more than one sequence
        "blocks_cached": blocks.num_free_findable,  # free, content still findable (counted as free)
    }


def step_work(batch: ScheduledBatch, rows: list) -> StepWork:
    """The counts the cost model prices, taken before the step advances ``num_computed``."""
    decode = sum(seq.num_computed + 1 for seq, n in batch.items if n == 1)
    decode += sum(s.num_computed + 1 for s in batch.dead)
    prefill = sum(n * (seq.num_computed + n) for seq, n in batch.items if n > 1)
    tokens = sum(n for _, n in batch.items) + len(batch.dead)
    return StepWork(tokens, len(rows), prefill + decode, decode)


def step_record(
    trace: StepTrace, step: int, t_end: float, finished: list[int], queue_len: int, cost: CostModel
) -> StepRecord:
    """The step's record (the contract: ``engine/core/records.py``)."""
    tokens: TokenCounts = {"prefill": 0, "decode": 0, "dead": 0}
    for s in trace.slots:
        if s["phase"] != "idle":
            tokens[s["phase"]] += s["tokens"]
    record: StepRecord = {
        "step": step,
        "t_start": trace.t_start,
        "t_end": t_end,
        "policy": trace.policy,
        "runner": cast(Runner, trace.runner),  # EngineConfig checked it
        "slots": trace.slots,
        "admitted": list(trace.admitted),
        "finished": list(finished),
        "preempted": list(trace.preempted),
        # Prefix cache: tokens each admission took from it (request id -> tokens), and their sum.
        "admitted_cached": dict(trace.prefix_hits),
        "cached_tokens": sum(trace.prefix_hits.values()),
        "queue_len": queue_len,
        "kv": trace.kv,
        "tokens": tokens,
        "spans": trace.spans,
        "events": cast(list[Event], trace.events),
        # hooks a loaded policy answered itself (records.py), named by the guard
        "decided": cast(list[Hook], trace.decided),
        # The cost model's duration for this step's work on a quiet machine (None until it
        # has seen enough steps): measured >> expected with nothing admitted is the machine.
        "expected_s": None if trace.cost is None else cost.expected(trace.cost),
    }
    return record


def observe_cost(cost: CostModel, trace: StepTrace, pin: bool) -> None:
    """Teach the cost model this step's compute time (a failed step computed nothing to learn)."""
    compute = [s["end"] - s["start"] for s in trace.spans if s["lane"] == "compute"]
    if trace.cost is None or not compute:
        return
    host = sum(s["end"] - s["start"] for s in trace.spans if s["lane"] != "compute")
    cost.observe(trace.cost, compute[0], host, pin=pin)
