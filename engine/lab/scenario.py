"""Lesson scenarios: a ``scenario.toml`` -> a seeded workload -> runs on fresh engines -> measured claims.

The same canonical workloads serve the lessons (``python -m engine.lesson N``, tests/lessons) and
the server's ``compare`` message, so the page replays exactly what a lesson measured.
A workload is a list of groups; each group is one kind of traffic (prompt set, count, arrival
pattern, output lengths). Scale < 1 shortens a run: a group shrinks its request count or its
output lengths, whichever keeps the lesson's effect visible (its ``scale`` field says which).
"""
from __future__ import annotations

import math
import random
import tomllib
from functools import partial
from pathlib import Path
from typing import Any, Callable

from engine.lab.replay import run
from engine.core.config import LIVE_FIELDS, EngineConfig
from engine.core.errors import InvalidConfig, UnknownMode
from engine.core.metrics import inter_token_latencies, median, percentile, summarize
from engine.workloads.prefix import document_prompt
from engine.core.requests import RequestHandle
from engine.workloads.canonical import CHAT_PROMPTS, WorkItem, lognormal_lengths, long_prompt, mixed_is_long

Spec = dict[str, Any]
Result = dict[str, Any]
LESSONS_DIR = Path(__file__).resolve().parents[2] / "lessons"
CONFIG_FIELDS = (*LIVE_FIELDS, "dtype")  # what a scenario may set; the rest stays at EngineConfig's defaults


def _group(**fields: Any) -> Spec:
    base = {"prompts": "chat", "requests": 8, "arrival": "burst", "lengths": "uniform", "median": 32,
            "sigma": 1.0, "max_tokens": 256, "seed": 0, "scale": "requests"}
    base.update(fields)
    return base


# Canonical workloads. Each lesson's scenario.toml restates its [workload] and a test keeps the two equal.
SPECS: dict[str, Spec] = {
    # Lesson 1: the same short chat requests at 1, 2, 4 and 8 slots.
    "sweep": {"engine": {"policy": "continuous", "max_slots": 8},
              "groups": [_group(requests=8, median=32, scale="lengths")]},
    # Lesson 2: a burst of chat requests with long-tailed forced lengths (seed 13: see the lesson's notes).
    "batching": {"engine": {"max_slots": 8, "fill_timeout_s": 0.0},
                 "groups": [_group(requests=48, lengths="lognormal", median=16, sigma=1.5, max_tokens=128, seed=13)]},
    # Lesson 2's control: the same burst with every answer the same length.
    "uniform": {"engine": {"max_slots": 8, "fill_timeout_s": 0.0},
                "groups": [_group(requests=24, median=32)]},
    # Lesson 3: six long decodes; meanwhile ~384-token prompts arrive once a second.
    "stall": {"engine": {"max_slots": 8, "chunk_budget": 24},
              "groups": [_group(requests=6, median=160, scale="lengths"),
                         _group(prompts="long", prompt_tokens=384, requests=4, arrival="periodic", start_s=0.5,
                                period_s=1.0, median=8)]},
    # Lesson 4: chat answers of unknown length (natural EOS, capped at 128) under a 40-block KV budget.
    "memory": {"engine": {"max_slots": 8, "kv_blocks": 40},
               "groups": [_group(requests=16, lengths="natural", max_tokens=128)]},
    # Lesson 5: a decode-heavy steady state, 8 slots, greedy so both runners must agree token for token.
    "overlap": {"engine": {"max_slots": 8},
                "groups": [_group(requests=8, median=96, scale="lengths")]},
    # Lesson 0: one request alone, a ~256-token prompt and a 32-token answer: prefill, then decode.
    "anatomy": {"engine": {"max_slots": 1},
                "groups": [_group(prompts="long", prompt_tokens=256, requests=1, median=32, scale="lengths")]},
    # Lesson 6: the same 16 requests, answer lengths drawn with growing spread (sigma 0 = all equal).
    **{f"spread-{sigma}": {"engine": {"max_slots": 8, "fill_timeout_s": 0.0},
                           "groups": [_group(requests=16, lengths="lognormal", median=16, sigma=sigma,
                                             max_tokens=128)]}
       for sigma in (0.0, 0.75, 1.5)},
    # Lesson 6: natural-length chat (cap 128) under one KV budget of 48 blocks (768 tokens), 16 slots:
    # static+reserved -> continuous+reserved -> continuous+paged.
    "budget": {"engine": {"max_slots": 16, "kv_blocks": 48, "fill_timeout_s": 0.0},
               "groups": [_group(requests=24, lengths="natural", max_tokens=128)]},
    # Lesson 7: Poisson arrivals of short chats (16 tokens) on 4 slots at 2, 5 and 10 requests/s.
    **{f"rate-{rate}": {"engine": {"max_slots": 4},
                        "groups": [_group(requests=24, arrival="poisson", rate=float(rate), median=16)]}
       for rate in (2, 5, 10)},
    # Lesson 8: eight prompts of very different lengths at once (the "mixed" set: ~25 % long
    # reports of ~320 tokens), 16 forced tokens each: padded batch vs ragged (packed) steps.
    "ragged": {"engine": {"max_slots": 8},
               "groups": [_group(prompts="mixed", prompt_tokens=320, requests=8, median=16, seed=2,
                                 scale="lengths")]},
    # Lesson 9: lesson 5's steady state with 15 ms of simulated host work in every step's prepare.
    "hostwork": {"engine": {"max_slots": 8, "host_work_ms": 15.0},
                 "groups": [_group(requests=8, median=96, scale="lengths")]},
    # Lesson 10: questions over one shared ~400-token document, and chats (shared preamble),
    # Poisson arrivals, 16 forced tokens each: prefix cache off vs on, and on with little KV.
    "prefix": {"engine": {"max_slots": 8},
               "groups": [_group(prompts="document", requests=12, arrival="poisson", rate=4.0, median=16, seed=1),
                          _group(requests=6, arrival="poisson", rate=2.0, median=16, seed=2)]},
}
# The latency target goodput is counted against: a request meets it when every gap between two of
# its tokens is at most this long (a chat reads smoothly at ~7 tokens/s and faster).
ITL_TARGET_S = 0.15


def _prompts(group: Spec, tok, n: int) -> list[str]:
    kind = group["prompts"]
    if kind not in ("chat", "long", "mixed", "document"):
        raise InvalidConfig(f"unknown prompt set {kind!r}; choose chat, long, mixed or document")
    if kind == "document":  # questions over one shared document (engine/workloads/prefix.py)
        return [document_prompt(i) for i in range(n)]
    chat = [CHAT_PROMPTS[i % len(CHAT_PROMPTS)] for i in range(n)]
    if kind == "chat":
        return chat
    if kind == "long":
        return [long_prompt(int(group.get("prompt_tokens", 384)), tok, i) for i in range(n)]
    rng = random.Random(group["seed"])  # "mixed": the live traffic's definition (engine.workloads)
    return [long_prompt(int(group.get("prompt_tokens", 384)), tok, i) if mixed_is_long(rng) else chat[i]
            for i in range(n)]


def _lengths(group: Spec, n: int, scale: float) -> list[int]:
    kind, hi = group["lengths"], int(group["max_tokens"])
    if kind == "lognormal":
        out = lognormal_lengths(n, group["median"], group["sigma"], 8, hi, group["seed"])
    elif kind == "uniform":
        out = [int(group["median"])] * n
    elif kind == "natural":  # a cap, not a length: the model stops at its end-of-turn token
        out = [hi] * n
    else:
        raise InvalidConfig(f"unknown length distribution {kind!r}; choose natural, lognormal or uniform")
    # Scaling lengths keeps the step-count ratios between policies, so the effect stays the same size.
    return [max(1, round(x * scale)) for x in out] if group["scale"] == "lengths" else out


def _arrivals(group: Spec, n: int) -> list[float]:
    kind = group["arrival"]
    if kind == "burst":
        return [0.0] * n
    if kind == "periodic":
        return [group["start_s"] + i * group["period_s"] for i in range(n)]
    if kind == "poisson":  # seeded exponential gaps, as the server's traffic generator draws them
        rng, t, out = random.Random(group["seed"] + 1), 0.0, []
        for _ in range(n):
            t += rng.expovariate(group["rate"])
            out.append(t)
        return out
    raise InvalidConfig(f"unknown arrival pattern {kind!r}; choose burst, periodic or poisson")


def build_workload(spec: Spec, tok, scale: float = 1.0) -> list[WorkItem]:
    """All groups' items, in arrival order within each group (a run sorts them by arrival)."""
    items: list[WorkItem] = []
    for group in spec["groups"]:
        n = group["requests"]
        if group["scale"] == "requests":  # the prefix of the same seeded draw: a shorter run, same traffic
            n = max(1, math.ceil(n * scale))
        items += [WorkItem(p, m, a) for p, m, a in
                  zip(_prompts(group, tok, n), _lengths(group, n, scale), _arrivals(group, n))]
    return items


def natural(spec: Spec) -> bool:
    """True when answers end at EOS; a workload mixing natural and forced lengths is refused."""
    kinds = {g["lengths"] == "natural" for g in spec["groups"]}
    if len(kinds) > 1:
        raise InvalidConfig("a workload's groups must all use natural lengths or all forced ones")
    return kinds == {True}


WORKLOADS: dict[str, Callable[[Any, float], list[WorkItem]]] = {
    name: partial(lambda spec, tok, scale=1.0: build_workload(spec, tok, scale), spec) for name, spec in SPECS.items()}


# -- one run -------------------------------------------------------------------------------------
def measure_peer(model, tok, spec: Spec, config: dict[str, Any], scale: float = 1.0, peer: str = "hf_static") -> Result:
    """The same workload through transformers' padded ``generate`` in static batches of ``max_slots``.

    Its padding is counted from the same tokenized prompts ``generate`` receives: every batch is
    left-padded to its longest prompt, so it computes ``len(batch) x width`` prompt rows.
    """
    from engine.lab import peer as peers  # transformers' serving paths; imported only when a lesson asks

    if peer != "hf_static":
        raise UnknownMode(f"unknown peer {peer!r}; choose hf_static")
    items = build_workload(spec, tok, scale)
    slots = int(config.get("max_slots", 8))
    res = peers.hf_static(model, tok, items, slots)
    ids = peers._prompt_ids(tok, sorted(items, key=lambda it: it.arrival_s))
    batches = [ids[b:b + slots] for b in range(0, len(ids), slots)]
    padded = sum(len(b) * max(map(len, b)) for b in batches)
    real = sum(map(len, ids))
    summary = {"throughput": res.tokens_per_s, "wall_s": res.wall_s, "useful_tokens": res.useful_tokens,
               "prefill_tokens": padded, "prompt_tokens": real, "padding_fraction": 1 - real / padded}
    return {"config": {"peer": peer, "max_slots": slots}, "summary": summary, "steps": [], "requests": [],
            "tokens": []}


def measure(model, tok, spec: Spec, config: dict[str, Any], scale: float = 1.0) -> Result:
    """Run ``spec`` on a fresh engine sharing ``model``'s weights; summary plus the lessons' extras."""
    items = build_workload(spec, tok, scale)
    handles: dict[int, RequestHandle] = {}
    device = next(model.parameters()).device.type  # the server's model may live on CUDA
    summary, engine = run(model, tok, items, ignore_eos=not natural(spec),
                          on_submit=lambda i, h: handles.__setitem__(i, h), **{"device": device, **config})
    steps, requests = list(engine.telemetry.steps), list(engine.telemetry.requests.values())
    summary.update(_extras(steps, requests, items, handles))
    tokens = [handles[i].token_ids for i in range(len(items))]
    return {"config": summary.pop("config"), "summary": summary, "steps": steps, "requests": requests, "tokens": tokens}


def _extras(steps: list[dict], requests: list[dict], items: list[WorkItem], handles: dict[int, RequestHandle]) -> Result:
    # A step's cost: its window, or the time since the previous step ended if shorter. Under the
    # async runner windows overlap (a step is prepared while the previous one computes), so the
    # interval between step ends is what a step really costs; under sync the window is.
    ends = [steps[0]["t_start"]] + [r["t_end"] for r in steps[:-1]] if steps else []
    durations = [min(r["t_end"] - r["t_start"], r["t_end"] - e) for r, e in zip(steps, ends)]
    step_med = median(durations)
    # Decode-only steps: one token per running sequence, no prefill spike. The median step's rate,
    # not a sum: on a shared machine one step stalled by another process must not decide the lesson.
    pure = [r["tokens"]["decode"] / d for r, d in zip(steps, durations) if r["tokens"]["prefill"] == 0 and d > 0]
    # "Running" requests: those present from t=0 when others arrive later (their ITL is what a stall hurts).
    later = any(it.arrival_s > 0 for it in items)
    ids = {handles[i].id for i, it in enumerate(items) if not later or it.arrival_s == 0}
    itl = inter_token_latencies(r for r in requests if r["id"] in ids)
    spikes = [r for r, d in zip(steps, durations) if d > 3 * step_med]
    # Step cost by what a step carried, as medians of decode-only steps: robust to a step that
    # another process on a shared CPU happened to stall, which a max or a p99 is not.
    decode_med = median([d for r, d in zip(steps, durations) if r["tokens"]["prefill"] == 0])
    admit_med = median([d for r, d in zip(steps, durations) if r["tokens"]["prefill"] >= 100])
    prefill_med = median([d for r, d in zip(steps, durations) if r["tokens"]["prefill"] > 0])
    occupied = sum(s["phase"] != "idle" for r in steps for s in r["slots"])
    tokens = sum(len(r["token_times"]) for r in requests)
    return {
        "step_ms": 1000 * step_med,
        "decode_tput": median(pure),
        "tokens_per_step": tokens / len(steps) if steps else 0.0,
        "running_itl_p50": median(itl), "running_itl_p99": percentile(itl, 99),
        "running_itl_max": max(itl, default=float("nan")),
        "running_itl_max_over_p50": max(itl, default=float("nan")) / median(itl),
        "running_itl_p99_over_p50": percentile(itl, 99) / median(itl),
        "spike_steps": len(spikes),
        # Do the slow steps line up with admissions (a prompt being prefilled) or with load?
        "spikes_with_prefill": sum(r["tokens"]["prefill"] > 0 for r in spikes) / len(spikes) if spikes else float("nan"),
        # A step that prefilled a long prompt (>= 100 tokens) against a plain decode step.
        "long_prefill_step_over_decode": _ratio(admit_med, decode_med),
        "prefill_step_over_decode": _ratio(prefill_med, decode_med),
        "slot_steps_per_token": occupied / tokens if tokens else float("nan"),
        "preemptions": sum(len(r["preempted"]) for r in steps),
        # Rows computed for prompts (a ragged step computes exactly the prompt tokens, no padding).
        "prefill_tokens": sum(r["tokens"]["prefill"] for r in steps),
        # The prompt tokens the engine had to compute (a prompt's cached prefix, if any, is not).
        "prompt_tokens": sum(r.get("computed_prompt_tokens", r["prompt_tokens"]) for r in requests),
        "kv_stored_peak": max((r["kv"]["tokens_stored"] for r in steps), default=0),
        # Prefix cache: prompt tokens taken from it, and their share of all prompt tokens.
        "cached_tokens": sum(r.get("cached_tokens", 0) for r in requests),
        "cache_hit_rate": _ratio(sum(r.get("cached_tokens", 0) for r in requests),
                                 sum(r["prompt_tokens"] for r in requests)),
        **_queueing(steps, requests),
    }


def _queueing(steps: list[dict], requests: list[dict]) -> Result:
    """Little's law from two sides, and goodput under the ITL target.

    ``in_system_mean``: requests in the engine (queued + in a slot), read from each step record and
    weighted by the step's time; ``arrival_rate x mean_latency``: the same number by Little's law
    (L = lambda W) from the request records. They are measured independently and must agree.
    """
    done = [r for r in requests if r["finished"] is not None]
    if not steps or not done:
        return {}
    t0, t1 = min(r["arrival"] for r in done), max(r["finished"] for r in done)
    weighted = sum((r["queue_len"] + sum(s["phase"] != "idle" for s in r["slots"])) * (r["t_end"] - r["t_start"])
                   for r in steps)
    busy = sum(r["t_end"] - r["t_start"] for r in steps)
    latency = [r["finished"] - r["arrival"] for r in done]
    rate = len(done) / (t1 - t0) if t1 > t0 else float("nan")
    met = [r for r in done if max((b - a for a, b in zip(r["token_times"], r["token_times"][1:])), default=0.0)
           <= ITL_TARGET_S]
    return {
        "mean_latency_s": sum(latency) / len(latency),
        "arrival_rate": rate,
        # The step records cover the time the engine had work; outside it nobody is in the system.
        "in_system_mean": weighted / (t1 - t0) if t1 > t0 and busy else float("nan"),
        "littles_L": rate * sum(latency) / len(latency),
        "slo_met_fraction": len(met) / len(done),
        "goodput_rps": len(met) / (t1 - t0) if t1 > t0 else float("nan"),
    }


def engine_config(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Merge a base config and overrides, allowing only live fields and dtype; validated now."""
    merged = {**base, **overrides}
    unknown = set(merged) - set(CONFIG_FIELDS)
    if unknown:
        raise InvalidConfig(f"not a scenario config field: {', '.join(sorted(unknown))}; use {', '.join(CONFIG_FIELDS)}")
    EngineConfig(**merged)  # raises a coded FluxoError on a bad value
    return merged


# -- compare: the server's `compare` message -----------------------------------------------------
RATIO_KEYS = ("throughput", "ttft_p50", "itl_p50", "itl_p99", "itl_max", "running_itl_max", "running_itl_p99",
              "peak_running", "decode_tput", "tokens_per_step", "slot_steps_per_token")


def compare(model, tok, workload: str, a: dict[str, Any], b: dict[str, Any], scale: float = 1.0) -> Result:
    """Replay one canonical workload under configs ``a`` and ``b`` (fresh engines, same weights)."""
    if workload not in SPECS:
        raise UnknownMode(f"unknown workload {workload!r}; choose one of {', '.join(SPECS)}")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not 0 < scale <= 1:
        raise InvalidConfig(f"scale must be in (0, 1], got {scale!r}")
    spec = SPECS[workload]
    configs = {k: engine_config(spec["engine"], v) for k, v in (("a", a), ("b", b))}  # both valid before either runs
    out: Result = {"workload": workload}
    for key, config in configs.items():
        res = measure(model, tok, spec, config, scale)
        res.pop("tokens")
        out[key] = res
    sa, sb = out["a"]["summary"], out["b"]["summary"]
    ratios = {f"{k}_b_over_a": _ratio(sb[k], sa[k]) for k in RATIO_KEYS}
    ratios.update(kv_waste_a=sa["kv_waste"], kv_waste_b=sb["kv_waste"], dead_slot_fraction_a=sa["dead_slot_fraction"],
                  dead_slot_fraction_b=sb["dead_slot_fraction"], busy_fraction_a=sa["busy_fraction"],
                  busy_fraction_b=sb["busy_fraction"])
    out["ratios"] = ratios
    return out


def _ratio(x: float, y: float) -> float:
    return x / y if y and not math.isnan(y) else float("nan")


# -- lessons -------------------------------------------------------------------------------------
def compares(scenario: Spec) -> list[Spec]:
    """A lesson's ``[compare]`` as a list: one table, or an array of tables (a sweep, run in order)."""
    cmp_ = scenario.get("compare", [])
    return [cmp_] if isinstance(cmp_, dict) else list(cmp_)


def lesson_dirs() -> list[Path]:
    return sorted(p for p in LESSONS_DIR.iterdir() if p.is_dir() and p.name[:2].isdigit())


def lesson_dir(number: int) -> Path:
    for p in lesson_dirs():
        if int(p.name[:2]) == number:
            return p
    raise InvalidConfig(f"no lesson {number}; lessons: {', '.join(p.name for p in lesson_dirs())}")


def load(path: Path) -> Spec:
    with open(path, "rb") as f:
        return tomllib.load(f)


def run_lesson(model, tok, scenario: Spec, short: bool = False) -> Result:
    """Every [[run]] of a scenario, one after the other in this process, then its [[check]]s."""
    wl = scenario["workload"]
    base_scale = wl.get("short_scale", 0.5) if short else 1.0
    runs: dict[str, Result] = {}
    for r in scenario["run"]:
        spec = SPECS[r.get("workload", wl["name"])]
        overrides = {k: v for k, v in r.items() if k in CONFIG_FIELDS}
        config = engine_config(scenario["engine"], overrides)
        scale = base_scale * r.get("scale", 1.0)
        if "peer" in r:
            runs[r["name"]] = measure_peer(model, tok, spec, {**spec["engine"], **config}, scale, r["peer"])
        else:
            runs[r["name"]] = measure(model, tok, spec, config, scale)
    checks = [evaluate(c, runs, short) for c in scenario["check"]]
    return {"runs": runs, "checks": checks}


OPS: dict[str, Callable[[float, float], bool]] = {">=": lambda x, t: x >= t, "<=": lambda x, t: x <= t,
                                                   "==": lambda x, t: x == t}


def evaluate(check: Spec, runs: dict[str, Result], short: bool = False) -> Result:
    """One claim: a run's metric, or its ratio (or difference) to another run's, against a threshold."""
    run_ = runs[check["run"]]
    if check["metric"] == "same_tokens":  # token-for-token agreement of two runs of the same workload
        value = float(run_["tokens"] == runs[check["over"]]["tokens"])
    else:
        value = run_["summary"][check["metric"]]
        if "over" in check or "over_metric" in check:  # another run's metric, or another metric of this run
            other = runs[check.get("over", check["run"])]["summary"][check.get("over_metric", check["metric"])]
            value = value - other if check.get("mode") == "diff" else _ratio(value, other)
        if check.get("mode") == "ceiling":
            # A speedup over the most overlap can give, 1 / busy of the run it is measured against:
            # (b / a) x busy(a) <= 1 (plus noise) whenever b only hides a's idle device time.
            value *= runs[check["over"]]["summary"]["busy_fraction"]
    threshold = check.get("short_threshold", check["threshold"]) if short else check["threshold"]
    ok = not math.isnan(value) and OPS[check["op"]](value, threshold)
    return {"claim": check["claim"], "op": check["op"], "threshold": threshold, "measured": value, "ok": ok}
