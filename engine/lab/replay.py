"""The replay driver: a workload's requests submitted as the engine clock passes each one's
arrival time, stepped until idle, summarized. Benchmarks, lesson scenarios and the server's
``compare`` replay through it, each on a fresh engine sharing the loaded weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from engine.core.config import EngineConfig, lab_weights
from engine.core.engine import Engine
from engine.core.metrics import summarize
from engine.core.requests import RequestHandle
from engine.workloads.canonical import CHAT_PROMPTS, WorkItem

Result = dict[str, Any]


def run(
    model,
    tok,
    items: list[WorkItem],
    ignore_eos: bool = True,
    on_step: Callable[[Engine, int], None] | None = None,
    on_submit: Callable[[int, RequestHandle], None] | None = None,
    **config: Any,
) -> tuple[Result, Engine]:
    """Submit ``items`` as the engine clock passes each one's ``arrival_s`` and step until idle.

    ``on_step`` may inject more requests; ``on_submit(index, handle)`` sees each item's handle.
    """
    config.setdefault("device", "cpu")
    engine = Engine(EngineConfig(**config), model=model, tokenizer=tok)
    # Stable sort: items arriving together keep their order (the order a burst is queued in).
    pending = sorted(range(len(items)), key=lambda i: items[i].arrival_s)
    nxt = 0

    def submit_due() -> None:
        nonlocal nxt
        while nxt < len(pending) and items[pending[nxt]].arrival_s <= engine.now():
            it = items[pending[nxt]]
            handle = engine.submit(
                prompt=it.prompt, max_new_tokens=it.max_new_tokens, ignore_eos=ignore_eos
            )
            if on_submit is not None:
                on_submit(pending[nxt], handle)
            nxt += 1

    submit_due()
    steps = 0
    while nxt < len(pending) or engine.has_work():
        submit_due()
        if on_step is not None:
            on_step(engine, steps)
        if engine.step() is None:
            # Idle: wait for the next arrival (or a static batch's fill timeout), not a busy loop.
            wait = items[pending[nxt]].arrival_s - engine.now() if nxt < len(pending) else 0.001
            time.sleep(min(max(wait, 0.0005), 0.005))
        else:
            steps += 1
    records = list(engine.telemetry.steps)
    summary = summarize(records, list(engine.telemetry.requests.values()))
    summary["config"] = {k: config[k] for k in sorted(config)}
    # what the forward really read (q4 falls back to fp32 where the kernels cannot build)
    summary["config"]["weights"] = engine.execution()["weights"]
    return summary, engine


def warm_up(model, tok, device: str = "cpu", weights: str | None = None) -> None:
    """One small run that pays a process's one-off costs (the first engine, the q4 copy of the
    weights and its tiles) before anything is measured."""
    run(
        model,
        tok,
        [WorkItem(CHAT_PROMPTS[0], 4)] * 2,
        max_slots=2,
        device=device,
        weights=weights or lab_weights(),
    )
