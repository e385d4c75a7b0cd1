"""What a step should cost on this machine when nothing else runs: the stall chart's yardstick.

A step's measured duration mixes two causes the lab must keep apart: the work the scheduler put
in it (an admitted prompt's prefill makes everyone's next token late: an admission stall) and
the machine (the page, a browser or another process taking the cores: a step slowed by load).
Each step record carries ``expected_s``: the duration this model predicts for the step's work,
so the page shows measured against expected, and a spike with no work behind it is the machine.

The forward's cost is close to linear in four counts of the flat ragged batch:

    compute_s = c0 + c_tok * tokens + c_row * logit_rows + c_attn * attention_pairs

``tokens`` rows go through every projection and MLP (the weights are read once per step, so c0
is large on a CPU), ``logit_rows`` through the 49,152-wide LM head, and ``attention_pairs``
(sum over sequences of new tokens x context) through attention. The fit is a *lower envelope*:
load only ever adds time, so after a first least-squares fit the model is refitted on the half
of the samples that ran fastest relative to it, twice. Samples come from a short calibration
run at server start (``Engine.calibrate``, a few prompts of different sizes on a quiet machine)
and from every step since (a rolling window), so the model follows the machine if it changes.
Host work outside the forward (prepare, token copy, streaming) is expected at its recent lower
quartile. Fitting costs ~0.2 ms every 16 steps.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from engine.core.errors import FluxoError


@dataclass(frozen=True, slots=True)
class StepWork:
    """The counts of one step's flat batch that its compute cost follows."""

    tokens: int  # rows of the flat batch (decode rows, dead rows, prefill tokens)
    logit_rows: int  # rows that go through the LM head
    attention_pairs: int  # sum over sequences of new tokens x (cached + new) tokens

    def features(self) -> list[float]:
        return [1.0, float(self.tokens), float(self.logit_rows), self.attention_pairs / 1000.0]


class CostModel:
    def __init__(self, window: int = 384, refit_every: int = 16, min_samples: int = 12) -> None:
        self.pinned: list[tuple[list[float], float]] = []  # calibration samples, kept for good
        self.recent: deque[tuple[list[float], float]] = deque(maxlen=window)
        self.host: deque[float] = deque(maxlen=64)
        self.coef: np.ndarray | None = None
        self.refit_every, self.min_samples = refit_every, min_samples
        self._since_fit = 0

    @property
    def ready(self) -> bool:
        return self.coef is not None

    def observe(self, work: StepWork, compute_s: float, host_s: float, pin: bool = False) -> None:
        sample = (work.features(), compute_s)
        (self.pinned if pin else self.recent).append(sample)
        self.host.append(host_s)
        self._since_fit += 1
        if self._since_fit >= self.refit_every or (self.coef is None and self._spans_shapes()):
            self.fit()

    def _spans_shapes(self) -> bool:
        """Enough samples, and different enough batch sizes, to separate the coefficients."""
        xs = [x[1] for x, _ in self.pinned] + [x[1] for x, _ in self.recent]
        return len(xs) >= self.min_samples and max(xs) >= 4 * max(1.0, min(xs))

    def fit(self) -> None:
        self._since_fit = 0
        if not self._spans_shapes():
            return
        samples = self.pinned + list(self.recent)
        x = np.array([s[0] for s in samples])  # [n, 4]
        y = np.array([s[1] for s in samples])  # [n]
        keep = np.ones(len(y), dtype=bool)
        coef = _nonneg_lstsq(x, y)
        for _ in range(2):  # the lower envelope: refit on the faster half relative to the fit
            ratio = y / np.maximum(x @ coef, 1e-6)
            keep = ratio <= np.median(ratio)
            if keep.sum() < 4:
                break
            coef = _nonneg_lstsq(x[keep], y[keep])
        self.coef = coef

    def predict_compute(self, work: StepWork) -> float | None:
        if self.coef is None:
            return None
        return float(np.dot(self.coef, work.features()))

    def expected(self, work: StepWork) -> float | None:
        """Expected step duration: the forward's predicted cost plus host work at its recent
        lower quartile."""
        compute = self.predict_compute(work)
        if compute is None:
            return None
        host = float(np.percentile(list(self.host), 25)) if self.host else 0.0
        return compute + host


def itl_chunk_budget(
    model: CostModel,
    decodes: int,
    context: int,
    prompt: int,
    factor: float = 2.0,
    most: int = 1024,
) -> int | None:
    """The largest chunk budget (decode rows included, as the chunked policy counts it) whose step
    the model prices at most ``factor`` times a decode-only step of ``decodes`` rows at ``context``
    tokens each, with the chunk at the end of a ``prompt``-token prompt (its costliest place):
    Sarathi-Serve's token budget from an inter-token-latency target, on this machine's own
    costs. None before the model is fitted."""
    base = model.predict_compute(StepWork(decodes, decodes, decodes * context))
    if base is None:
        return None
    best = decodes + 1
    for budget in range(decodes + 1, most + 1):
        c = budget - decodes
        pairs = decodes * context + c * max(prompt, c)
        if model.predict_compute(StepWork(budget, decodes + 1, pairs)) > factor * base:
            break
        best = budget
    return best


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: drop the most negative one and refit."""
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            return coef
        del active[int(np.argmin(sol))]
    return coef


CALIBRATION_ROUNDS = ((1, 24), (4, 48), (8, 96), (2, 384))  # (requests, prompt tokens) per round


@runtime_checkable
class Calibrated(Protocol):
    """What ``calibrate`` uses of ``engine.core.engine.Engine`` (which satisfies it)."""

    config: Any  # EngineConfig
    cost_model: CostModel
    telemetry: Any  # Telemetry
    tokenizer: Any
    calibrating: bool
    calibrations: int
    step_count: int

    def submit(self, **kwargs: Any) -> Any: ...
    def run_until_idle(self) -> int: ...


def calibrate(
    engine: Calibrated, rounds: tuple[tuple[int, int], ...] = CALIBRATION_ROUNDS
) -> float:
    """Run on ``engine`` (an idle ``Engine``, before serving) a few prompts of different sizes
    (``(requests, prompt tokens)`` per round, 6 new tokens each) so its cost model knows this
    machine's quiet step costs. The calibration steps are then dropped from the telemetry.
    Returns the seconds it took (~3 s for SmolLM2 on 2 cores)."""
    t0 = time.perf_counter()
    base = engine.tokenizer.encode("The weights are read once per step, whatever the batch. ") or [
        1
    ]
    engine.calibrating = True
    try:
        for n, length in rounds:
            ids = (base * (length // len(base) + 1))[: min(length, engine.config.max_model_len - 8)]
            for i in range(n):
                try:  # a different first token each: no prompt shares a cached prefix with another
                    first = (engine.calibrations + i) % max(1, len(base))
                    engine.submit(
                        token_ids=[base[first]] + [7 + i] + ids[2:],
                        max_new_tokens=6,
                        ignore_eos=True,
                        client="calibration",
                    )
                except FluxoError:  # a small KV budget or context: skip the sizes that cannot fit
                    break
            engine.calibrations += n
            engine.run_until_idle()
    finally:
        engine.calibrating = False
    engine.cost_model.fit()
    engine.telemetry.clear()
    engine.step_count = 0
    return time.perf_counter() - t0
