"""A busy neighbour costs its share, not ten times: the forward's thread count follows the machine.

The forward runs one OpenMP team over the engine's cores, and every step ends at a barrier, so a
step is as slow as its slowest thread. When another process takes one of the cores (a student's
browser, ``taskset -c 1 yes``), the thread on it runs a fraction of each time slice and every
step waits for it: on this project's 2-core machine ``bench batching --weights q4`` fell from 598
to 235 tokens/s (0.39x) and ITL p99 rose from 28 to 178 ms, where losing one core of two should
cost about half. One thread fewer runs on the cores the neighbour leaves.

One tuner per process (the thread count is the process's) watches each step's compute time
against what the cost model prices its work at (``engine/core/cost_model.py``): the median ratio
over ``WINDOW`` steps. It tries the other count (one thread fewer, or the full team again) for
``TRIAL`` steps, priced on the model frozen as the trial began, and keeps whichever ran faster for
the work: at once where steps run past ``SLOW`` times their quiet cost (a calibrated server sees a
neighbour arrive), else when due (a fresh engine's model learns loaded steps as its own). Due
means ``RETRY_S`` after a choice, ``KEEP_S`` after fewer threads won, doubling up to
``RETRY_MAX_S`` while the choice holds: a retry of the full team under the neighbour costs a dozen
slow steps, and rare retries keep them out of ITL p99, while the engine still takes its cores
back when the neighbour leaves. Engines made one after another (a benchmark's runs) inherit what
the last one found. A one-thread engine (the lab pins one to its own core) has no tuner, and
each change is a telemetry event (``threads``) the page and the logs can show.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from statistics import median

from engine.core.cost_model import CostModel, FrozenCostModel, StepWork
from engine.core.records import SpanRecord

log = logging.getLogger("fluxo.engine")
ENABLED = False  # set by the entry points (``enable``); tests and library use keep their threads
_TUNER: list[ThreadTuner] = []  # the process's one tuner, made by the first CPU engine

WINDOW = 16  # steps per judgement (~0.1-0.2 s of decode steps)
TRIAL = 12  # steps a trial of another count runs
SLOW = 1.5  # median compute / expected past which the full team is suspected
BETTER = 0.9  # a trial is kept when its median ratio is under this share of the one it left
RETRY_S, RETRY_MAX_S = 5.0, 120.0  # a choice stands this long, doubling while it keeps winning
KEEP_S = 30.0  # fewer threads won: the full team is tried again no sooner


def enable() -> None:
    """Let every CPU engine this process makes adapt its thread count (``python -m engine.serve``,
    ``engine.bench``, ``engine.lesson``, ``engine.policy score``, and so ``make lab``), unless
    ``FLUXO_ADAPT_THREADS=0`` (to measure the fixed team, as the before column of the note did)."""
    global ENABLED
    ENABLED = os.environ.get("FLUXO_ADAPT_THREADS", "1") != "0"


def for_engine(device_kind: str) -> ThreadTuner | None:
    """The process's tuner for a new engine on ``device_kind``: None unless enabled, on the CPU,
    with more than one thread."""
    if not ENABLED or device_kind != "cpu":
        return None
    if not _TUNER:
        import torch

        from engine.core import device

        most = device.run(torch.get_num_threads)
        # between steps, on the thread that computes
        _TUNER.append(ThreadTuner(most, lambda n: device.submit(torch.set_num_threads, n)))
    return _TUNER[0] if _TUNER[0].active else None


class ThreadTuner:
    """Chooses the forward's thread count from the steps' measured / expected compute time."""

    def __init__(
        self, most: int, set_threads: Callable[[int], object], clock=time.monotonic
    ) -> None:
        self.most = self.threads = most
        self._set, self._clock = set_threads, clock
        self._samples: list[tuple[float, StepWork]] = []  # (compute seconds, work) since a verdict
        # While trying another count: the count it left, the yardstick both are priced on (the
        # model frozen when the trial began: a fresh engine's model refits every 16 steps, and
        # the comparison must not move with it) and the left count's median on it.
        self._trial: tuple[int, CostModel, float] | None = None
        self._since = float("-inf")  # when the current count was chosen
        self._wait = RETRY_S  # how long it stands

    @property
    def active(self) -> bool:
        return self.most > 1

    def step(self, spans: list[SpanRecord], work, cost_model, telemetry, t_end: float) -> None:
        """After one step: its compute span and its ``work`` (priced by the cost model); a change
        of the thread count is a telemetry event (``threads``) at ``t_end``."""
        compute = [s["end"] - s["start"] for s in spans if s["lane"] == "compute"]
        if compute and work is not None and cost_model.ready:
            why = self.observe(compute[0], work, cost_model)
            if why:
                telemetry.event(t_end, "threads", threads=self.threads, why=why)

    def observe(self, compute_s: float, work: StepWork, model: CostModel) -> str | None:
        """One step's compute time and work; returns why the count changed, or None."""
        if not self.active:
            return None
        self._samples.append((compute_s, work))
        if len(self._samples) < (TRIAL if self._trial else WINDOW):
            return None
        samples, self._samples, now = self._samples, [], self._clock()
        if self._trial is not None:  # a trial ended: keep the faster of the two, on one yardstick
            before, yardstick, before_ratio = self._trial
            self._trial = None
            ratio = _ratio(samples, yardstick)
            kept = ratio < BETTER * before_ratio
            # The next trial waits: little once the full team won its cores back, at least
            # KEEP_S once fewer threads won (a retry of the full team under the neighbour costs a
            # dozen slow steps: in a 3 s benchmark run, its ITL p99), twice as long each time the
            # choice holds.
            if kept and self.threads == self.most:
                self._wait = RETRY_S
            else:
                floor = KEEP_S if kept else 0.0
                self._wait = min(RETRY_MAX_S, max(floor, 2 * self._wait))
            why = f"{ratio:.2f} vs {before_ratio:.2f} at {before}"
            return self._choose(
                self.threads if kept else before, now, ("kept: " if kept else "back: ") + why
            )
        # A choice stands a while (no thrashing); then the other count is tried, at once where
        # the steps run far over their quiet cost (a calibrated server sees a neighbour arrive),
        # else when it is due (a fresh engine's model has learned the loaded steps as its own)
        ratio, waited = _ratio(samples, model), now - self._since
        if self.threads == self.most and (
            waited >= self._wait or (ratio > SLOW and waited >= RETRY_S)
        ):
            return self._try(self.threads - 1, samples, model, now, f"steps at {ratio:.2f}x")
        if self.threads < self.most and waited >= self._wait:
            return self._try(self.most, samples, model, now, "the full team again")
        return None

    def _try(self, threads: int, samples: list, model: CostModel, now: float, why: str) -> str:
        yardstick = FrozenCostModel(model)
        self._trial = (self.threads, yardstick, _ratio(samples, yardstick))
        return self._choose(threads, now, f"trying {threads}: {why}")

    def _choose(self, threads: int, now: float, why: str) -> str:
        if threads != self.threads:
            self.threads = threads
            self._set(threads)
        self._since = now
        log.info("forward threads: %d (%s)", threads, why)
        return why


def _ratio(samples: list[tuple[float, StepWork]], model: CostModel) -> float:
    """The median of measured over priced compute time, over ``samples``."""
    return median(c / max(model.predict_compute(w) or 0.0, 1e-9) for c, w in samples)
