"""The hooks a scheduling policy implements. Each has a default, and the defaults together are the
continuous policy: a policy overrides only the decisions it wants to make.

The engine calls them in this order every step (``engine/core/scheduler.py``):

1. ``token_budget(view)``: how many tokens (decodes and prompt chunks together) this step may
   compute; None for no limit.
2. Running requests go first: each decode gets its one token; each request still prefilling gets
   ``prefill_tokens(view, request)`` prompt tokens (from 1 to ``view.tokens_left``, at most its
   ``pending``).
3. When a running request needs a KV block and none is free, ``preempt(view, candidates)`` names
   the running request sent back to the queue (its KV is recomputed when it is admitted again).
4. ``admit(view)``: the ids of waiting requests to admit, in order, at most ``view.free_slots``
   (asked when a request waits and a slot is free; under ``batch``, only while no batch is open).
   The engine admits them one after the other while KV and the budget allow, stopping at the
   first that does not fit; each admitted prompt gets ``prefill_tokens`` too.

Every hook is asked every step; one a policy does not override answers with the default below.

The engine, never the policy, hands out slots and blocks, so no decision can overdraw them; every
decision is checked (``engine/core/policy/check.py``) and one that breaks a rule, raises, or
computes for ``time_limit_s`` (its thread's CPU time) is refused: the rest of that step is decided
by these defaults, and the step record's events carry a ``policy_error``. Greedy tokens never
depend on a policy: it decides when each token is computed, never which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from engine.core.policy.view import Running, View, Waiting
from engine.core.records import HOOKS  # in the order a step asks them


class Policy:
    """Subclass it, give it a ``name``, override a hook or two. One instance per engine, so it may
    keep state across steps (counters per client, say)."""

    name: ClassVar[str] = ""
    # Gang scheduling (the static policy): ``admit`` is asked only while nothing runs, and a
    # member that ends keeps its slot and KV, computed as a dead slot, until every member has ended.
    batch: ClassVar[bool] = False
    # A hook that computes this long (its thread's CPU time), or waits ten times this long, is
    # refused. The engine cannot interrupt a hook: a slow one still delays its step, and one that
    # never returns stops the engine (policies are local code).
    time_limit_s: ClassVar[float] = 0.02
    # The built-ins: never timed (they are the fallback). A hook a policy does not override is
    # ``Policy``'s own, asked like the others and never timed either.
    trusted: ClassVar[bool] = False

    def token_budget(self, view: View) -> int | None:
        """Tokens this step may compute (decodes included), 1 to 65536; None: no limit."""
        return None

    def prefill_tokens(self, view: View, request: Running | Waiting) -> int:
        """Prompt tokens ``request`` computes this step: 1 to ``view.tokens_left`` (or its
        pending tokens when there is no budget), at most what it has pending."""
        pending = request.pending if isinstance(request, Running) else request.num_tokens
        return pending if view.tokens_left is None else min(pending, view.tokens_left)

    def preempt(self, view: View, candidates: Sequence[Running]) -> int:
        """The id of the running request (one of ``candidates``, admission order) to send back to
        the queue so another can grow. Default: the newest."""
        return candidates[-1].id

    def admit(self, view: View) -> Sequence[int]:
        """Ids of waiting requests to admit now, in order, at most ``view.free_slots``.
        Default: the queue's order (first come, first served)."""
        return [w.id for w in view.waiting[: view.free_slots]]


def own_hooks(cls: type[Policy]) -> frozenset[str]:
    """The hooks ``cls`` answers itself: those it overrides (the others are ``Policy``'s)."""
    return frozenset(h for h in HOOKS if getattr(cls, h) is not getattr(Policy, h))
