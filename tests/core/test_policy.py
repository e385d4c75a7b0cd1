"""The policy API on the real engine (tiny model): the hooks decide, the view is read-only, each
rule a decision can break is refused with a ``policy_error`` event and the step falls back to the
continuous policy, and policy files load at start and switch live like the built-ins."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from app import recording
from engine.core.config import EngineConfig
from engine.core.errors import FluxoError, InvalidPolicy, UnknownMode
from engine.core.policy import Policy, load_file, names, registry
from engine.core.policy.builtin import Chunked, Continuous, Static

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Spf(Policy):
    name = "unit-spf"

    def admit(self, view):
        return [w.id for w in sorted(view.waiting, key=lambda w: w.num_tokens)][: view.free_slots]


class OldestVictim(Policy):
    name = "unit-oldest"

    def preempt(self, view, candidates):
        return candidates[0].id


class Broken(Policy):
    """Each hook answers what ``answers[hook]`` says (a value, or an exception to raise)."""

    name = "unit-broken"
    answers: dict = {}

    def _answer(self, hook, default):
        value = self.answers.get(hook, default)
        if isinstance(value, BaseException):
            raise value
        if value == "sleep":
            time.sleep(0.25)  # CPU time 0, yet not back after 10 x its 20 ms: abandoned
            return default
        if value == "hang":  # never returns: abandoned after 10 x its 20 ms
            while True:
                pass
        return value(self) if callable(value) else value

    def token_budget(self, view):
        return self._answer("token_budget", None)

    def admit(self, view):
        return self._answer("admit", [w.id for w in view.waiting[: view.free_slots]])


for _cls in (Spf, OldestVictim, Broken):
    registry.register(_cls)


def _submit(e, *lengths, new=3):
    return [
        e.submit(
            token_ids=[(7 * i + j) % 250 for j in range(n)], max_new_tokens=new, ignore_eos=True
        )
        for i, n in enumerate(lengths)
    ]


def test_builtins_are_policies_through_the_same_hooks():
    assert names()[:3] == ("static", "continuous", "chunked")
    assert all(issubclass(c, Policy) and c.trusted for c in (Static, Continuous, Chunked))
    assert Static.batch and not Continuous.batch
    assert "unit-spf" in names() and EngineConfig(policy="unit-spf").policy == "unit-spf"
    with pytest.raises(UnknownMode) as info:
        EngineConfig(policy="nobody")
    assert "unit-spf" in info.value.message


def test_admit_hook_orders_admissions(make_tiny_engine):
    for policy, first in (("continuous", 0), ("unit-spf", 2)):
        e = make_tiny_engine(policy=policy, max_slots=1)
        hs = _submit(e, 12, 9, 3)
        rec = e.step()
        assert rec["admitted"] == [hs[first].id] and rec["policy"] == policy
        e.run_until_idle()


def test_preempt_hook_picks_the_victim(make_tiny_engine):
    # 3 x 8-token prompts in 9 blocks of 4: the pool runs dry as the first grows to 13 tokens;
    # continuous sends back the newest other request, this policy the oldest.
    for policy, victim in (("continuous", 2), ("unit-oldest", 1)):
        e = make_tiny_engine(policy=policy, max_slots=3, kv_blocks=9)
        hs = _submit(e, 8, 8, 8, new=8)
        rec = e.step()
        while not rec["preempted"]:
            rec = e.step()
        assert rec["preempted"] == [hs[victim].id], policy
        e.run_until_idle()
        assert [h.seq.status.value for h in hs] == ["finished"] * 3


def test_view_is_a_read_only_copy(make_tiny_engine):
    seen = []

    class Peek(Policy):
        name = "unit-peek"

        def admit(self, view):
            seen.append(view)
            w = view.waiting[0]
            with pytest.raises(dataclasses.FrozenInstanceError):
                w.prompt_len = 0
            return [w.id]

    registry.register(Peek)
    try:
        e = make_tiny_engine(policy="unit-peek")
        (h,) = _submit(e, 5)
        rec = e.step()
        assert rec["admitted"] == [h.id] and not rec["events"]
        view = seen[0]
        assert isinstance(view.waiting, tuple) and view.free_slots == 4 and view.block_size == 4
        assert view.waiting[0].prompt_len == 5 and view.tokens_left is None
        assert view.itl_chunk_budget() is None  # the cost model is not fitted yet
    finally:
        registry.unregister("unit-peek")


@pytest.mark.parametrize(
    "hook,answer,says",
    [
        ("admit", lambda self: [10**9], "distinct waiting"),
        ("admit", lambda self: "a", "distinct waiting"),
        ("admit", 7, "list of request ids"),
        ("admit", lambda self: list(range(1, 10**4)), "slots are free"),
        ("admit", KeyError("boom"), "KeyError"),
        ("admit", "sleep", "did not return"),
        ("admit", "hang", "did not return"),
        ("admit", SystemExit(3), "SystemExit"),
        ("admit", KeyboardInterrupt(), "KeyboardInterrupt"),
        ("token_budget", 0, "token_budget"),
        ("token_budget", True, "token_budget"),
        ("token_budget", ValueError("no"), "ValueError"),
    ],
)
def test_a_refused_decision_falls_back_and_is_recorded(
    make_tiny_engine, monkeypatch, hook, answer, says
):
    monkeypatch.setattr(Broken, "answers", {hook: answer})
    e = make_tiny_engine(policy="unit-broken", max_slots=2)
    hs = _submit(e, 6, 5, 4)
    rec = e.step()
    (event,) = [ev for ev in rec["events"] if ev["kind"] == "policy_error"]
    assert event["code"] == "policy_error" and event["hook"] == hook, event
    assert event["policy"] == "unit-broken" and says in event["error"], event
    assert rec["admitted"] == [hs[0].id, hs[1].id]  # what continuous admits
    e.run_until_idle()
    assert [h.seq.status.value for h in hs] == ["finished"] * 3
    # the page's export of this run reads back as a recording, the refusal in its step's events
    replayed = recording.parse(e.telemetry.jsonl()).run()
    assert [ev["hook"] for ev in replayed.steps[0]["events"]] == [hook]


def test_a_hook_that_never_returns_costs_one_step_not_the_class(make_tiny_engine, monkeypatch):
    """A ``while True`` hook: the engine waits 200 ms once, then refuses the policy at once at
    every later step, and the abandoned loop is stopped where it runs (no thread left spinning)."""
    monkeypatch.setattr(Broken, "answers", {"admit": "hang"})
    e = make_tiny_engine(policy="unit-broken", max_slots=2)
    hs = _submit(e, 6, 5, 4)
    t0 = time.perf_counter()
    first = e.step()
    took = time.perf_counter() - t0
    e.run_until_idle()
    assert 0.2 <= took < 5, took  # the wait, bounded; the old guard never came back
    assert "did not return" in first["events"][0]["error"]
    steps = e.telemetry.snapshot()[0]
    later = [ev["error"] for rec in steps[1:] for ev in rec["events"]]
    assert later and all("policy waits" in err for err in later), later  # 5 s of fallback
    assert [h.seq.status.value for h in hs] == ["finished"] * 3
    deadline = time.monotonic() + 5
    while sum(t.name == "fluxo-policy" and t.is_alive() for t in threading.enumerate()) > 1:
        assert time.monotonic() < deadline, "the abandoned hook's thread still runs"
        time.sleep(0.05)


def test_policy_file_loads_and_switches_live(make_tiny_engine, tmp_path):
    path = tmp_path / "longest.py"
    path.write_text(
        "from engine.core.policy import Policy\n\n"
        "class Longest(Policy):\n"
        '    name = "unit-longest"\n\n'
        "    def admit(self, view):\n"
        "        order = sorted(view.waiting, key=lambda w: -w.num_tokens)\n"
        "        return [w.id for w in order[: view.free_slots]]\n"
    )
    try:
        assert load_file(path) == ["unit-longest"]
        e = make_tiny_engine(max_slots=1)
        hs = _submit(e, 3, 12)
        e.reconfigure(policy="unit-longest")
        rec = e.step()
        assert rec["admitted"] == [hs[1].id]
        assert rec["events"][0]["changes"] == {"policy": "unit-longest"}
        e.run_until_idle()
        (tmp_path / "again.py").write_text(path.read_text())
        with pytest.raises(InvalidPolicy, match="already registered"):
            load_file(tmp_path / "again.py")
    finally:
        registry.unregister("unit-longest")


@pytest.mark.parametrize(
    "text,says",
    [
        (None, "not a Python file"),
        ("def broken(:\n", "SyntaxError"),
        ("x = 1\n", "no subclass"),
        ("raise RuntimeError('at import')\n", "RuntimeError"),
        (
            "from engine.core.policy import Policy\nclass P(Policy):\n    name = 'Bad Name'\n",
            "lowercase",
        ),
        (
            "from engine.core.policy import Policy\nclass P(Policy):\n    name = 'continuous'\n",
            "already registered",
        ),
        (
            "from engine.core.policy import Policy\nclass P(Policy):\n    name = 'p'\n"
            "    def __init__(self):\n        raise OSError('no state file')\n",
            "cannot be created: OSError",
        ),
    ],
)
def test_a_bad_policy_file_is_a_coded_error(tmp_path, text, says):
    path = tmp_path / "p.py"
    if text is not None:
        path.write_text(text)
    with pytest.raises(FluxoError) as info:
        load_file(path)
    assert info.value.code == "invalid_policy" and says in info.value.message
