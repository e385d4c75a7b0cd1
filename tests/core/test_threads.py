"""The forward's thread count follows a busy neighbour (engine/core/threads.py): a full team whose
steps run far over their quiet cost tries one thread fewer, keeps it only if the work runs faster,
and tries the full team again later; quiet steps never move it."""

from __future__ import annotations

import numpy as np

from engine.core import threads
from engine.core.cost_model import CostModel, StepWork
from engine.core.threads import KEEP_S, RETRY_MAX_S, TRIAL, WINDOW, ThreadTuner

PRICED = CostModel()
PRICED.coef = np.array([0.004, 0.0, 0.0, 0.0, 0.0])  # every step priced at 4 ms
WORK = StepWork(8, 8, 800, 800)


class Machine:
    """Steps whose compute / expected ratio depends on the thread count, as a neighbour makes it."""

    def __init__(self, ratios: dict[int, float]) -> None:
        self.ratios, self.t, self.calls = ratios, 0.0, []
        self.tuner = ThreadTuner(2, self.calls.append, clock=lambda: self.t)

    def run(self, steps: int, dt: float = 0.01) -> list[str]:
        changes = []
        for _ in range(steps):
            self.t += dt
            ratio = self.ratios[self.tuner.threads]
            why = self.tuner.observe(ratio * 0.004, WORK, PRICED)
            if why:
                changes.append(why)
        return changes


def test_quiet_steps_keep_the_full_team():
    """A quiet machine: the one-thread trials lose, and come ever rarer (5, 10, 20, 40 s...)."""
    m = Machine({2: 1.1, 1: 1.7})
    m.run(int(80 / 0.01))
    assert m.tuner.threads == 2 and m.calls[:2] == [1, 2]
    assert 2 * 3 <= len(m.calls) <= 2 * 5  # trials at about 0, 10, 30 and 70 s, never kept


def test_a_neighbour_on_one_core_costs_a_thread_not_the_step():
    """2 threads with a neighbour: 2.5x the quiet cost; 1 thread on the free core: 1.7x."""
    m = Machine({2: 2.5, 1: 1.7})
    m.run(WINDOW)
    assert m.tuner.threads == 1 and m.calls == [1]  # tried
    m.run(TRIAL)
    assert m.tuner.threads == 1  # kept: 1.7 < 0.9 x 2.5
    m.run(int(0.9 * KEEP_S / 0.01))  # no retry of the full team before KEEP_S
    assert m.calls == [1]
    m.run(int(0.2 * KEEP_S / 0.01) + TRIAL + WINDOW)  # the full team tried again, and it lost
    assert m.calls == [1, 2, 1] and m.tuner.threads == 1
    # while the neighbour stays, each retry waits twice as long (a dozen slow steps each time:
    # rare enough to stay out of ITL p99)
    m.run(int(1.5 * KEEP_S / 0.01))
    assert m.calls == [1, 2, 1]
    m.ratios[2] = 1.05  # the neighbour leaves
    m.run(int(RETRY_MAX_S / 0.01) + TRIAL + WINDOW)
    assert m.tuner.threads == 2 and m.calls[-1] == 2  # the full team again, and kept


def test_a_slow_machine_that_one_thread_does_not_help_keeps_the_team():
    m = Machine({2: 2.0, 1: 3.4})  # loaded everywhere: fewer threads are only slower
    m.run(WINDOW + TRIAL)
    assert m.tuner.threads == 2 and m.calls == [1, 2]  # tried, measured, went back
    m.run(WINDOW * 3)  # and does not thrash: the next trial waits RETRY_S
    assert m.calls == [1, 2]


def test_only_entry_points_and_cpus_get_a_tuner():
    assert not threads.ENABLED  # tests keep their threads: nothing enables it in-process
    assert threads.for_engine("cpu") is None
    assert not ThreadTuner(1, lambda n: None).active  # one thread: nothing to tune


def test_a_refitting_model_does_not_decide_the_trial():
    """A fresh engine's model refits on the steps it sees: priced on the live model, a slower
    trial could look faster. The trial and the window before it share one frozen yardstick."""
    live = CostModel()
    live.coef = np.array([0.004, 0.0, 0.0, 0.0, 0.0])
    calls: list[int] = []
    tuner = ThreadTuner(2, calls.append, clock=lambda: 0.0)
    for _ in range(WINDOW):
        tuner.observe(0.006, WORK, live)  # 2 threads: 6 ms steps
    assert calls == [1]
    live.coef = live.coef * 3  # the model learns the slower steps meanwhile
    for _ in range(TRIAL):
        tuner.observe(0.009, WORK, live)  # 1 thread: 9 ms, slower
    assert calls == [1, 2] and tuner.threads == 2  # back: 9 ms is not faster than 6 ms
