"""Real telemetry for the chart tests: short runs of the real engine on the tiny seeded model."""

from __future__ import annotations

import time

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.workloads.canonical import batching_workload, lognormal_lengths


def record(
    model,
    tok,
    n: int = 16,
    max_steps: int = 100_000,
    inject_every: int = 0,
    inject: int = 0,
    clients: dict[int, str] | None = None,
    **config,
) -> Engine:
    """Submit a burst of ``n`` requests (forced lognormal lengths), optionally one more request
    with a long prompt every ``inject_every`` steps, and step until idle. Returns the engine (its
    telemetry)."""
    # One thread: on a shared 2-core machine an OpenMP team of two spins against other processes.
    cfg = dict(
        model="tiny",
        dtype="float64",
        max_slots=8,
        kv_blocks=1024,
        block_size=16,
        fill_timeout_s=0.0,
        chunk_budget=32,
        threads=1,
    )
    cfg.update(config)
    engine = Engine(EngineConfig(**cfg), model=model, tokenizer=tok)
    for i, it in enumerate(batching_workload(n)):
        engine.submit(
            prompt=it.prompt,
            max_new_tokens=it.max_new_tokens,
            ignore_eos=True,
            client=(clients or {}).get(i, "traffic"),
        )
    steps = injected = 0
    while engine.has_work() and steps < max_steps:
        if inject_every and injected < inject and steps and steps % inject_every == 0:
            engine.submit(
                prompt="Summarize: " + "the bus network report " * 12,
                max_new_tokens=8,
                ignore_eos=True,
                client="traffic",
            )
            injected += 1
        if engine.step() is None:
            time.sleep(0.001)
        else:
            steps += 1
    return engine


def record_big(model, tok, slots: int = 64, steps: int = 2000) -> Engine:
    """64 slots, 2,000 steps: a steady stream of requests (forced lengths), continuous policy."""
    cfg = dict(
        model="tiny",
        dtype="float64",
        max_slots=slots,
        kv_blocks=8192,
        block_size=16,
        fill_timeout_s=0.0,
        policy="continuous",
        threads=1,
    )
    engine = Engine(EngineConfig(**cfg), model=model, tokenizer=tok, max_telemetry_steps=steps)
    lengths = iter(lognormal_lengths(100_000, median=40, sigma=1.0, hi=256, seed=1))
    done = 0
    while done < steps:
        if len(engine.live_requests()) < slots + 8:  # at most one arrival per step keeps a queue
            engine.submit(
                prompt="Why is the sky blue?",
                max_new_tokens=next(lengths),
                ignore_eos=True,
                client="traffic",
            )
        if engine.step() is not None:
            done += 1
    return engine
