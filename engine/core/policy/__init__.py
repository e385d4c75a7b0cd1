"""Scheduling policies: who is admitted, how many prompt tokens each computes, who is preempted.

A policy is a ``Policy`` subclass with a ``name`` and a few hooks (``base.py``) that read a
``View`` of the engine (``view.py``: the queue, the running requests, free slots and KV blocks,
the step's token budget, the clock) and answer a decision. The engine checks every answer
(``check.py``) and never lets one overdraw slots, blocks or the budget; the built-ins
(``builtin.py``) are written with the same hooks; ``registry.py`` names them and loads more from
this machine's files at start (``engine.serve --policy-file``). A shortest-prompt-first policy::

    from engine.core.policy import Policy

    class ShortestFirst(Policy):
        name = "spf"

        def admit(self, view):
            order = sorted(view.waiting, key=lambda w: w.num_tokens)
            return [w.id for w in order[: view.free_slots]]

Scoring one on a trace: ``python -m engine.policy score my_policy.py`` (``engine/lab/score.py``).
"""

from engine.core.policy.base import Policy
from engine.core.policy.registry import get, load_file, loaded, names, register
from engine.core.policy.view import Running, View, Waiting

__all__ = [
    "Policy",
    "Running",
    "View",
    "Waiting",
    "get",
    "load_file",
    "loaded",
    "names",
    "register",
]
