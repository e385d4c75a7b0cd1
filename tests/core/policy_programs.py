"""Policies for the property tests of the policy API (tests/core/test_policy_properties.py): a
random one whose every answer is valid, a hostile one whose answers are often wrong (bad types, ids
of requests not waiting or not running, more than the free slots, budgets out of range, exceptions),
and a slow one (every hook over its time bound); and a harness that checks, at every step, the
rules that hold under any policy.
"""

from __future__ import annotations

import random

import engine_contracts as contracts
from engine_harness import Harness

from engine.core.policy import Policy, registry


class RandomValid(Policy):
    """Answers drawn at random, each inside the rules."""

    name = "test-random"
    seed = 0

    def __init__(self) -> None:
        self.rng = random.Random(type(self).seed)
        self.last_budget: int | None = None

    def token_budget(self, view):
        self.last_budget = self.rng.choice([None, 1, 2, 3, 5, 8, 12, 64])
        return self.last_budget

    def prefill_tokens(self, view, request):
        most = view.tokens_left or 64
        return self.rng.randint(1, most)

    def preempt(self, view, candidates):
        return self.rng.choice(candidates).id

    def admit(self, view):
        ids = [w.id for w in view.waiting]
        self.rng.shuffle(ids)
        return ids[: self.rng.randint(0, view.free_slots)]


class Hostile(RandomValid):
    """Half of its answers break a rule or raise."""

    name = "test-hostile"

    def _bad(self, *choices):
        pick = self.rng.choice(choices)
        if pick == "raise":
            raise RuntimeError("a policy bug")
        return pick

    def token_budget(self, view):
        if self.rng.random() < 0.5:
            self.last_budget = self._bad(0, -3, 1 << 20, "7", 2.5, True, "raise")
            return self.last_budget
        return super().token_budget(view)

    def prefill_tokens(self, view, request):
        if self.rng.random() < 0.5:
            left = view.tokens_left
            return self._bad(0, -1, None, 1.5, 10**9, (left or 0) + 1, "raise")
        return super().prefill_tokens(view, request)

    def preempt(self, view, candidates):
        if self.rng.random() < 0.5:
            waiting = [w.id for w in view.waiting] or [10**9]
            return self._bad(waiting[0], 10**9, "x", None, "raise")
        return super().preempt(view, candidates)

    def admit(self, view):
        if self.rng.random() < 0.5:
            running = [r.id for r in view.running] or [10**9]
            every = [w.id for w in view.waiting]
            dup = every[:1] * 2
            return self._bad(running, every + every, dup, [10**9], None, 5, "raise")
        return super().admit(view)


class Slow(RandomValid):
    """Valid answers, every one over its time bound (0 s): each is refused."""

    name = "test-slow"
    time_limit_s = 0.0


POLICIES = (RandomValid, Hostile, Slow)
for _cls in POLICIES:
    registry.register(_cls)
NAMES = tuple(cls.name for cls in POLICIES)


class PolicyHarness(Harness):
    """The engine harness (tests/core/engine_harness.py) with the batch rules that hold under any
    policy; the built-ins' own (static admits only into an empty batch, the newest victim first,
    chunked's budget) are the plain harness's."""

    def check_batch(self, info: dict) -> None:
        cfg, batch = info["cfg"], info["batch"]
        if cfg["policy"] not in NAMES:
            return super().check_batch(info)
        self.note(info, batch)
        self.preempted.extend(s.id for s in batch.preempted)
        if batch.admitted:
            assert info["running_after"] <= cfg["max_slots"], "admitted past max_slots"
            assert info["used_after"] <= info["budget"], "admitted past the KV budget"
        assert info["live_after"] <= max(cfg["max_slots"], info["live_before"])
        assert info["used_after"] <= max(info["budget"], info["used_before"])
        assert not {s.id for s in batch.admitted} & {s.id for s in batch.preempted}
        for victim in batch.preempted:
            assert victim.id in info["live_order"], "preempted a sequence that was not running"
        policy = self.engine.scheduler.policy()[0]
        budget = getattr(policy, "last_budget", None)
        refused = [e for e in batch.errors if e["hook"] == "token_budget"]
        if isinstance(budget, int) and not isinstance(budget, bool) and 1 <= budget and not refused:
            assert sum(n for _, n in batch.items) <= budget, "over the policy's token budget"
        for error in batch.errors:
            assert error["code"] == "policy_error" and error["policy"] == cfg["policy"]
        contracts.check_pool(self.engine, self.handles)
