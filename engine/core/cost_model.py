"""What a step should cost on this machine when nothing else runs: the stall chart's yardstick.

A step's measured duration mixes two causes the lab must keep apart: the work the scheduler put
in it (an admitted prompt's prefill makes everyone's next token late: an admission stall) and
the machine (the page, a browser or another process taking the cores: a step slowed by load).
Each step record carries ``expected_s``: the duration this model predicts for the step's work,
so the page shows measured against expected, and a spike with no work behind it is the machine.

The forward's cost is close to linear in five counts of the flat ragged batch:

    compute_s = c0 + c_tok * tokens + c_row * logit_rows
                + c_pre * prefill_pairs + c_dec * decode_pairs

``tokens`` rows go through every projection and MLP (the weights are read once per step, so c0
is large on a CPU), ``logit_rows`` through the 49,152-wide LM head, and attention pairs (sum over
sequences of new tokens x context) through attention, priced apart for prompt chunks and for
decode rows: a decode row reads its whole cache for one query, a prompt chunk shares each read
among its rows (on q4, 2 cores: ~3.5 ms against ~0.7 ms per 1,000 pairs, 2026-12-02; one price
for both was 2x off for decode at 450 tokens of context). The fit is a *lower envelope* in
relative terms: each sample weighs by its own duration (a 300 ms prefill does not drown the 3 ms
decode steps that make up most of serving), load only ever adds time, so after a first fit the
model is refitted on the half of the samples that ran fastest relative to it, twice. Fitted on
absolute error, the decode steps of a 1-slot run were predicted at half their measured time.
Samples come from a short calibration run at server start (``Engine.calibrate``, a few prompts
of different sizes on a quiet machine) and from every step since (a rolling window), so the
model follows the machine if it changes. Host work outside the forward (prepare, token copy,
streaming) is expected at its recent lower quartile. Fitting costs ~0.2 ms every 16 steps.
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
    decode_pairs: int = 0  # the part of attention_pairs that single-token rows attend

    def features(self) -> list[float]:
        prefill = self.attention_pairs - self.decode_pairs
        return [
            1.0,
            float(self.tokens),
            float(self.logit_rows),
            prefill / 1e3,
            self.decode_pairs / 1e3,
        ]


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
        x = np.array([s[0] for s in samples])  # [n, 5]
        y = np.array([s[1] for s in samples])  # [n]
        w = 1.0 / np.maximum(y, 1e-6)  # relative error: every step counts alike
        coef = _nonneg_lstsq(x * w[:, None], y * w)
        for _ in range(2):  # the lower envelope: refit on the faster half relative to the fit
            ratio = y / np.maximum(x @ coef, 1e-6)
            # the faster half, and every sample within 5 % of the fit: a shape that fits well is
            # never dropped whole by rounding (then its price could not be told apart)
            keep = ratio <= max(np.median(ratio), 1.05)
            if keep.sum() < 5:
                break
            coef = _nonneg_lstsq(x[keep] * w[keep, None], y[keep] * w[keep])
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


class FrozenCostModel(CostModel):
    """A fitted model that learns no more: one yardstick for several engines (a lesson's runs,
    each on a fresh engine, priced by the same calibration)."""

    def __init__(self, fitted: CostModel) -> None:
        super().__init__()
        self.coef = None if fitted.coef is None else fitted.coef.copy()
        self.host = deque(fitted.host, maxlen=fitted.host.maxlen)

    def observe(self, *args: Any, **kwargs: Any) -> None:
        return None


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
    base = model.predict_compute(StepWork(decodes, decodes, decodes * context, decodes * context))
    if base is None:
        return None
    best = decodes + 1
    for budget in range(decodes + 1, most + 1):
        c = budget - decodes
        pairs = decodes * context + c * max(prompt, c)
        work = StepWork(budget, decodes + 1, pairs, decodes * context)
        cost = model.predict_compute(work)
        assert cost is not None  # priced ``base`` above: fitted, and nothing refits it here
        if cost > factor * base:
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


# (requests, prompt tokens) per round, 8 new tokens each: decode steps of 1 and 8 rows at short
# context and of 4 rows at long context, prompt steps of 24 to 1,536 tokens and 1 to 8 rows, so
# each price has steps that move it alone (~2 s for SmolLM2 on 2 cores).
CALIBRATION_ROUNDS = ((1, 24), (8, 24), (1, 96), (4, 384))


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

    def submit(
        self, *, token_ids: list[int], max_new_tokens: int, ignore_eos: bool, client: str
    ) -> Any: ...
    def run_until_idle(self) -> int: ...


def calibrate(
    engine: Calibrated, rounds: tuple[tuple[int, int], ...] = CALIBRATION_ROUNDS
) -> float:
    """Run on ``engine`` (an idle ``Engine``, before serving) a few prompts of different sizes
    (``(requests, prompt tokens)`` per round, 8 new tokens each) so its cost model knows this
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
                        max_new_tokens=8,
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
