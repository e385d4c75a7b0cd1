"""KV memory: the pool's tokens over time by state (stored / shared / allocated but unused /
cached / free), beside a map of the block pool now, one cell per block, grouped by owner."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from app.charts.common import (
    KV_COLORS,
    KV_STATES,
    color_scale,
    dataset,
    spec,
    step_bins,
    step_scale,
    step_x,
    tooltip,
    window,
)
from engine.core.records import Record, StepRecord


def record_block_size(rec: StepRecord, default: int = 16) -> int:
    kv = rec["kv"]
    return kv["tokens_allocated"] // kv["blocks_used"] if kv["blocks_used"] else default


def kv_split(kv: Record, bs: int) -> tuple[float, float, float, float, float]:
    """One step's pool in tokens: stored, shared, allocated-unused, cached, free (summing to the
    budget). Shared blocks are carved out of the stored tokens, cached ones out of the free."""
    total = kv["blocks_total"] * bs
    alloc = kv["tokens_allocated"]
    stored = min(kv["tokens_stored"], alloc)
    shared = min((kv.get("blocks_shared") or 0) * bs, stored)
    free = max(0, total - alloc)
    cached = min((kv.get("blocks_cached") or 0) * bs, free)
    return stored - shared, shared, alloc - stored, cached, free - cached


def kv_series(
    steps: Sequence[StepRecord], bins: int = 300, block_size: int | None = None
) -> list[Record]:
    """KV tokens per step, split into ``KV_STATES`` (stored / shared / allocated-but-unused /
    cached / free); binned (mean, buckets aligned to step numbers) to at most ``bins`` points so a
    long buffer stays a few thousand rows."""
    rows: list[Record] = []
    if not steps:
        return rows
    bs = block_size or next(
        (record_block_size(r) for r in reversed(steps) if r["kv"]["blocks_used"]), 16
    )
    for chunk in step_bins(steps, bins):
        n = len(chunk)
        sums = [0.0] * len(KV_STATES)
        for r in chunk:
            for j, v in enumerate(kv_split(r["kv"], bs)):
                sums[j] += v
        for j, state in enumerate(KV_STATES):
            rows.append(
                {"step": chunk[0]["step"], "state": state, "tokens": sums[j] / n, "order": j}
            )
    return rows


def request_kv_tokens(steps: Sequence[StepRecord]) -> dict[int, int]:
    """Tokens each request running at the last step has computed since its (re)admission, summed
    from the step records (a preemption drops its KV, so it restarts from zero)."""
    held: dict[int, int] = {}
    for rec in steps:
        for rid in rec["preempted"]:
            held.pop(rid, None)
        for s in rec["slots"]:
            if s["request"] is not None and s["phase"] in ("prefill", "decode"):
                held[s["request"]] = held.get(s["request"], 0) + s["tokens"]
        for rid in rec["finished"]:
            if rec["policy"] != "static":
                held.pop(rid, None)
    last = steps[-1] if steps else None
    running = (
        {s["request"]: s["slot"] for s in last["slots"] if s["request"] is not None} if last else {}
    )
    return {rid: n for rid, n in held.items() if rid in running}


def _block_owners(steps: Sequence[StepRecord]) -> list[tuple[str, int | None, int | None]]:
    """Every block of the pool at the last step, as (state, request, slot), grouped by owner."""
    rec = steps[-1]
    kv = rec["kv"]
    bs = record_block_size(rec)
    total, used = kv["blocks_total"], kv["blocks_used"]
    shared = min(used, kv.get("blocks_shared") or 0)
    cached = min(max(0, total - used), kv.get("blocks_cached") or 0)
    slot_of = {s["request"]: s["slot"] for s in rec["slots"] if s["request"] is not None}
    owners: list[tuple[str, int | None, int | None]] = []
    left = used - shared
    for rid, ntok in sorted(
        request_kv_tokens(steps).items(), key=lambda kv_: slot_of.get(kv_[0], 0)
    ):
        nblk = min(left, math.ceil(ntok / bs))
        owners += [("stored", rid, slot_of.get(rid))] * nblk
        left -= nblk
    owners += [("shared", None, None)] * shared
    owners += [("allocated, unused", None, None)] * left
    owners += [("cached", None, None)] * cached
    owners += [("free", None, None)] * max(0, total - used - cached)
    return owners


def block_map(steps: Sequence[StepRecord], max_cells: int = 1024) -> list[Record]:
    """The pool at the last step, one cell per block (or per group of blocks in a big pool),
    grouped by owner: blocks that hold each running request's KV (estimated from its tokens
    in the buffer; exact when its admission is in the buffer), blocks shared by several
    sequences (prefix caching), then the rest of the allocated blocks (reserved ahead, not yet
    written), free blocks whose content is still cached, then free blocks. Counts match ``kv``."""
    if not steps:
        return []
    owners = _block_owners(steps)
    per = max(1, math.ceil(steps[-1]["kv"]["blocks_total"] / max_cells))
    cols = max(1, min(64, math.ceil(math.sqrt(len(owners) / per) * 2)))
    cells = []
    for i in range(0, len(owners), per):
        state, rid, slot = owners[i]
        c = i // per
        cells.append(
            {
                "cell": c,
                "row": c // cols,
                "col": c % cols,
                "state": state,
                "request": rid,
                "slot": slot,
                "blocks": min(per, len(owners) - i),
            }
        )
    return cells


def kv_rows(
    steps: Sequence[StepRecord], people: Iterable[int], last: int, with_overview: bool
) -> dict[str, list[Record]]:
    """The datasets the browser view feeds (``rows.js`` ``CHART_ROWS.kv``, held equal)."""
    win = window(steps, last)
    return {"kv_series": kv_series(win), "blocks": block_map(win)}


def kv_chart(
    steps: Sequence[StepRecord],
    last: int = 2000,
    height: int = 260,
    title: str = "KV memory",
    named: bool = False,
) -> dict:
    """KV tokens over time by state, beside the block map of the pool now. ``named``: datasets
    ``kv_series``, ``blocks``."""
    win = [] if named else window(steps, last)
    kv_color = {
        "field": "state",
        "type": "nominal",
        "scale": color_scale(KV_COLORS, KV_STATES),
        "title": "KV",
    }
    area = {
        "data": dataset(None if named else kv_series(win), "kv_series", named),
        "height": height,
        "width": 520,
        "title": {
            "text": title,
            "subtitle": "tokens stored · shared · allocated but unused · cached · free",
        },
        "mark": {"type": "area", "interpolate": "step-after"},
        "encoding": {
            "x": step_x(step_scale()),
            "y": {"field": "tokens", "type": "quantitative", "stack": "zero", "title": "KV tokens"},
            "color": kv_color,
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": tooltip("step:Q", "state:N", "tokens:Q"),
        },
    }
    grid = {
        "data": dataset(None if named else block_map(win), "blocks", named),
        "height": height,
        "width": height,
        "title": {"text": "block pool now", "subtitle": "one cell per block, grouped by owner"},
        "mark": {"type": "rect", "stroke": "white", "strokeWidth": 0.5},
        "encoding": {
            "x": {"field": "col", "type": "ordinal", "axis": None},
            "y": {"field": "row", "type": "ordinal", "axis": None},
            "color": kv_color,
            "tooltip": tooltip("state:N", "request:Q", "slot:Q", "blocks:Q"),
        },
    }
    return spec({"hconcat": [area, grid], "spacing": 24})
