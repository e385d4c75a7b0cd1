"""Which cores the engine computes on, and with how many torch threads.

On a small machine the lab's page and a browser share the cores with the engine. Measured on the
project's 2-core machine, steady traffic, the engine stepping with 2 torch threads: step p50 43 ms
alone, 175 ms with one Live page open (an OpenMP thread that is descheduled stalls every parallel
region it belongs to). Giving the engine cores of its own (affinity) and as many torch threads as
it has cores keeps the page's load off the steps the lab measures. Serving alone keeps every core.

Affinity is set with ``os.sched_setaffinity`` (Linux) for every thread of the process, so threads
created later (torch's OpenMP pool, the device thread) inherit it; on Windows through psutil when
it is installed; elsewhere (macOS has no affinity API) only the thread count applies.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from engine.core.errors import InvalidConfig


def available() -> list[int]:
    """The cores this process may run on, sorted."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def can_pin() -> bool:
    if hasattr(os, "sched_setaffinity"):
        return True
    try:
        import psutil

        return hasattr(psutil.Process(), "cpu_affinity")
    except ImportError:
        return False


def parse(spec: str | None) -> tuple[int, ...] | None:
    """``"1,2"``, ``"1-3"`` or ``"0,2-3"`` -> a tuple of core ids; empty or None -> None."""
    if spec is None or not str(spec).strip():
        return None
    cores: set[int] = set()
    try:
        for part in str(spec).split(","):
            lo, dash, hi = part.strip().partition("-")
            cores.update(range(int(lo), int(hi if dash else lo) + 1))
    except ValueError:
        raise InvalidConfig(f"cpus must look like 1,2 or 1-3, got {spec!r}") from None
    if not cores or min(cores) < 0:
        raise InvalidConfig(f"cpus must name cores >= 0, got {spec!r}")
    return tuple(sorted(cores))


def pin_process(cpus: tuple[int, ...] | list[int], pid: int | None = None) -> bool:
    """Restrict every thread of process ``pid`` (this one by default) to ``cpus``. Returns False
    where the platform cannot pin. Raises ``InvalidConfig`` for cores the machine does not have."""
    cpus = sorted(set(cpus))
    if hasattr(os, "sched_setaffinity"):
        allowed = set(available()) if pid is None else set(os.sched_getaffinity(pid))
        if pid is None and not set(cpus) <= allowed:
            raise InvalidConfig(
                f"cpus {cpus} are not all available to this process (available: {sorted(allowed)})"
            )
        tasks = [pid or os.getpid()]
        task_dir = f"/proc/{pid or os.getpid()}/task"
        if os.path.isdir(task_dir):
            tasks = [int(t) for t in os.listdir(task_dir)]
        for tid in tasks:
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:  # a thread that just ended
                pass
        return True
    try:
        import psutil

        psutil.Process(pid).cpu_affinity(list(cpus))
        return True
    except (ImportError, AttributeError):
        return False


@dataclass(frozen=True, slots=True)
class Split:
    """How the lab launcher shares a machine: the engine's cores and threads, and the cores left
    to the page and a local browser (empty when nothing is reserved)."""

    engine_cpus: tuple[int, ...]
    engine_threads: int
    page_cpus: tuple[int, ...]
    pinned: bool

    def describe(self) -> str:
        if not self.page_cpus:
            return f"engine: {self.engine_threads} torch thread(s), all cores shared"
        how = "pinned to" if self.pinned else "sized for"
        return (
            f"engine: {self.engine_threads} torch thread(s) {how} core(s) "
            f"{_fmt(self.engine_cpus)}; "
            f"page and browser: core(s) {_fmt(self.page_cpus)}"
        )


def lab_split(cores: list[int] | None = None, pin: bool | None = None) -> Split:
    """Leave one core (two from 8 cores up) to the page and the browser, the rest to the engine."""
    cores = sorted(cores if cores is not None else available())
    pin = can_pin() if pin is None else pin
    if len(cores) < 2:
        return Split(tuple(cores), max(1, len(cores)), (), False)
    keep = 2 if len(cores) >= 8 else 1
    return Split(tuple(cores[keep:]), len(cores) - keep, tuple(cores[:keep]), pin)


def shared_split() -> Split:
    """``--no-pin``: every core shared by the engine, the page and a browser, a thread per core."""
    cores = tuple(available())
    return Split(cores, len(cores), (), False)


def _fmt(cpus: tuple[int, ...]) -> str:
    return ",".join(map(str, cpus))


def apply(threads: int | None, cpus: tuple[int, ...] | None) -> None:
    """Pin this process to ``cpus`` (when given) and set torch's thread count (``threads``, or one
    per pinned core). Call before the model loads: threads created later inherit the affinity."""
    import torch

    if cpus:
        pin_process(cpus)
        threads = threads or len(cpus)
    if threads:
        torch.set_num_threads(threads)


def platform_note() -> str:
    return "" if can_pin() else f"(no CPU affinity on {sys.platform}: only the thread count is set)"
