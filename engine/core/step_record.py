"""One step on its way through prepare -> execute -> finish (``Work``), and what its telemetry
record says: the slots view, the KV view, the counts the cost model prices, the step record
itself (the contract: ``engine/core/records.py``).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import cast

import torch

from engine.core.block_manager import BlockManager
from engine.core.cost_model import CostModel, StepWork
from engine.core.llama import ForwardBatch
from engine.core.records import (
    Hook,
    KVRecord,
    Phase,
    Runner,
    SlotRecord,
    SpanRecord,
    StepRecord,
    TokenCounts,
)
from engine.core.scheduler import ScheduledBatch
from engine.core.sequence import Sequence


@dataclass(slots=True, eq=False)
class Work:
    """One step on its way through prepare -> execute -> finish."""

    batch: ScheduledBatch
    rows: list[Sequence | None]
    fb: ForwardBatch
    t_start: float
    policy: str = ""  # as scheduled: a switch applied while this step executes must not relabel it
    runner: str = ""
    slots: list[SlotRecord] = field(default_factory=list)
    kv: KVRecord = field(default_factory=lambda: cast(KVRecord, {}))  # launch: kv_view
    spans: list[SpanRecord] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    # (row, sequence, output index) of every token this step computes for a sequence
    outputs: list[tuple[int, Sequence, int]] = field(default_factory=list)
    future: Future | None = None
    tokens: torch.Tensor | None = None
    cost: StepWork | None = None  # what the cost model prices (engine/core/cost_model.py)


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
    work: Work, step: int, t_end: float, finished: list[int], queue_len: int, cost: CostModel
) -> StepRecord:
    """The step's record (the contract: ``engine/core/records.py``)."""
    tokens: TokenCounts = {"prefill": 0, "decode": 0, "dead": 0}
    for s in work.slots:
        if s["phase"] != "idle":
            tokens[s["phase"]] += s["tokens"]
    record: StepRecord = {
        "step": step,
        "t_start": work.t_start,
        "t_end": t_end,
        "policy": work.policy,
        "runner": cast(Runner, work.runner),  # EngineConfig checked it
        "slots": work.slots,
        "admitted": [s.id for s in work.batch.admitted],
        "finished": list(finished),
        "preempted": [s.id for s in work.batch.preempted],
        # Prefix cache: tokens each admission took from it (request id -> tokens), and their sum.
        "admitted_cached": dict(work.batch.prefix_hits),
        "cached_tokens": sum(work.batch.prefix_hits.values()),
        "queue_len": queue_len,
        "kv": work.kv,
        "tokens": tokens,
        "spans": work.spans,
        "events": work.events,
        # hooks a loaded policy answered itself (records.py), named by the guard
        "decided": cast(list[Hook], work.batch.decided),
        # The cost model's duration for this step's work on a quiet machine (None until it
        # has seen enough steps): measured >> expected with nothing admitted is the machine.
        "expected_s": None if work.cost is None else cost.expected(work.cost),
    }
    return record


def observe_cost(cost: CostModel, work: Work, pin: bool) -> None:
    """Teach the cost model this step's compute time (a failed step computed nothing to learn)."""
    compute = [s["end"] - s["start"] for s in work.spans if s["lane"] == "compute"]
    if work.cost is None or not compute:
        return
    host = sum(s["end"] - s["start"] for s in work.spans if s["lane"] != "compute")
    cost.observe(work.cost, compute[0], host, pin=pin)
