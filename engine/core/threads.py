"""A busy neighbour costs its share, not ten times: the forward's thread count follows the machine.

The forward runs one OpenMP team over the engine's cores, and every step ends at a barrier, so a
step is as slow as its slowest thread. When another process takes one of the cores (a student's
browser, ``taskset -c 1 yes``), the thread on it runs a fraction of each time slice and every
step waits for it: on this project's 2-core machine ``bench batching --weights q4`` fell from 598
to 235 tokens/s (0.39x) and ITL p99 rose from 28 to 178 ms, where losing one core of two should
cost about half. One thread fewer runs on the cores the neighbour leaves.

The tuner watches each step's compute time against what the cost model expects for its work
(``engine/core/cost_model.py``, calibrated quiet): the median ratio over the last ``WINDOW``
steps. Past ``SLOW`` (steps 1.5x their quiet cost), it tries one thread fewer for a window and
keeps whichever ran faster for the work; below the full count, it tries the full team again every
``RETRY_S`` seconds, so the engine takes its cores back when the neighbour leaves. Quiet steps
never trigger it, a one-thread engine (the lab pins one to its own core) never has it, and each
change is a telemetry event (``threads``) the page and the logs can show.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from statistics import median

log = logging.getLogger("fluxo.engine")
ENABLED = False  # set by the entry points (``enable``); tests and library use keep their threads
_REDUCED_FROM: list[int] = []  # the full team, while a tuner runs fewer (a new engine restores it)

WINDOW = 24  # steps per judgement (~0.1-0.3 s of decode steps)
SLOW = 1.5  # median compute / expected past which the full team is suspected
BETTER = 0.9  # a trial is kept when its median ratio is under this share of the one it left
RETRY_S = 5.0  # below the full team: how often the full team is tried again


def enable() -> None:
    """Let every CPU engine this process makes adapt its thread count (``python -m engine.serve``,
    ``engine.bench``, ``engine.lesson``, ``engine.policy score``, and so ``make lab``)."""
    global ENABLED
    ENABLED = True


def for_engine(device_kind: str) -> ThreadTuner | None:
    """A tuner for a new engine on ``device_kind``: None unless enabled, on the CPU, with more
    than one thread. An earlier engine's reduction is undone first: each starts with the team."""
    if not ENABLED or device_kind != "cpu":
        return None
    import torch

    from engine.core import device

    if _REDUCED_FROM:
        device.run(torch.set_num_threads, _REDUCED_FROM.pop())
    most = device.run(torch.get_num_threads)

    def set_threads(n: int) -> None:
        _REDUCED_FROM[:] = [most] if n < most else []
        device.submit(torch.set_num_threads, n)  # between steps, on the thread that computes

    return ThreadTuner(most, set_threads)


class ThreadTuner:
    """Chooses the forward's thread count from the steps' measured / expected compute time."""

    def __init__(self, most: int, set_threads: Callable[[int], None]) -> None:
        self.most = self.threads = most
        self._set = set_threads
        self._ratios: list[float] = []
        self._trial_from: tuple[int, float] | None = None  # (threads, their median) while trying
        self._since = float("-inf")  # when the current count was chosen

    @property
    def active(self) -> bool:
        return self.most > 1

    def step(self, spans: list[dict], work, cost_model, telemetry, t_end: float) -> None:
        """After one step: its compute span against the cost model's price for its ``work``; a
        change of the thread count is a telemetry event (``threads``)."""
        compute = [s["end"] - s["start"] for s in spans if s["lane"] == "compute"]
        if compute and work is not None:
            why = self.observe(compute[0], cost_model.predict_compute(work), t_end)
            if why:
                telemetry.event(t_end, "threads", threads=self.threads, why=why)

    def observe(self, compute_s: float, expected_s: float | None, now: float) -> str | None:
        """One step's compute time and its quiet expectation; returns why the count changed, or
        None."""
        if not self.active or not expected_s or expected_s <= 0:
            return None
        self._ratios.append(compute_s / expected_s)
        if len(self._ratios) < WINDOW:
            return None
        ratio, self._ratios = median(self._ratios), []
        if self._trial_from is not None:  # a trial window ended: keep the faster of the two
            before, before_ratio = self._trial_from
            self._trial_from = None
            if ratio < BETTER * before_ratio:
                return self._choose(self.threads, now, f"kept: {ratio:.2f} vs {before_ratio:.2f}")
            return self._choose(before, now, f"back: {ratio:.2f} vs {before_ratio:.2f}")
        if now - self._since < RETRY_S:  # a choice stands a while: no thrashing
            return None
        if self.threads == self.most and ratio > SLOW:
            return self._try(self.threads - 1, ratio, now, f"steps at {ratio:.2f}x their cost")
        if self.threads < self.most:
            return self._try(self.most, ratio, now, "the full team again")
        return None

    def _try(self, threads: int, ratio: float, now: float, why: str) -> str:
        self._trial_from = (self.threads, ratio)
        return self._choose(threads, now, f"trying {threads}: {why}")

    def _choose(self, threads: int, now: float, why: str) -> str:
        if threads != self.threads:
            self.threads = threads
            self._set(threads)
        self._since = now
        log.info("forward threads: %d (%s)", threads, why)
        return why
