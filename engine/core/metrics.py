"""Derived metrics: every number a benchmark table, a lesson claim, the server or the page shows,
one definition each, its formula in its docstring. The benchmarks, the lessons, the server and
the page call these; nothing else derives a number from the records.

The records are the telemetry contract, typed (``engine/core/records.py``: ``StepRecord``,
``RequestRecord``). Times are seconds on the engine clock; ``*_ms`` are milliseconds.

Step time has three meanings, so three names (never one label for two numbers):

- ``step_window(r)`` = ``t_end - t_start``: one step's measured window (the page's per-step
  "step measured"). Under the async runner windows overlap (a step is prepared while the previous
  one computes).
- ``step_costs(steps)``: per step, ``min(window, t_end - previous t_end)``, what a step really
  costs under either runner; ``step_ms`` = 1000 x their median (the lessons' ``step_ms``).
- ``wall_per_step_ms`` = 1000 x (last ``t_end`` - first ``t_start``) / steps: the mean (the
  overlap benchmark's steady state).

Decode rate has two: ``decode_tput`` = the median over decode-only steps of decode tokens / step
cost (robust to one stalled step: the lessons' claim; over ``expected_s``: the cost model's
promise); ``decode_tokens_per_s`` = decode tokens / wall over all steps (the overlap benchmark's).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from engine.core.records import RequestRecord, SlotRecord, StepRecord

NAN = float("nan")


# -- order statistics --------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]; NaN for no data."""
    if not values:
        return NAN
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: list[float]) -> float:
    """``percentile(values, 50)``."""
    return percentile(values, 50)


def ratio(x: float, y: float) -> float:
    """``x / y``; NaN when ``y`` is 0 or NaN."""
    return x / y if y and y == y else NAN


# -- requests ----------------------------------------------------------------------------------
def inter_token_latencies(requests: Iterable[RequestRecord]) -> list[float]:
    """Every gap between two consecutive tokens of one request (``token_times[i+1] - [i]``)."""
    gaps: list[float] = []
    for r in requests:
        t = r["token_times"]
        gaps.extend(b - a for a, b in zip(t, t[1:], strict=False))
    return gaps


def ttfts(requests: Iterable[RequestRecord]) -> list[float]:
    """Time to first token per request that got one: ``first_token - arrival``."""
    return [r["first_token"] - r["arrival"] for r in requests if r["first_token"] is not None]


def useful_tokens(requests: Iterable[RequestRecord]) -> int:
    """Tokens streamed to clients: ``sum(len(token_times))``."""
    return sum(len(r["token_times"]) for r in requests)


# -- steps -------------------------------------------------------------------------------------
def lane_time(steps: Iterable[StepRecord], lane: str) -> float:
    """Seconds spent in ``lane``'s spans, summed over steps."""
    return sum(s["end"] - s["start"] for rec in steps for s in rec["spans"] if s["lane"] == lane)


def lane_durations(steps: Iterable[StepRecord], lane: str) -> list[float]:
    """Each span of ``lane``, in seconds."""
    return [s["end"] - s["start"] for rec in steps for s in rec["spans"] if s["lane"] == lane]


def slot_phase(slot: SlotRecord) -> str:
    """A slot's phase as counted: a running request that computed nothing this step is idle."""
    if slot["phase"] in ("prefill", "decode") and not slot["tokens"]:
        return "idle"
    return slot["phase"]


def slot_counts(steps: Iterable[StepRecord]) -> dict[str, int]:
    """Slot-steps by phase (``slot_phase``): prefill, decode, dead, idle."""
    counts = {"prefill": 0, "decode": 0, "dead": 0, "idle": 0}
    for rec in steps:
        for s in rec["slots"]:
            counts[slot_phase(s)] += 1
    return counts


def held_slot_steps(steps: Iterable[StepRecord]) -> int:
    """Slot-steps held by a request (any phase but ``idle``: dead slots and a running request
    waiting for its next prefill chunk count), what a batch pays for."""
    return sum(s["phase"] != "idle" for rec in steps for s in rec["slots"])


def running_count(rec: StepRecord) -> int:
    """Requests holding a slot in one step (any phase but ``idle``)."""
    return sum(s["phase"] != "idle" for s in rec["slots"])


def kv_waste(steps: Iterable[StepRecord]) -> float:
    """``1 - sum(tokens_stored) / sum(tokens_allocated)`` over steps (each step weighs the same)."""
    kvs = [rec["kv"] for rec in steps]
    stored = sum(k["tokens_stored"] for k in kvs)
    allocated = sum(k["tokens_allocated"] for k in kvs)
    return 1 - stored / allocated if allocated else 0.0


def step_window(rec: StepRecord) -> float:
    """One step's measured window: ``t_end - t_start``."""
    return rec["t_end"] - rec["t_start"]


def step_costs(steps: Sequence[StepRecord]) -> list[float]:
    """Per step, ``min(window, t_end - previous step's t_end)`` (the first step: its window).

    Under the async runner windows overlap (a step is prepared while the previous one computes),
    so the interval between step ends is what a step really costs; under sync the window is."""
    ends = [steps[0]["t_start"]] + [r["t_end"] for r in steps[:-1]] if steps else []
    return [
        min(r["t_end"] - r["t_start"], r["t_end"] - e) for r, e in zip(steps, ends, strict=False)
    ]


def step_ms(steps: Sequence[StepRecord]) -> float:
    """1000 x the median of ``step_costs``."""
    return 1000 * median(step_costs(steps))


def wall_per_step_ms(steps: Sequence[StepRecord]) -> float:
    """1000 x (last ``t_end`` - first ``t_start``) / number of steps: the mean step."""
    return 1000 * (steps[-1]["t_end"] - steps[0]["t_start"]) / len(steps)


def decode_only(steps: Iterable[StepRecord]) -> list[StepRecord]:
    """The steps that prefilled nothing (``tokens.prefill == 0``)."""
    return [r for r in steps if not r["tokens"]["prefill"]]


def decode_tput(steps: Sequence[StepRecord], expected: bool = False) -> float:
    """Median over decode-only steps of ``tokens.decode / step cost`` (tokens/s): one step stalled
    by another process must not decide it. ``expected``: each step's ``expected_s`` as its cost,
    what this machine's quiet step costs promise (NaN where the steps carry none)."""
    costs = [r.get("expected_s") or 0 for r in steps] if expected else step_costs(steps)
    pairs = zip(steps, costs, strict=False)
    return median([r["tokens"]["decode"] / d for r, d in pairs if not r["tokens"]["prefill"] and d])


def decode_tokens_per_s(steps: Sequence[StepRecord]) -> float:
    """``sum(tokens.decode)`` / (last ``t_end`` - first ``t_start``) (tokens/s)."""
    wall = steps[-1]["t_end"] - steps[0]["t_start"]
    return sum(r["tokens"]["decode"] for r in steps) / wall


# -- a run's headline numbers ------------------------------------------------------------------
def summarize(steps: list[StepRecord], requests: list[RequestRecord]) -> dict[str, float]:
    """The headline numbers of a run: everything the tables and the page show.

    ``throughput`` = useful tokens / wall; ``slot_utilization`` = computing slot-steps / all;
    ``dead_slot_fraction`` = dead / (computing + dead); ``busy_fraction`` = compute lane / wall;
    ``overhead_fraction`` = host lanes (prepare, h2d, d2h, update) / wall; ``peak_running`` = most
    slots held in one step; ``tokens_per_step`` = useful tokens / steps; ``slot_steps_per_token``
    = ``held_slot_steps`` / useful tokens (count-based); busy: per rank (``rank``, vLLM's DP)."""
    ranks = len({r.get("rank", 0) for r in steps}) or 1
    wall = (steps[-1]["t_end"] - steps[0]["t_start"]) * ranks if steps else 0.0
    compute = lane_time(steps, "compute")
    # Host work outside the forward. From the CPU lanes, not from step windows: under the async
    # runner a step's window spans its neighbours' compute, so windows overlap.
    host = sum(lane_time(steps, lane) for lane in ("cpu_prepare", "h2d", "d2h", "cpu_update"))
    itl = inter_token_latencies(requests)
    ttft = ttfts(requests)
    slots = slot_counts(steps)
    computing = slots["prefill"] + slots["decode"]
    occupied = computing + slots["dead"]
    total_slots = occupied + slots["idle"]
    tokens = useful_tokens(requests)
    return {
        "requests": len(requests),
        "steps": len(steps),
        "useful_tokens": tokens,
        "wall_s": wall / ranks,
        "throughput": tokens * ranks / wall if wall else 0.0,
        "ttft_p50": median(ttft),
        "ttft_p95": percentile(ttft, 95),
        "itl_p50": median(itl),
        "itl_p95": percentile(itl, 95),
        "itl_p99": percentile(itl, 99),
        "itl_max": max(itl) if itl else NAN,
        "slot_utilization": computing / total_slots if total_slots else 0.0,
        "dead_slot_fraction": slots["dead"] / occupied if occupied else 0.0,
        "kv_waste": kv_waste(steps),
        "busy_fraction": compute / wall if wall else 0.0,
        "overhead_fraction": host / wall if wall else 0.0,
        "peak_running": max((running_count(r) for r in steps), default=0),
        "tokens_per_step": tokens / len(steps) if steps else 0.0,
        "slot_steps_per_token": held_slot_steps(steps) / tokens if tokens else NAN,
    }


def summarize_window(
    steps: list[StepRecord], requests: list[RequestRecord], since: float
) -> dict[str, float | None]:
    """``summarize`` over the steps that started at or after ``since`` and the tokens produced then
    (the server's live headline numbers); NaN (no data yet) becomes None so it is valid JSON."""
    recent = [r for r in steps if r["t_start"] >= since]
    clipped = []
    for r in requests:
        times = [t for t in r["token_times"] if t >= since]
        first = r["first_token"]
        first = first if first is not None and first >= since else None
        if times or (r["finished"] is None or r["finished"] >= since):
            clipped.append(RequestRecord(**{**r, "token_times": times, "first_token": first}))
    summary = summarize(recent, clipped)
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in summary.items()}


# -- the lessons' detail -----------------------------------------------------------------------
def detail(
    steps: list[StepRecord], requests: list[RequestRecord], running: set[int], itl_target_s: float
) -> dict[str, float]:
    """The numbers the lessons claim beyond ``summarize``. ``running``: ids of the requests whose
    ITL a stall hurts (those present from the start when others arrive later).

    Step costs by what a step carried are medians (a max or p99 is not robust to a step another
    process stalled): decode-only, prefilling >= 100 tokens (an admitted long prompt), prefilling
    anything. A spike is a step costing over 3x the median step."""
    durations = step_costs(steps)
    step_med = median(durations)
    itl = inter_token_latencies(r for r in requests if r["id"] in running)
    carried = list(zip(steps, durations, strict=False))
    spikes = [r for r, d in carried if d > 3 * step_med]
    decode_med = median([d for r, d in carried if r["tokens"]["prefill"] == 0])
    admit_med = median([d for r, d in carried if r["tokens"]["prefill"] >= 100])
    prefill_med = median([d for r, d in carried if r["tokens"]["prefill"] > 0])
    itl_max = max(itl, default=NAN)
    cached = sum(r.get("cached_tokens", 0) for r in requests)
    with_prefill = sum(r["tokens"]["prefill"] > 0 for r in spikes)
    return {
        "step_ms": 1000 * step_med,
        "decode_tput": decode_tput(steps),
        "decode_tput_expected": decode_tput(steps, expected=True),
        "running_itl_p50": median(itl),
        "running_itl_p99": percentile(itl, 99),
        "running_itl_max": itl_max,
        "running_itl_max_over_p50": itl_max / median(itl),
        "running_itl_p99_over_p50": percentile(itl, 99) / median(itl),
        "spike_steps": len(spikes),
        # Do the slow steps line up with admissions (a prompt being prefilled) or with load?
        "spikes_with_prefill": with_prefill / len(spikes) if spikes else NAN,
        "long_prefill_step_over_decode": ratio(admit_med, decode_med),
        "prefill_step_over_decode": ratio(prefill_med, decode_med),
        "preemptions": sum(len(r["preempted"]) for r in steps),
        # Rows computed for prompts (a ragged step computes exactly the prompt tokens, no padding).
        "prefill_tokens": sum(r["tokens"]["prefill"] for r in steps),
        # The prompt tokens the engine had to compute (a prompt's cached prefix, if any, is not).
        "prompt_tokens": sum(r.get("computed_prompt_tokens", r["prompt_tokens"]) for r in requests),  # type: ignore[misc]  # .get with an Any default: mypy unions 2 overloads
        "kv_stored_peak": max((r["kv"]["tokens_stored"] for r in steps), default=0),
        # Prefix cache: prompt tokens taken from it, and their share of all prompt tokens.
        "cached_tokens": cached,
        "cache_hit_rate": ratio(cached, sum(r["prompt_tokens"] for r in requests)),
        **queueing(steps, requests, itl_target_s),
    }


def queueing(
    steps: list[StepRecord], requests: list[RequestRecord], itl_target_s: float
) -> dict[str, float]:
    """Little's law from two sides, and goodput under an ITL target (empty without data).

    ``in_system_mean``: requests in the engine (queued + holding a slot), read from each step record
    and weighted by the step's window, over the span from the first arrival to the last finish;
    ``littles_L`` = ``arrival_rate x mean_latency_s`` (L = lambda W) from the request records. They
    are measured independently and must agree. A request meets the target when every gap between
    two of its tokens is at most ``itl_target_s``; ``goodput_rps`` = those per second."""
    done = [r for r in requests if r["finished"] is not None]
    ends = [f for r in done if (f := r["finished"]) is not None]  # the same, narrowed for mypy
    if not steps or not done:
        return {}
    t0, t1 = min(r["arrival"] for r in done), max(ends)
    weighted = sum((r["queue_len"] + running_count(r)) * step_window(r) for r in steps)
    busy = sum(step_window(r) for r in steps)
    latency = [end - r["arrival"] for r, end in zip(done, ends, strict=True)]
    rate = len(done) / (t1 - t0) if t1 > t0 else NAN
    met = [r for r in done if max(inter_token_latencies([r]), default=0.0) <= itl_target_s]
    return {
        "mean_latency_s": sum(latency) / len(latency),
        "arrival_rate": rate,
        # The step records cover the time the engine had work; outside it nobody is in the system.
        "in_system_mean": weighted / (t1 - t0) if t1 > t0 and busy else NAN,
        "littles_L": rate * sum(latency) / len(latency),
        "slo_met_fraction": len(met) / len(done),
        "goodput_rps": len(met) / (t1 - t0) if t1 > t0 else NAN,
    }


# -- scoring a policy (engine/lab/score.py) ----------------------------------------------------
def jain_index(values: list[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 when every value is equal, 1/n when
    one takes everything; NaN for no values or all zero."""
    square = sum(x * x for x in values)
    return ratio(sum(values) ** 2, len(values) * square)


def meets_targets(request: RequestRecord, ttft_target_s: float, itl_p99_target_s: float) -> bool:
    """A finished request with TTFT <= ``ttft_target_s`` and the p99 of its own inter-token gaps
    <= ``itl_p99_target_s`` (a one-token answer has no gap)."""
    if request["finished"] is None or request["first_token"] is None:
        return False
    gaps = inter_token_latencies([request])
    itl = percentile(gaps, 99) if gaps else 0.0
    return ttfts([request])[0] <= ttft_target_s and itl <= itl_p99_target_s


def goodput(
    requests: list[RequestRecord], ttft_target_s: float, itl_p99_target_s: float
) -> dict[str, Any]:
    """Requests meeting ``meets_targets`` per second from the first arrival to the last finish
    (``goodput_rps``), their share, the same per client, Jain's index of the per-client goodput
    (``fairness``), and the goodput of all clients but the one that sent most (the class when one
    student floods)."""
    ends = [f for r in requests if (f := r["finished"]) is not None]
    if not ends:
        return {}
    span = max(ends) - min(r["arrival"] for r in requests)
    met, sent = dict[str, int](), dict[str, int]()
    for r in requests:
        client = r.get("client", "")
        sent[client] = sent.get(client, 0) + 1
        met[client] = met.get(client, 0) + meets_targets(r, ttft_target_s, itl_p99_target_s)
    per_client = {c: ratio(n, span) for c, n in sorted(met.items())}
    heaviest = max(sent, key=lambda c: (sent[c], c))
    return {
        "goodput_rps": ratio(sum(met.values()), span),
        "slo_met_fraction": sum(met.values()) / len(requests),
        "goodput_by_client": per_client,
        "fairness": jain_index(list(per_client.values())),
        "goodput_rps_without_heaviest": ratio(sum(met.values()) - met[heaviest], span),
    }
