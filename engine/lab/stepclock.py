"""Two load-proof yardsticks for the lessons: the engine's step clock, and a latency target in rows.

On a machine shared with other work, seconds are not a fixed unit: a plain decode step took from
0.55 to 3.7 s within one run at load 10 (2026-11-30). So a lesson that needs "how loaded is the
engine" or "did an answer wait too long" can count steps and rows instead.

``run``: ``replay.run`` with arrivals on the step clock (a workload group with ``clock = "steps"``):
an item arrives once the engine has run ``arrival_s`` steps (an idle engine jumps to the next
arrival), so 0.4 requests per step is past the knee of 4 slots x 16 tokens however fast the machine
is. ``rows_target``: goodput under a target stated as rows per step (Sarathi-Serve's token budget).
"""

from __future__ import annotations

import math
from typing import Any

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.core.metrics import percentile, summarize
from engine.core.requests import RequestHandle
from engine.workloads.canonical import WorkItem

Result = dict[str, Any]
# The lessons' replay states it as work per step, as Sarathi-Serve sets its token budget: a step
# costs about its rows (prompt tokens + decodes), so a request meets the target when no step it
# waited on for a token computed more than this many rows. On a quiet 2-core CPU a decode step of
# 8 rows takes ~40 ms and a prompt token ~1.5 ms: 80 rows is ~150 ms. Counted, not timed: a
# machine slowed by other processes (decode steps from 0.55 to 3.7 s within one run at load 10,
# 2026-11-30) cannot move it.
TARGET_ROWS = 80


def rows_target(steps: list[dict], requests: list[dict]) -> Result:
    """Goodput under TARGET_ROWS: per request, the most rows (prefill + decode tokens) of a step
    that gave it a token after its first; met when that is at most TARGET_ROWS."""
    worst: dict[int, int] = {}
    for r in steps:
        rows = r["tokens"]["prefill"] + r["tokens"]["decode"]
        for s in r["slots"]:
            if s["phase"] == "decode" and s["tokens"]:
                worst[s["request"]] = max(worst.get(s["request"], 0), rows)
    done = [r for r in requests if r["finished"] is not None]
    if not done:
        return {}
    met = sum(worst.get(r["id"], 0) <= TARGET_ROWS for r in done)
    span = max(r["finished"] for r in done) - min(r["arrival"] for r in done)
    return {
        "target_rows": TARGET_ROWS,
        "max_rows_waited": max(worst.values(), default=0),
        "rows_slo_met_fraction": met / len(done),
        "rows_goodput_rps": met / span if span > 0 else float("nan"),
    }


def run(
    model,
    tok,
    items: list[WorkItem],
    ignore_eos: bool = True,
    on_step=None,
    on_submit=None,
    **config: Any,
) -> tuple[Result, Engine]:
    """``replay.run`` with arrivals counted in steps: an item is submitted once the clock (steps
    run, plus the ticks an idle engine skipped to the next arrival) reaches its ``arrival_s``."""
    engine = Engine(EngineConfig(**config), model=model, tokenizer=tok)
    pending = sorted(range(len(items)), key=lambda i: items[i].arrival_s)
    nxt = ticks = idle = 0
    # The tick each request arrived at, and the tick its first token came out at.
    submitted: dict[RequestHandle, int] = {}
    first: dict[RequestHandle, int] = {}
    while nxt < len(pending) or engine.has_work():
        if nxt < len(pending) and not engine.has_work():  # idle: jump to the next arrival
            jump = max(0, math.ceil(items[pending[nxt]].arrival_s) - ticks)
            ticks, idle = ticks + jump, idle + jump
        while nxt < len(pending) and items[pending[nxt]].arrival_s <= ticks:
            it = items[pending[nxt]]
            handle = engine.submit(
                prompt=it.prompt, max_new_tokens=it.max_new_tokens, ignore_eos=ignore_eos
            )
            submitted[handle] = ticks
            if on_submit is not None:
                on_submit(pending[nxt], handle)
            nxt += 1
        if on_step is not None:
            on_step(engine, ticks - idle)
        if engine.step() is not None:
            ticks += 1
            first.update(
                {h: ticks for h in submitted if h not in first and h.seq.first_token is not None}
            )
    summary = summarize(list(engine.telemetry.steps), list(engine.telemetry.requests.values()))
    waits = [first[h] - t for h, t in submitted.items() if h in first]  # TTFT in steps of the clock
    summary.update(
        ticks=ticks,
        idle_ticks=idle,
        tokens_per_tick=summary["useful_tokens"] / ticks if ticks else 0.0,
        ttft_steps_p50=percentile(waits, 50),
        ttft_steps_p95=percentile(waits, 95),
        config={k: config[k] for k in sorted(config)},
    )
    return summary, engine
