"""Property tests of the policy API (hypothesis): random programs (submit, cancel, step, live
reconfigure, drain; tests/core/engine_programs.py) under a random valid policy, a hostile one and a
slow one (tests/core/policy_programs.py), switched live with the built-ins. After every step: exact
KV accounting (no leak, no double free), every sequence in one place, slots and the KV budget never
overdrawn, the policy's token budget kept, every refusal a ``policy_error``; at the end every
request ended exactly once, with the greedy tokens the continuous policy gives it alone.

And the checks are what keeps the engine safe: with them switched off, the hostile policy breaks
the engine (the last test).
"""

from __future__ import annotations

import engine_harness
import pytest
from engine_harness import check_greedy, run_program
from engine_programs import programs
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from policy_programs import NAMES, Hostile, PolicyHarness, RandomValid

from engine.core import scheduler
from engine.core.policy import check

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PROP = dict(
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
MIXED = (*NAMES, "continuous", "chunked", "static")


def _dry(policy: str) -> tuple:
    """A program whose pool runs dry (5 x 12-token prompts in 8 blocks): preemption guaranteed."""
    start = dict(policy=policy, max_slots=5, kv_layout="paged", kv_blocks=8, chunk_budget=8)
    burst = [("submit", [(k + 7 * i) % 256 for i in range(12)], 12, True) for k in range(5)]
    return (start | {"runner": "sync"}, [("burst", burst), ("step", 6), ("step", 6)])


def _run(make_tiny_engine, program, seed, monkeypatch):
    monkeypatch.setattr(engine_harness, "Harness", PolicyHarness)
    monkeypatch.setattr(RandomValid, "seed", seed)
    start, ops = program
    hz = run_program(make_tiny_engine, start, ops)
    check_greedy(make_tiny_engine, hz)
    return hz


@settings(max_examples=120, **PROP)
@example(program=_dry("test-random"), seed=1)
@example(program=_dry("test-hostile"), seed=2)
@given(program=programs(MIXED), seed=st.integers(0, 1 << 16))
def test_any_policy_keeps_the_engine_invariants_and_greedy_outputs(
    make_tiny_engine, program, seed, monkeypatch
):
    _run(make_tiny_engine, program, seed, monkeypatch)


@settings(max_examples=40, **PROP)
@example(program=_dry("test-hostile"), seed=3)
@example(program=_dry("test-hostile"), seed=4)
@given(program=programs(("test-hostile",)), seed=st.integers(0, 1 << 16))
def test_hostile_policy_is_refused_with_a_coded_event(make_tiny_engine, program, seed, monkeypatch):
    hz = _run(make_tiny_engine, program, seed, monkeypatch)
    events = [ev for rec in hz.records for ev in rec["events"] if ev["kind"] == "policy_error"]
    assert all(ev["code"] == "policy_error" and ev["hook"] and ev["error"] for ev in events)
    if len(hz.records) >= 8:
        assert events, "a policy wrong half the time was never refused"


def test_slow_policy_every_hook_refused(make_tiny_engine):
    e = make_tiny_engine(policy="test-slow", max_slots=2)
    hs = [
        e.submit(token_ids=[1 + i, 2, 3, 4, 5], max_new_tokens=3, ignore_eos=True) for i in range(3)
    ]
    rec = e.step()
    assert {ev["hook"] for ev in rec["events"] if ev["kind"] == "policy_error"} == {"token_budget"}
    assert "took" in rec["events"][0]["error"] and rec["admitted"] == [hs[0].id, hs[1].id]
    e.run_until_idle()
    assert all(h.seq.status.value == "finished" for h in hs)


def test_without_the_checks_a_hostile_policy_breaks_the_engine(make_tiny_engine, monkeypatch):
    """The same hostile programs with every check a pass-through: the engine breaks (an exception
    or a broken invariant), so the properties above can fail."""
    for name in ("check_admit", "check_budget", "check_prefill", "check_victim"):
        monkeypatch.setattr(scheduler, name, lambda value, *_: value)
    monkeypatch.setattr(check.Guard, "refuse", lambda self, hook, exc: (_ for _ in ()).throw(exc))
    start = dict(policy="test-hostile", max_slots=3, kv_layout="paged", kv_blocks=8)
    start.update(chunk_budget=4, runner="sync")
    broke = 0
    for seed in range(6):
        monkeypatch.setattr(Hostile, "seed", seed)
        ops = [("burst", [("submit", [seed + i] * (6 + i), 8, True) for i in range(5)])]
        ops += [("step", 6)] * 4
        try:
            _run(make_tiny_engine, (start, ops), seed, monkeypatch)
        except Exception:  # noqa: BLE001 - any breakage counts: a TypeError, a KeyError, a leak
            broke += 1
    assert broke >= 4, f"the hostile policy broke the unchecked engine only {broke} of 6 times"
