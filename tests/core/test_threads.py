"""The forward's thread count follows a busy neighbour (engine/core/threads.py): a full team whose
steps run far over their quiet cost tries one thread fewer, keeps it only if the work runs faster,
and tries the full team again later; quiet steps never move it."""

from __future__ import annotations

from engine.core import threads
from engine.core.threads import RETRY_S, WINDOW, ThreadTuner


class Machine:
    """Steps whose compute / expected ratio depends on the thread count, as a neighbour makes it."""

    def __init__(self, ratios: dict[int, float]) -> None:
        self.ratios, self.t, self.calls = ratios, 0.0, []
        self.tuner = ThreadTuner(2, self.calls.append)

    def run(self, steps: int, dt: float = 0.01) -> list[str]:
        changes = []
        for _ in range(steps):
            self.t += dt
            ratio = self.ratios[self.tuner.threads]
            why = self.tuner.observe(ratio * 0.004, 0.004, self.t)
            if why:
                changes.append(why)
        return changes


def test_quiet_steps_keep_the_full_team():
    m = Machine({2: 1.1, 1: 1.7})
    assert m.run(40 * WINDOW) == [] and m.tuner.threads == 2 and m.calls == []


def test_a_neighbour_on_one_core_costs_a_thread_not_the_step():
    """2 threads with a neighbour: 2.5x the quiet cost; 1 thread on the free core: 1.7x."""
    m = Machine({2: 2.5, 1: 1.7})
    m.run(WINDOW)
    assert m.tuner.threads == 1 and m.calls == [1]  # tried
    m.run(WINDOW)
    assert m.tuner.threads == 1  # kept: 1.7 < 0.9 x 2.5
    m.ratios[2] = 1.05  # the neighbour leaves
    m.run(int(RETRY_S / 0.01) + 2 * WINDOW)
    assert m.tuner.threads == 2 and m.calls[-1] == 2  # the full team again, and kept


def test_a_slow_machine_that_one_thread_does_not_help_keeps_the_team():
    m = Machine({2: 2.0, 1: 3.4})  # loaded everywhere: fewer threads are only slower
    m.run(2 * WINDOW)
    assert m.tuner.threads == 2 and m.calls == [1, 2]  # tried, measured, went back
    m.run(WINDOW * 3)  # and does not thrash: the next trial waits RETRY_S
    assert m.calls == [1, 2]


def test_only_entry_points_and_cpus_get_a_tuner():
    assert not threads.ENABLED  # tests keep their threads: nothing enables it in-process
    assert threads.for_engine("cpu") is None
    assert not ThreadTuner(1, lambda n: None).active  # one thread: nothing to tune
