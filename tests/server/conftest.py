"""Fixtures for the server tests: a real server on a loopback port (its own thread and event loop,
SmolLM2 weights shared with the other tests)."""
from __future__ import annotations

from typing import Any

import pytest

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.lab import scenario
from engine.server.server import Comparison, Limits, Server


@pytest.fixture
def serve(smollm2):
    """``serve(**config)`` starts a fresh server (fresh engine, shared weights); stopped after the test."""
    stops = []

    def start(limits: Limits | None = None, token: str | None = None, host: str = "127.0.0.1", **config: Any) -> Server:
        model, tok = smollm2
        cfg = dict(max_slots=8, kv_blocks=256)
        cfg.update(config)
        engine = Engine(EngineConfig(**cfg), model=model, tokenizer=tok, max_telemetry_steps=5000)
        server = Server(engine, host, 0, token, limits,
                        comparison=Comparison(scenario.compare, tuple(scenario.WORKLOADS)))
        _, stop = server.run_in_thread()
        stops.append(stop)
        return server

    yield start
    for stop in stops:
        stop()


