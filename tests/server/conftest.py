"""Fixtures for the server tests: a real server on a loopback port (its own thread and event loop),
on the tiny float64 model or on SmolLM2, weights shared with the other tests (each loaded only
when a test asks for it)."""

from __future__ import annotations

from typing import Any

import pytest
from server_client import start_server

from engine.server.server import Server


@pytest.fixture
def serve(request):
    """``serve(model="smollm2"|"tiny", limits=, token=, host=, http_port=, **config)`` starts a
    fresh server; every one is stopped after the test."""
    stops = []

    def start(model: str = "smollm2", **kwargs: Any) -> Server:
        if model != "tiny" and request.node.get_closest_marker("model") is None:
            raise RuntimeError(f"{request.node.nodeid} starts SmolLM2: mark it pytest.mark.model")
        weights = request.getfixturevalue("tiny" if model == "tiny" else "smollm2")
        server, stop = start_server(weights, model, **kwargs)
        stops.append(stop)
        return server

    yield start
    for stop in stops:
        stop()
