"""The three built-in policies, through the same hooks a student's policy uses.

- continuous: the defaults of ``Policy``, unchanged: every step running requests first, then the
  queue in arrival order while a slot and KV are free, each new prompt prefilled whole.
- chunked: as continuous under ``chunk_budget`` tokens a step (decodes first, prefill chunks after).
- static: gang scheduling (``batch``): a batch forms when ``max_slots`` requests wait or the oldest
  waited ``fill_timeout_s``, and nobody enters until every member has ended.

They are ``trusted``: the engine does not time them (they are what a refused step falls back to).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.policy.base import Policy
from engine.core.policy.view import View


class Continuous(Policy):
    name = "continuous"
    trusted = True


class Chunked(Policy):
    name = "chunked"
    trusted = True

    def token_budget(self, view: View) -> int | None:
        return view.chunk_budget


class Static(Policy):
    name = "static"
    trusted = True
    batch = True

    def admit(self, view: View) -> Sequence[int]:
        waiting = view.waiting
        full = len(waiting) >= view.max_slots
        if not full and not (waiting and view.now - waiting[0].arrival >= view.fill_timeout_s):
            return []  # the batch is not ready yet: wait for more requests
        return [w.id for w in waiting[: view.free_slots]]


BUILTINS: tuple[type[Policy], ...] = (Static, Continuous, Chunked)
