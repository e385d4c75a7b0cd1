"""The lessons' canonical workloads: seeded, named, replayed by the lessons and the page's compare.

A workload is a list of groups; each group is one kind of traffic (prompt set, count, arrival
pattern, output lengths). Scale < 1 shortens a run: a group shrinks its request count, its output
lengths, or both, whichever keeps the lesson's effect visible (its ``scale`` field says which).
Arrivals are in seconds, or in engine steps for a group with ``clock = "steps"``
(``engine/lab/stepclock.py``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from functools import partial
from typing import Any

from engine.core.errors import InvalidConfig
from engine.workloads.canonical import (
    CHAT_PROMPTS,
    WorkItem,
    lognormal_lengths,
    long_prompt,
    mixed_is_long,
)
from engine.workloads.prefix import document_prompt

Spec = dict[str, Any]


def _group(**fields: Any) -> Spec:
    base = {
        "prompts": "chat",
        "requests": 8,
        "arrival": "burst",
        "lengths": "uniform",
        "median": 32,
        "sigma": 1.0,
        "max_tokens": 256,
        "seed": 0,
        "scale": "requests",
    }
    base.update(fields)
    return base


# Canonical workloads. Each lesson's scenario.toml restates its [workload]; a test keeps them equal.
SPECS: dict[str, Spec] = {
    # Lesson 1: the same short chat requests at 1, 2, 4 and 8 slots.
    "sweep": {
        "engine": {"policy": "continuous", "max_slots": 8},
        "groups": [_group(requests=8, median=32, scale="lengths")],
    },
    # Lesson 2: a burst of chat requests, long-tailed forced lengths (seed 13: the lesson's notes).
    # A shorter run scales every length (a quarter keeps the tail: 2 to 32 tokens), not the count.
    "batching": {
        "engine": {"max_slots": 8, "fill_timeout_s": 0.0},
        "groups": [
            _group(
                requests=48,
                lengths="lognormal",
                median=16,
                sigma=1.5,
                max_tokens=128,
                seed=13,
                scale="lengths",
            )
        ],
    },
    # Lesson 2's control: the same burst with every answer the same length.
    "uniform": {
        "engine": {"max_slots": 8, "fill_timeout_s": 0.0},
        "groups": [_group(requests=24, median=32, scale="lengths")],
    },
    # NO_CACHE: the long prompts repeat one report, so with the prefix cache on every long prompt
    # after the first is read from it (bench stall, 2026-12-01: the 2nd-4th arrivals had 384 of
    # their 384 tokens cached) and the prefill these workloads show never happens. Lesson 10 is
    # where the cache is on.
    # Lesson 3: six long decodes; meanwhile ~384-token prompts arrive once a second.
    "stall": {
        "engine": {"max_slots": 8, "chunk_budget": 24, "prefix_cache": False},  # NO_CACHE
        "groups": [
            _group(requests=6, median=160, scale="lengths"),
            _group(
                prompts="long",
                prompt_tokens=384,
                requests=4,
                arrival="periodic",
                start_s=0.5,
                period_s=1.0,
                median=8,
            ),
        ],
    },
    # Lesson 4: chat answers of unknown length (natural EOS, capped at 128), a 40-block KV budget.
    "memory": {
        "engine": {"max_slots": 8, "kv_blocks": 40},
        "groups": [_group(requests=16, lengths="natural", max_tokens=128, scale="both")],
    },
    # Lesson 5: a decode-heavy steady state, 8 slots, greedy: both runners agree token for token.
    "overlap": {
        "engine": {"max_slots": 8},
        "groups": [_group(requests=8, median=96, scale="lengths")],
    },
    # Lesson 0: one request alone, a ~256-token prompt and a 32-token answer: prefill, then decode.
    "anatomy": {
        "engine": {"max_slots": 1, "prefix_cache": False},  # NO_CACHE
        "groups": [
            _group(prompts="long", prompt_tokens=256, requests=1, median=32, scale="lengths")
        ],
    },
    # Lesson 6: the same 16 requests, lengths drawn with growing spread (sigma 0 = all equal).
    **{
        f"spread-{sigma}": {
            "engine": {"max_slots": 8, "fill_timeout_s": 0.0},
            "groups": [
                _group(
                    requests=16,
                    lengths="lognormal",
                    median=16,
                    sigma=sigma,
                    max_tokens=128,
                    scale="lengths",
                )
            ],
        }
        for sigma in (0.0, 0.75, 1.5)
    },
    # Lesson 6: natural-length chat (cap 128), one KV budget of 48 blocks (768 tokens), 16 slots:
    # static+reserved -> continuous+reserved -> continuous+paged.
    "budget": {
        "engine": {"max_slots": 16, "kv_blocks": 48, "fill_timeout_s": 0.0},
        "groups": [_group(requests=24, lengths="natural", max_tokens=128, scale="both")],
    },
    # Lesson 7: Poisson arrivals of short chats (16 tokens) on 4 slots at 2, 5 and 10 requests/s.
    **{
        f"rate-{rate}": {
            "engine": {"max_slots": 4},
            "groups": [_group(requests=24, arrival="poisson", rate=float(rate), median=16)],
        }
        for rate in (2, 5, 10)
    },
    # Lessons 3 and 7 on the step clock: the long prompts arrive at steps 4, 12, 20, 28, so they
    # land among running answers however fast the machine is (in seconds, on a loaded machine the
    # first one arrived while the answers were still being prefilled).
    "stall-steps": {
        "engine": {"max_slots": 8, "chunk_budget": 24, "prefix_cache": False},  # NO_CACHE
        "groups": [
            _group(requests=6, median=160, scale="lengths", clock="steps"),
            _group(
                prompts="long",
                prompt_tokens=384,
                requests=4,
                arrival="periodic",
                start_s=4.0,
                period_s=8.0,
                median=8,
                clock="steps",
            ),
        ],
    },
    # Lesson 7's replay: the same stream on the engine's step clock (``clock = "steps"``: arrivals
    # in steps, the rate in requests per step), so how loaded the engine is does not depend on how
    # fast the shared machine happens to be. 4 slots x 16 tokens serve 0.25 requests per step.
    **{
        f"steps-{rate}": {
            "engine": {"max_slots": 4},
            "groups": [_group(requests=24, arrival="poisson", rate=rate, median=16, clock="steps")],
        }
        for rate in (0.1, 0.2, 0.4)
    },
    # Lesson 8: eight prompts of very different lengths at once (the "mixed" set: ~25 % long
    # reports of ~320 tokens), 16 forced tokens each: padded batch vs ragged (packed) steps.
    "ragged": {
        "engine": {"max_slots": 8, "prefix_cache": False},  # NO_CACHE (as lesson 8 runs it)
        "groups": [
            _group(
                prompts="mixed", prompt_tokens=320, requests=8, median=16, seed=2, scale="lengths"
            )
        ],
    },
    # Lesson 9: lesson 5's steady state with 15 ms of simulated host work in every step's prepare.
    "hostwork": {
        "engine": {"max_slots": 8, "host_work_ms": 15.0},
        "groups": [_group(requests=8, median=96, scale="lengths")],
    },
    # Lesson 10: questions over one shared ~400-token document, and chats (shared preamble),
    # Poisson arrivals, 16 forced tokens each: prefix cache off vs on, and on with little KV.
    "prefix": {
        "engine": {"max_slots": 8},
        "groups": [
            _group(prompts="document", requests=12, arrival="poisson", rate=4.0, median=16, seed=1),
            _group(requests=6, arrival="poisson", rate=2.0, median=16, seed=2),
        ],
    },
}
# The latency target goodput is counted against: a request meets it when every gap between two of
# its tokens is at most this long (a chat reads smoothly at ~7 tokens/s and faster).
ITL_TARGET_S = 0.15


def _prompts(group: Spec, tok, n: int) -> list[str]:
    kind = group["prompts"]
    if kind not in ("chat", "long", "mixed", "document"):
        raise InvalidConfig(f"unknown prompt set {kind!r}; choose chat, long, mixed or document")
    if kind == "document":  # questions over one shared document (engine/workloads/prefix.py)
        return [document_prompt(i) for i in range(n)]
    chat = [CHAT_PROMPTS[i % len(CHAT_PROMPTS)] for i in range(n)]
    if kind == "chat":
        return chat
    if kind == "long":
        return [long_prompt(int(group.get("prompt_tokens", 384)), tok, i) for i in range(n)]
    rng = random.Random(group["seed"])  # "mixed": the live traffic's definition (engine.workloads)
    return [
        long_prompt(int(group.get("prompt_tokens", 384)), tok, i) if mixed_is_long(rng) else chat[i]
        for i in range(n)
    ]


def _lengths(group: Spec, n: int, scale: float) -> list[int]:
    kind, hi = group["lengths"], int(group["max_tokens"])
    if kind == "lognormal":
        out = lognormal_lengths(n, group["median"], group["sigma"], 8, hi, group["seed"])
    elif kind == "uniform":
        out = [int(group["median"])] * n
    elif kind == "natural":  # a cap, not a length: the model stops at its end-of-turn token
        out = [hi] * n
    else:
        raise InvalidConfig(
            f"unknown length distribution {kind!r}; choose natural, lognormal or uniform"
        )
    # Scaling lengths keeps the step-count ratios between policies: the effect stays the same size
    # ("both": fewer requests and shorter answers; a natural length's cap scales too).
    return [max(1, round(x * scale)) for x in out] if group["scale"] in ("lengths", "both") else out


def _arrivals(group: Spec, n: int) -> list[float]:
    kind = group["arrival"]
    if kind == "burst":
        return [0.0] * n
    if kind == "periodic":
        return [group["start_s"] + i * group["period_s"] for i in range(n)]
    if (
        kind == "poisson"
    ):  # seeded exponential gaps (in steps on the step clock), as the server's traffic draws them
        rng, t, out = random.Random(group["seed"] + 1), 0.0, []
        for _ in range(n):
            t += rng.expovariate(group["rate"])
            out.append(t)
        return out
    raise InvalidConfig(f"unknown arrival pattern {kind!r}; choose burst, periodic or poisson")


def build_workload(spec: Spec, tok, scale: float = 1.0) -> list[WorkItem]:
    """All groups' items, in arrival order within each group (a run sorts them by arrival)."""
    items: list[WorkItem] = []
    for group in spec["groups"]:
        n = group["requests"]
        if group["scale"] in (
            "requests",
            "both",
        ):  # the prefix of the same seeded draw: a shorter run, same traffic
            n = max(1, math.ceil(n * scale))
        items += [
            WorkItem(p, m, a)
            for p, m, a in zip(  # noqa: B905
                _prompts(group, tok, n), _lengths(group, n, scale), _arrivals(group, n)
            )
        ]
    return items


def step_clock(spec: Spec) -> bool:
    """True when arrivals are counted in engine steps (``clock = "steps"``), not seconds."""
    return any(g.get("clock") == "steps" for g in spec["groups"])


def natural(spec: Spec) -> bool:
    """True when answers end at EOS; a workload mixing natural and forced lengths is refused."""
    kinds = {g["lengths"] == "natural" for g in spec["groups"]}
    if len(kinds) > 1:
        raise InvalidConfig("a workload's groups must all use natural lengths or all forced ones")
    return kinds == {True}


WORKLOADS: dict[str, Callable[[Any, float], list[WorkItem]]] = {
    name: partial(lambda spec, tok, scale=1.0: build_workload(spec, tok, scale), spec)
    for name, spec in SPECS.items()
}
