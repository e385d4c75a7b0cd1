"""Derived metrics, one implementation for the benchmarks, the server and the page."""
from __future__ import annotations

from typing import Any, Iterable

Record = dict[str, Any]


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]; NaN for no data."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return percentile(values, 50)


def inter_token_latencies(requests: Iterable[Record]) -> list[float]:
    gaps: list[float] = []
    for r in requests:
        t = r["token_times"]
        gaps.extend(b - a for a, b in zip(t, t[1:]))
    return gaps


def ttfts(requests: Iterable[Record]) -> list[float]:
    return [r["first_token"] - r["arrival"] for r in requests if r["first_token"] is not None]


def useful_tokens(requests: Iterable[Record]) -> int:
    return sum(len(r["token_times"]) for r in requests)


def lane_time(steps: Iterable[Record], lane: str) -> float:
    return sum(s["end"] - s["start"] for rec in steps for s in rec["spans"] if s["lane"] == lane)


def slot_counts(steps: Iterable[Record]) -> dict[str, int]:
    """Slot-steps by phase; a running request that computed nothing this step counts as idle."""
    counts = {"prefill": 0, "decode": 0, "dead": 0, "idle": 0}
    for rec in steps:
        for s in rec["slots"]:
            counts["idle" if s["phase"] in ("prefill", "decode") and not s["tokens"] else s["phase"]] += 1
    return counts


def kv_waste(steps: Iterable[Record]) -> float:
    """Allocated-but-unused KV over allocated KV, summed over steps (each step weighs the same)."""
    stored = allocated = 0
    for rec in steps:
        stored += rec["kv"]["tokens_stored"]
        allocated += rec["kv"]["tokens_allocated"]
    return 1 - stored / allocated if allocated else 0.0


def summarize(steps: list[Record], requests: list[Record]) -> dict[str, float]:
    """The headline numbers of a run: everything the tables and the page show."""
    wall = (steps[-1]["t_end"] - steps[0]["t_start"]) if steps else 0.0
    compute = lane_time(steps, "compute")
    # Host work outside the forward. From the CPU lanes, not from step windows: under the async
    # runner a step's window spans its neighbours' compute, so windows overlap.
    host = sum(lane_time(steps, lane) for lane in ("cpu_prepare", "h2d", "d2h", "cpu_update"))
    itl = inter_token_latencies(requests)
    ttft = ttfts(requests)
    slots = slot_counts(steps)
    occupied = slots["prefill"] + slots["decode"] + slots["dead"]
    total_slots = occupied + slots["idle"]
    tokens = useful_tokens(requests)
    return {
        "requests": len(requests),
        "steps": len(steps),
        "useful_tokens": tokens,
        "wall_s": wall,
        "throughput": tokens / wall if wall else 0.0,
        "ttft_p50": median(ttft),
        "ttft_p95": percentile(ttft, 95),
        "itl_p50": median(itl),
        "itl_p95": percentile(itl, 95),
        "itl_p99": percentile(itl, 99),
        "itl_max": max(itl) if itl else float("nan"),
        "slot_utilization": (slots["prefill"] + slots["decode"]) / total_slots if total_slots else 0.0,
        "dead_slot_fraction": slots["dead"] / occupied if occupied else 0.0,
        "kv_waste": kv_waste(steps),
        "busy_fraction": compute / wall if wall else 0.0,
        "overhead_fraction": host / wall if wall else 0.0,
        "peak_running": max((sum(s["phase"] != "idle" for s in r["slots"]) for r in steps), default=0),
        # Count-based: immune to how fast this machine happened to be during the run.
        "tokens_per_step": tokens / len(steps) if steps else 0.0,  # useful tokens / steps
        "slot_steps_per_token": occupied / tokens if tokens else float("nan"),  # occupied slot-steps / useful token
    }


def summarize_window(steps: list[Record], requests: list[Record], since: float) -> dict[str, float | None]:
    """``summarize`` over the steps that started at or after ``since`` and the tokens produced then
    (the server's live headline numbers); NaN (no data yet) becomes None so it is valid JSON."""
    recent = [r for r in steps if r["t_start"] >= since]
    clipped = []
    for r in requests:
        times = [t for t in r["token_times"] if t >= since]
        first = r["first_token"] if r["first_token"] is not None and r["first_token"] >= since else None
        if times or (r["finished"] is None or r["finished"] >= since):
            clipped.append({**r, "token_times": times, "first_token": first})
    summary = summarize(recent, clipped)
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in summary.items()}
