"""``python -m engine.policy score my_policy.py``: a policy against the built-ins on a trace.

Each run replays the trace (``engine/workloads/trace.py``) on a fresh engine sharing the loaded
weights: a request is submitted once the engine clock passes its ``arrival_s``, every answer is
generated to its ``max_tokens``. The clock is, by default, *priced*: each step advances it by what
``PRICES`` says the step costs (SmolLM2 q4 on a quiet 2-core CPU: ~28 ms a step plus ~1.5 ms a
row), so a score is the same on every machine and under any load, like lesson 7's counted
yardsticks (``engine/lab/stepclock.py``); the engine and the token counts are real, only the
seconds are counted. ``--clock wall`` times the real steps instead.

Quick by default: on the priced clock no figure reads a token's value (answers run to their
``max_tokens``, a policy's view holds counts and times, and prefix-cache hits follow prompts, the
same in both), so the weights that pick the tokens cannot move a score. ``counting_model`` stands
in for SmolLM2 (its tokenizer kept, so every count is SmolLM2's) and the replay runs ~10x faster;
``check_full`` holds the quick runs against the stored full replay of the shipped trace each time
(lesson 11's ``score.json``), and ``--full`` replays on SmolLM2 itself.

Per run: throughput, TTFT and ITL percentiles, preemptions, goodput under the targets (a request
meets them with TTFT <= ``--ttft-target`` and the p99 of its gaps <= ``--itl-target``, as lesson 7
counts goodput), fairness (Jain's index of per-client goodput) and the goodput of every client but
the heaviest; every formula is ``engine/core/metrics.py``'s. ``ratios``: the policy over each
built-in, metric by metric.
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.config import EngineConfig
from engine.core.cost_model import CostModel
from engine.core.engine import Engine
from engine.core.errors import FluxoError
from engine.core.metrics import goodput, percentile, ratio, summarize, ttfts
from engine.core.policy import registry
from engine.core.requests import encode
from engine.lab.specs import ITL_TARGET_S
from engine.workloads.trace import SCORE_RATIO_KEYS, BadTrace, TraceItem

# c0 (s a step), per row of the flat batch, per logit row, per 1000 attention pairs: the forward's
# cost model (engine/core/cost_model.py) with fixed coefficients. A decode step of 8 rows: 40 ms.
PRICES = (0.028, 0.0015, 0.0, 0.0, 0.0)
TTFT_TARGET_S = 2.0
CONFIG = dict(max_slots=8, kv_blocks=1024, block_size=16, chunk_budget=64, fill_timeout_s=0.5)
RATIO_KEYS = SCORE_RATIO_KEYS
Result = dict[str, Any]


class PricedSteps(CostModel):
    """The priced clock's cost model: ``PRICES``, never refitted (a policy's view prices steps
    on it too, so a latency-target policy sizes its budget on the clock it is scored by)."""

    def __init__(self) -> None:
        super().__init__()
        self.coef = np.array(PRICES)

    def observe(self, *args: Any, **kwargs: Any) -> None:
        return None


STORED_FULL = Path(__file__).parents[2] / "lessons" / "11-write-your-own-scheduler" / "score.json"


COUNTED_IDS = 256  # the stand-in picks its tokens among the first ids (any id is a real token)


def counting_model(vocab_size: int, max_positions: int, seed: int = 0):
    """A one-layer Llama of width 16 with the real model's vocabulary and context: the steps,
    slots, blocks and token counts it makes a replay take are the real model's (its tokens are
    random, answers run to their length, and nothing on the priced clock reads them). It accepts
    every id of the real vocabulary and answers among the first ``COUNTED_IDS``: a head of the
    whole vocabulary and its argmax were 0.6 of the 1.16 ms its step took (class trace, 2,981
    steps, 2026-12-07); with 256 outputs the step takes about half as long."""
    import torch

    from engine.core.model import tiny_llama

    lm = tiny_llama(
        seed, torch.float32, 1, width=16, vocab_size=vocab_size, max_positions=max_positions
    )[0]
    gen = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(16, min(COUNTED_IDS, vocab_size), bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.1)
    lm.lm_head = head
    return lm


def check_full(result: Result, stored: Path = STORED_FULL) -> dict[str, Any] | None:
    """The quick runs of the built-ins (code a student cannot edit) against the stored full
    replay of the same trace, targets and config: every metric equal, or the largest relative
    difference. None when nothing stored matches this trace and setting."""
    try:
        full = json.loads(stored.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    same = (full.get("trace"), full.get("targets"), full.get("clock")) == (
        result.get("trace"),
        result["targets"],
        result["clock"],
    ) and all(full.get("config", {}).get(k) == v for k, v in CONFIG.items())
    names = [n for n in registry.BUILTIN_NAMES if n in result["runs"] and n in full.get("runs", {})]
    names = names if same else []
    if not names:
        return None
    pairs = [(v, full["runs"][n].get(k)) for n in names for k, v in result["runs"][n].items()]
    pairs += [
        (v[c], w.get(c)) for v, w in pairs if isinstance(v, dict) and isinstance(w, dict) for c in v
    ]
    numbers = [(v, w) for v, w in pairs if all(isinstance(x, int | float) for x in (v, w))]
    worst, keys = 0.0, len(numbers)
    for v, w in numbers:
        if v != w and not (math.isnan(v) and math.isnan(w)):
            worst = max(worst, abs(v - w) / max(abs(w), 1e-12))
    return {
        "stored": full["when"],
        "weights": full.get("weights"),
        "runs": names,
        "metrics": keys,
        "equal": worst == 0.0,
        "max_rel_diff": worst,
    }


def replay(lm, tok, items: list[TraceItem], policy: str, clock: str, **config: Any):
    """One run of the trace under ``policy``; returns (step records, request records)."""
    vt = [0.0]
    cfg = EngineConfig(**{"device": "cpu", **CONFIG, **config, "policy": policy, "runner": "sync"})
    priced = clock == "priced"
    engine = Engine(
        cfg, model=lm, tokenizer=tok, clock=(lambda: vt[0]) if priced else time.perf_counter
    )
    if priced:
        engine.cost_model = engine.scheduler.cost_model = PricedSteps()
    enc = functools.partial(encode, tok)
    vocab = lm.config.vocab_size
    ends: dict[float, float] = {}
    handles, nxt = {}, 0
    while nxt < len(items) or engine.has_work():
        if nxt < len(items) and not engine.has_work() and items[nxt].arrival_s > engine.now():
            if priced:  # idle: the clock jumps to the next arrival
                vt[0] = items[nxt].arrival_s
            else:
                time.sleep(min(0.005, items[nxt].arrival_s - engine.now()))
                continue
        while nxt < len(items) and items[nxt].arrival_s <= engine.now():
            it = items[nxt]
            try:
                ids = it.token_ids(enc, vocab, nxt)
                h = engine.submit(
                    token_ids=ids, max_new_tokens=it.max_tokens, ignore_eos=True, client=it.client
                )
            except FluxoError as exc:
                raise BadTrace(
                    f"trace request {nxt + 1} cannot run: [{exc.code}] {exc.message}"
                ) from None
            handles[h.id] = it
            nxt += 1
        rec = engine.step()
        if priced and rec is not None:
            ends[rec["t_start"]] = rec["t_start"] + rec["expected_s"]
            vt[0] += rec["expected_s"]
        elif priced:  # work waits for something (a static batch filling): let time pass
            upcoming = items[nxt].arrival_s if nxt < len(items) else math.inf
            vt[0] = min(upcoming, vt[0] + 0.05)
    steps = [dict(r) for r in engine.telemetry.steps]
    reqs = [dict(r) for r in engine.telemetry.requests.values()]
    for r in reqs:
        r["arrival"] = handles[r["id"]].arrival_s
    if priced:
        _retime(steps, reqs, ends)
    return steps, reqs


def _retime(steps: list[dict], reqs: list[dict], ends: dict[float, float]) -> None:
    """On the priced clock a step's times all read its start; what it produced lands at its end."""
    for r in steps:
        r["t_end"] = ends[r["t_start"]]
    for r in reqs:
        r["token_times"] = [ends.get(t, t) for t in r["token_times"]]
        for key in ("first_token", "finished"):
            if r[key] is not None:
                r[key] = ends.get(r[key], r[key])


def measure(steps: list[dict], reqs: list[dict], ttft_target: float, itl_target: float) -> Result:
    s = summarize(steps, reqs)
    out = {
        k: s[k]
        for k in ("throughput", "ttft_p50", "itl_p50", "itl_p99", "steps", "tokens_per_step")
    }
    out["ttft_p99"] = percentile(ttfts(reqs), 99)
    out["preemptions"] = sum(len(r["preempted"]) for r in steps)
    out["policy_errors"] = sum(ev["kind"] == "policy_error" for r in steps for ev in r["events"])
    out.update(goodput(reqs, ttft_target, itl_target))
    return out


def score(
    lm,
    tok,
    items: list[TraceItem],
    policies: str | list[str],
    clock: str = "priced",
    ttft_target: float = TTFT_TARGET_S,
    itl_target: float = ITL_TARGET_S,
    **config: Any,
) -> Result:
    """``policies`` and every built-in on ``items`` (``lm``, ``tok``: the loaded model, shared),
    each replayed once: per-run metrics, and each policy's ratios over each built-in."""
    policies = [policies] if isinstance(policies, str) else list(policies)
    runs = {}
    for name in dict.fromkeys((*policies, *registry.BUILTIN_NAMES)):
        runs[name] = measure(
            *replay(lm, tok, items, name, clock, **config), ttft_target, itl_target
        )
    ratios = {
        p: {
            b: {k: ratio(runs[p][k], runs[b][k]) for k in RATIO_KEYS}
            for b in registry.BUILTIN_NAMES
            if b != p
        }
        for p in policies
    }
    return {
        "policies": policies,
        "requests": len(items),
        "clock": clock,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "targets": {"ttft_s": ttft_target, "itl_p99_s": itl_target},
        "config": {**CONFIG, **config},
        "runs": runs,
        "ratios": ratios,
    }
