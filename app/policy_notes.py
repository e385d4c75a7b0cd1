"""Which hook decided: Step by step's words for a step of a loaded policy (``--policy-file``).

A step record names its ``policy``, the hooks whose answers were that policy's own (``decided``,
in the order first asked: ``engine/core/policy/check.py``'s ``Guard``) and, in its ``events``, each
decision the engine refused (``policy_error``: that hook and the rest of the step were decided by
the continuous defaults). A built-in's step gets no notes: the page's own words say why it admits.
Records older than ``decided`` say only what was refused. Nothing here draws: the page does.
"""

from __future__ import annotations

from app.ui import plain
from engine.core.policy.registry import BUILTIN_NAMES


def loaded(rec: dict) -> bool:
    return rec.get("policy") not in BUILTIN_NAMES


def refusals(rec: dict) -> list[dict]:
    return [ev for ev in rec.get("events", ()) if ev.get("kind") == "policy_error"]


def notes(rec: dict, w: dict[str, str]) -> list[tuple[str, str]]:
    """(level, markdown) lines: ``info`` for each hook the policy decided, ``error`` for each
    refusal, ``caption`` when it decided nothing itself; none for a built-in."""
    if not loaded(rec):
        return []
    name = plain(rec["policy"])
    decided = rec.get("decided")
    lines = [
        ("info", w["decided_line"].format(hook=h, policy=name, what=w["hook_" + h]))
        for h in decided or ()
    ]
    for ev in refusals(rec):
        fields = {k: plain(ev.get(k, "?")) for k in ("hook", "code", "error")}
        lines.append(("error", w["decided_refused"].format(policy=name, **fields)))
    if decided == [] and len(lines) == 0:
        lines.append(("caption", w["decided_none"].format(policy=name)))
    return lines


def admitted_why(rec: dict, w: dict[str, str]) -> str:
    """Why a request was admitted this step, in the words of its policy's decision."""
    if not loaded(rec):
        return w.get("why_" + rec["policy"], "")
    key = "why_loaded" if "admit" in (rec.get("decided") or ()) else "why_loaded_default"
    return w[key].format(policy=plain(rec["policy"]))


def preempted_line(rec: dict, rid: int, w: dict[str, str]) -> str:
    if loaded(rec) and "preempt" in (rec.get("decided") or ()):
        return w["preempted_by"].format(rid=rid, policy=plain(rec["policy"]))
    return w["preempted"].format(rid=rid)
