"""Synthetic chat traffic: Poisson arrivals of bundled prompts with a chosen output-length law.

The server runs one generator at a time (presenter-controlled); the lessons' ``[traffic]`` tables
use the same vocabulary, validated here, so a lesson can start exactly its traffic on the page.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any

from engine.core.errors import InvalidConfig
from engine.core.numbers import is_finite, is_int
from engine.workloads.canonical import CHAT_PROMPTS, LONG_CONTEXT, mixed_is_long

PROMPT_SETS = ("chat", "long", "mixed")
LENGTH_LAWS = ("natural", "lognormal", "uniform")
MAX_RATE = 500.0  # requests/s: room for a GPU's capacity, and still a bounded generator
MAX_LOAD = 10.0  # x capacity
CLIENT = "traffic"  # the client id of generated requests: the page tells them from people's


@dataclass(slots=True)
class TrafficParams:
    rate: float = 1.0  # requests per second, Poisson
    # The offered load as a multiple of this engine's capacity for this traffic (the requests/s
    # at which it would be 100 % busy: engine/workloads/capacity.py). When given, the server
    # sets ``rate`` from it once, against the configuration in force when the traffic starts,
    # so a lesson's later switches (more slots, paged KV) meet the same arrivals.
    load: float | None = None
    prompts: str = "chat"
    lengths: str = "lognormal"
    median: int = 40
    sigma: float = 1.0
    max_tokens: int = 256
    seed: int = 0

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> TrafficParams:
        """Validate a ``traffic`` start message (or a lesson's ``[traffic]`` table)."""
        p = cls()
        for name in ("rate", "sigma", "load"):
            if name in msg:
                v = msg[name]
                if not is_finite(v):
                    raise InvalidConfig(f"traffic {name} must be a number, got {v!r}")
                setattr(p, name, float(v))
        for name in ("median", "max_tokens", "seed"):
            if name in msg:
                v = msg[name]
                if not is_int(v):
                    raise InvalidConfig(f"traffic {name} must be an integer, got {v!r}")
                setattr(p, name, v)
        for name, allowed in (("prompts", PROMPT_SETS), ("lengths", LENGTH_LAWS)):
            if name in msg:
                if msg[name] not in allowed:
                    raise InvalidConfig(
                        f"traffic {name} must be one of {', '.join(allowed)}, got {msg[name]!r}"
                    )
                setattr(p, name, msg[name])
        if not 0 < p.rate <= MAX_RATE:
            raise InvalidConfig(f"traffic rate must be in (0, {MAX_RATE}] requests/s, got {p.rate}")
        if p.load is not None and not 0 < p.load <= MAX_LOAD:
            raise InvalidConfig(f"traffic load must be in (0, {MAX_LOAD}] x capacity, got {p.load}")
        if not 1 <= p.max_tokens <= 1024:
            raise InvalidConfig(f"traffic max_tokens must be in [1, 1024], got {p.max_tokens}")
        if not 1 <= p.median <= p.max_tokens:
            raise InvalidConfig(
                f"traffic median must be in [1, max_tokens={p.max_tokens}], got {p.median}"
            )
        if not 0 <= p.sigma <= 3:
            raise InvalidConfig(f"traffic sigma must be in [0, 3], got {p.sigma}")
        return p

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Arrival:
    delay_s: float  # since the previous arrival
    prompt: str
    max_new_tokens: int
    ignore_eos: bool


def _long_prompt(rng: random.Random) -> str:
    """A report of two to four paragraphs (~160-330 tokens) and a question: a real prefill spike."""
    return LONG_CONTEXT * rng.randint(2, 4) + "\n" + rng.choice(CHAT_PROMPTS)


class TrafficSource:
    """The seeded stream of arrivals a ``TrafficParams`` describes (the same seed, the same
    traffic)."""

    def __init__(self, params: TrafficParams) -> None:
        self.params = params
        self._rng = random.Random(params.seed)

    def next(self) -> Arrival:
        p, rng = self.params, self._rng
        delay = rng.expovariate(p.rate)
        if p.prompts == "long" or (p.prompts == "mixed" and mixed_is_long(rng)):
            prompt = _long_prompt(rng)
        else:
            prompt = rng.choice(CHAT_PROMPTS)
        if p.lengths == "natural":
            return Arrival(delay, prompt, p.max_tokens, False)
        if p.lengths == "uniform":
            return Arrival(delay, prompt, p.median, True)
        n = round(rng.lognormvariate(math.log(p.median), p.sigma))
        return Arrival(delay, prompt, int(min(p.max_tokens, max(min(8, p.max_tokens), n))), True)
