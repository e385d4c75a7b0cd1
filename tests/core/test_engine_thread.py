"""The engine on its own thread, as the server runs it: requests from other threads, pause, single
steps and resume."""

from __future__ import annotations

import threading
import time


def test_run_forever_pause_single_step_resume(make_tiny_engine):
    engine = make_tiny_engine(runner="async")
    stop = threading.Event()
    thread = threading.Thread(target=engine.run_forever, args=(stop,), daemon=True)
    thread.start()
    try:
        first = engine.submit(token_ids=[1, 2, 3], max_new_tokens=5, ignore_eos=True)
        assert [e.kind for e in first][-1] == "done" and len(
            first.token_ids
        ) == 5  # served by the thread
        engine.pause()
        handles = [
            engine.submit(token_ids=[4 + i, 5], max_new_tokens=6, ignore_eos=True) for i in range(3)
        ]
        steps_before = engine.step_count
        time.sleep(0.2)
        assert engine.step_count == steps_before  # paused: nothing moves
        records = [engine.single_step() for _ in range(3)]
        assert all(r is not None for r in records) and engine.step_count == steps_before + 3
        assert not any(h.done for h in handles)
        engine.resume()
        for h in handles:
            assert [e.kind for e in h][-1] == "done" and len(h.token_ids) == 6
        kinds = [ev["kind"] for r in engine.telemetry.steps for ev in r["events"]]
        assert "pause" in kinds and "resume" in kinds
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive() and engine.blocks.num_used == 0


def test_cancel_client_ends_only_that_clients_requests(make_tiny_engine):
    engine = make_tiny_engine(max_slots=2)
    mine = [
        engine.submit(token_ids=[1, 2], max_new_tokens=40, ignore_eos=True, client="a")
        for _ in range(3)
    ]
    other = engine.submit(token_ids=[3, 4], max_new_tokens=10, ignore_eos=True, client="b")
    for _ in range(4):
        engine.step()
    assert engine.cancel_client("a") == 3
    engine.run_until_idle()
    assert all(
        h.seq.status.value == "cancelled" and [e.kind for e in h].count("done") == 1 for h in mine
    )
    assert other.seq.status.value == "finished" and len(other.token_ids) == 10
    assert engine.blocks.num_used == 0


def test_the_engine_is_what_the_calibration_reads(make_tiny_engine):
    """cost_model.Calibrated types the back-reference the calibration uses; the real Engine must
    have every member it names. The step recipe has none: it is Engine.step, over an Executor
    that knows no engine (execute.py imports nothing of engine.py)."""
    from engine.core import execute
    from engine.core.cost_model import Calibrated

    engine = make_tiny_engine()
    assert isinstance(engine, Calibrated)
    assert not [name for name in Calibrated.__annotations__ if not hasattr(engine, name)]
    assert not hasattr(execute, "Engine") and not hasattr(engine.executor, "engine")


def test_the_engine_changes_its_own_copy_of_the_config(tiny):
    from engine.core.config import EngineConfig
    from engine.core.engine import Engine

    model, tok = tiny
    mine = EngineConfig(model="tiny", dtype="float64", max_slots=2, max_model_len=100_000)
    engine = Engine(mine, model=model, tokenizer=tok)
    engine.reconfigure(policy="static", max_slots=3)
    engine.submit(token_ids=[1, 2, 3], max_new_tokens=2)
    engine.run_until_idle()
    assert engine.config.policy == "static" and engine.config.max_slots == 3
    assert engine.config.max_model_len == 4096  # the tiny model's context, on the engine's copy
    assert (mine.policy, mine.max_slots, mine.max_model_len) == ("continuous", 2, 100_000)
