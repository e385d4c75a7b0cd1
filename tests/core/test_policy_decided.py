"""Which hook decided: a step record's ``decided`` lists the hooks whose answers were a loaded
policy's own that step (the Step by step page says so); a refused hook and the rest of its step
are the continuous defaults', and a built-in decides nothing of the kind (tiny model)."""

from __future__ import annotations

import pytest

from engine.core import scheduler
from engine.core.policy import Policy, registry
from engine.core.policy.check import DEFAULTS, Guard, check_admit
from engine.core.policy.view import View

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Budgeted(Policy):
    name = "unit-decided"
    refuse_admit = False

    def token_budget(self, view):
        return 6

    def admit(self, view):
        if self.refuse_admit:
            return [10**9]  # not a waiting id
        return [w.id for w in sorted(view.waiting, key=lambda w: w.num_tokens)][: view.free_slots]


@pytest.fixture
def budgeted():
    registry.register(Budgeted)
    yield Budgeted
    registry.unregister(Budgeted.name)


def _submit(e, *lengths):
    for i, n in enumerate(lengths):
        e.submit(token_ids=[(5 * i + j) % 250 for j in range(n)], max_new_tokens=2)


def test_the_hooks_a_loaded_policy_answered_are_recorded(make_tiny_engine, budgeted):
    e = make_tiny_engine(policy="unit-decided", max_slots=2)
    _submit(e, 9, 3, 5)
    rec = e.step()
    # budget first, then the admission order; prefill_tokens is not overridden: not its decision
    assert rec["decided"] == ["token_budget", "admit"], rec["decided"]
    assert not [ev for ev in rec["events"] if ev["kind"] == "policy_error"]
    e.run_until_idle()


def test_a_refused_hook_is_not_the_policys_decision(make_tiny_engine, budgeted, monkeypatch):
    monkeypatch.setattr(Budgeted, "refuse_admit", True)
    e = make_tiny_engine(policy="unit-decided", max_slots=2)
    _submit(e, 9, 3, 5)
    rec = e.step()
    assert rec["decided"] == ["token_budget"]  # admit was refused: continuous admitted
    (err,) = [ev for ev in rec["events"] if ev["kind"] == "policy_error"]
    assert err["hook"] == "admit" and err["policy"] == "unit-decided"
    e.run_until_idle()


def test_a_builtin_decides_nothing_of_a_loaded_policys(make_tiny_engine):
    e = make_tiny_engine(policy="chunked", max_slots=2)
    _submit(e, 9, 3)
    assert e.step()["decided"] == []
    e.run_until_idle()


def test_the_guard_keeps_each_hook_once_in_first_asked_order():
    g = Guard(Budgeted())
    view = View(0.0, (), (), (2, 8, 4, 2, 8, 0.0), None, lambda *a: None, lambda f: None)
    for _ in range(2):
        assert g.call("admit", view, (), check_admit, (set(),)) == []
    assert g.decided == ["admit"] and not g.errors
    assert Guard(DEFAULTS).decided == [] and scheduler.HOOKS[-1] == "admit"
