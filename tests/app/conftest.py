"""Fixtures for the page's tests: real telemetry from short engine runs, and a real engine
server. ``recording`` (beside this file) and ``servers`` (tests/servers.py) import as top-level
modules: pytest puts each folder of tests that is no package on ``sys.path`` (its default
``prepend`` import mode), as for tests/server's ``server_client``."""

from __future__ import annotations

import pytest
from recording import record, record_big
from servers import start_engine, stop

from app.engine_client import EngineClient

PEOPLE = {0: "c7", 5: "c7"}  # the 1st and 6th requests of each burst come from a person's chat


@pytest.fixture(scope="session")
def runs(tiny):
    """One real run per policy (sync), one async: a burst of 16 plus 3 long prompts arriving
    mid-run."""
    model, tok = tiny
    out = {}
    for policy in ("static", "continuous", "chunked"):
        eng = record(model, tok, policy=policy, inject_every=25, inject=3, clients=PEOPLE)
        out[policy] = (list(eng.telemetry.steps), list(eng.telemetry.requests.values()))
    # 2 ms of simulated host work in each prepare: the tiny model computes in ~1 ms, and on a
    # loaded machine no prepare overlapped a compute at all in one full run (0 of ~60)
    eng = record(model, tok, policy="continuous", runner="async", clients=PEOPLE, host_work_ms=2.0)
    out["async"] = (list(eng.telemetry.steps), list(eng.telemetry.requests.values()))
    return out


@pytest.fixture(scope="session")
def big(tiny):
    """64 slots x 2,000 steps of a real (tiny-model) engine under a steady stream of requests."""
    eng = record_big(*tiny, slots=64, steps=2000)
    return list(eng.telemetry.steps), list(eng.telemetry.requests.values())


@pytest.fixture(scope="session")
def engine_server(tmp_path_factory):
    proc, url = start_engine(
        tmp_path_factory.mktemp("engine"), "--slots", "8", "--kv-blocks", "256"
    )
    yield url
    stop(proc)


@pytest.fixture
def probe(engine_server):
    """A second, independent client of the same server: it checks what the page did, then resets."""
    c = EngineClient(engine_server, history=10)
    assert c.wait_connected(15), c.error
    yield c
    c.request("reset")
    c.close()
