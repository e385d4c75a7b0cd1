"""Every decision a policy makes is checked before the engine acts on it.

``Guard.call`` runs one hook, times it and checks its answer; a refused answer (a rule broken, an
exception of any kind, ``SystemExit`` included, as much of its thread's CPU time as the policy's
``time_limit_s``, or ten times that on the wall clock) becomes a ``PolicyError`` kept for the step
record (an event of kind ``policy_error``), and the guard falls back: for the rest of that step
every hook answers as the continuous policy does.

A policy that is not ``trusted`` (a student's file) runs on ``HookThread``, never on the engine's
thread: the engine waits for the answer at most ten times the bound, so a hook that never returns
(``while True``, ``input()``) costs one step 200 ms, not the class. Such a hook is abandoned (a
pure-Python loop is also interrupted where it runs) and its policy refused, at once, for 5 s, then
10, 20 ... (at most 5 minutes) each time it is abandoned again: a hook the OS merely descheduled
costs one step and 5 s of the continuous policy, a hook that never returns 200 ms every while.
The hand-off costs about 20 us a hook (measured on this 2-core machine,
loaded), a few tenths of a percent of a step. The rules:

- ``token_budget``: None or an integer in [1, 65536];
- ``prefill_tokens``: an integer >= 1 and <= the tokens the budget has left (more than the request
  has pending is cut to what it has);
- ``preempt``: the id of one of the candidates it was offered (a running request);
- ``admit``: distinct ids of waiting requests, at most ``free_slots`` of them.
"""

from __future__ import annotations

import ctypes
import gc
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from engine.core.errors import PolicyError
from engine.core.numbers import is_int
from engine.core.policy.base import Policy, own_hooks
from engine.core.policy.view import View

MAX_BUDGET = 1 << 16
DEFAULTS = Policy()  # the continuous policy's answers, for a step that fell back


WAITING = 10  # a hook may wait (I/O, a lock, a sleep) up to this many times its bound


def _cpu_clock() -> Callable[[], float]:
    """What a hook's work is timed by: its own thread's CPU time, so a hook is charged for what it
    computes, never for the time the OS gave another process (on a loaded 2-core CI machine the
    wall clock once refused shortest-first's sort of a few waiting requests as over 20 ms). Where
    that clock ticks coarsely (Windows: 15.6 ms), the wall clock."""
    fine = time.get_clock_info("thread_time").resolution <= 1e-4
    return time.thread_time if fine else time.perf_counter


class Abandoned(BaseException):
    """Raised inside a hook the engine stopped waiting for, so its loop ends where it runs."""


class HookThread:
    """One thread that runs untrusted hooks, one at a time, for the engine's thread.

    ``run(fn, args, wait_s)``: ``(answer, cpu_s, wall_s)``; re-raises what the hook raised (a
    ``BaseException`` that is no ``Exception`` as a ``PolicyError``); raises ``TimeoutError`` after
    ``wait_s``, leaving that thread to its hook and starting a fresh one for the next call."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._start()

    def _start(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=self._serve, args=(self.jobs,), name="fluxo-policy", daemon=True
        )
        self.thread.start()

    def _serve(self, jobs: queue.SimpleQueue) -> None:
        try:
            while (job := jobs.get()) is not None:
                fn, args, done, out, began = job
                t0, w0 = self.clock(), time.perf_counter()
                began.append(w0)
                try:
                    out.append((fn(*args), self.clock() - t0, time.perf_counter() - w0))
                except Exception as exc:  # noqa: BLE001 - handed to the engine's thread
                    out.append(exc)
                except Abandoned:
                    return
                except BaseException as exc:  # noqa: BLE001 - SystemExit must not end the engine
                    out.append(PolicyError(f"{type(exc).__name__} raised: {exc}"[:200]))
                done.set()
        except Abandoned:  # it came after the hook returned
            return

    @staticmethod
    def _late(done: threading.Event, began: list, wait_s: float) -> bool:
        """Whether the hook is still running ``wait_s`` after it *began*: a loaded machine may
        not have run this thread yet (up to 2 s), which is not the hook's time."""
        deadline = time.perf_counter() + 2.0
        while not began and time.perf_counter() < deadline and not done.is_set():
            time.sleep(0.005)
        left = (began[0] + wait_s - time.perf_counter()) if began else 0.0
        return done.wait(max(0.0, left))

    def run(self, fn: Callable[..., Any], args: tuple, wait_s: float) -> tuple[Any, float, float]:
        done = threading.Event()
        out: list[Any] = []  # what the hook returned (with its times), or what it raised
        began: list[float] = []  # the hook thread's perf_counter as the hook began
        self.jobs.put((fn, args, done, out, began))
        if not done.wait(wait_s) and not self._late(done, began, wait_s):
            self.jobs.put(None)  # this thread ends once its hook returns, if ever
            ident = self.thread.ident
            if ident is not None:  # a pure-Python loop ends at its next bytecode
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(ident), ctypes.py_object(Abandoned)
                )
            self._start()
            raise TimeoutError
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]


_RUNNER: list[HookThread] = []  # made on the first untrusted hook: trusted-only engines never
# policies whose hook was abandoned -> (the policy, kept so its id() stays its own; refused until
# this monotonic time; times abandoned)
HUNG: dict[int, tuple[Policy, float, int]] = {}
BENCH_S, MOST_BENCH_S = 5.0, 300.0
MIN_WAIT_S = 0.05  # a policy bound near 0 is refused for its CPU time, not abandoned


def runner() -> HookThread:
    if not _RUNNER:
        _RUNNER.append(HookThread(_cpu_clock()))
    return _RUNNER[0]


def check_budget(value: Any, view: View) -> int | None:
    if value is None or (is_int(value) and 1 <= value <= MAX_BUDGET):
        return value
    raise PolicyError(f"token_budget: {value!r:.24} is not None or 1..{MAX_BUDGET}")


def check_prefill(value: Any, view: View, pending: int) -> int:
    left = view.tokens_left
    if not is_int(value) or value < 1 or (left is not None and value > left):
        raise PolicyError(f"prefill_tokens: {value!r:.24} is not in 1..{left or 'any'}")
    return min(value, pending)


def check_victim(value: Any, view: View, candidates: tuple[int, ...]) -> int:
    if not is_int(value) or value not in candidates:
        raise PolicyError(f"preempt: {value!r:.24} is not a running candidate")
    return value


def check_admit(value: Any, view: View, waiting: set[int]) -> list[int]:
    try:
        ids = list(value)
    except TypeError:
        raise PolicyError(f"admit: not a list of request ids: {value!r:.16}") from None
    if len(ids) > view.free_slots:
        raise PolicyError(f"admit: {len(ids)} ids, only {view.free_slots} slots are free")
    if len(set(ids)) != len(ids) or not all(is_int(i) and i in waiting for i in ids):
        raise PolicyError(f"admit: not distinct waiting ids: {ids[:4]!r:.24}")
    return ids


class Guard:
    """Calls one policy's hooks for one step and keeps the refusals."""

    __slots__ = ("policy", "own", "fallen", "errors", "decided")

    def __init__(self, policy: Policy, own: frozenset[str] | None = None) -> None:
        self.policy = policy
        self.own = own_hooks(type(policy)) if own is None else own  # the hooks it overrides
        self.fallen = False  # a hook was refused: the rest of the step is the continuous policy's
        self.errors: list[dict[str, Any]] = []
        self.decided: list[str] = []  # hooks whose answer this step was the policy's own, in order

    def call(
        self, hook: str, view: View, args: tuple, check: Callable[..., Any], extra: tuple
    ) -> Any:
        """``check(policy.<hook>(view, *args), view, *extra)``: the policy's answer, checked; the
        continuous policy's where the policy does not override the hook (untimed: it is the
        defaults' code), once this step has fallen back, or when this answer is refused."""
        policy = DEFAULTS if self.fallen or hook not in self.own else self.policy
        if policy.trusted or policy is DEFAULTS:
            return check(getattr(policy, hook)(view, *args), view, *extra)
        try:
            _, until, _ = HUNG.get(id(policy), (None, 0.0, 0))
            if (wait := until - time.monotonic()) > 0:
                raise PolicyError(f"a hook was abandoned: the policy waits {wait:.0f} s more")
            answer, took, waited = self._timed(policy, hook, view, args)
            limit = policy.time_limit_s
            if took >= limit or waited >= WAITING * limit:
                ms = f"{1000 * took:.1f} ms CPU, {1000 * waited:.0f} ms wall"
                raise PolicyError(f"{hook} took {ms}; bound {1000 * limit:.0f} ms CPU")
            checked = check(answer, view, *extra)
            if hook not in self.decided:
                self.decided.append(hook)
            return checked
        except Exception as exc:  # noqa: BLE001 - any failure of the policy's code is refused
            self.refuse(hook, exc)
            return check(getattr(DEFAULTS, hook)(view, *args), view, *extra)

    def _timed(
        self, policy: Policy, hook: str, view: View, args: tuple
    ) -> tuple[Any, float, float]:
        """``policy.<hook>(view, *args)`` on the hook thread, the CPU seconds it took and the wall
        seconds; refused when it has not returned after ``WAITING`` times its bound. The cyclic
        collector waits until it returns: a collection is the whole process's garbage."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            wait_s = max(MIN_WAIT_S, WAITING * policy.time_limit_s)
            return runner().run(getattr(policy, hook), (view, *args), wait_s)
        except TimeoutError:
            strikes = HUNG.get(id(policy), (None, 0.0, 0))[2] + 1
            bench = min(MOST_BENCH_S, BENCH_S * 2 ** (strikes - 1))
            HUNG[id(policy)] = (policy, time.monotonic() + bench, strikes)
            ms = 1000 * wait_s
            raise PolicyError(f"{hook} did not return in {ms:.0f} ms: abandoned") from None
        finally:
            if collecting:
                gc.enable()

    def refuse(self, hook: str, exc: Exception) -> None:
        error = exc if isinstance(exc, PolicyError) else PolicyError(f"{type(exc).__name__}: {exc}")
        self.fallen = True
        self.errors.append(
            {
                "kind": "policy_error",
                "code": error.code,
                "policy": self.policy.name,
                "hook": hook,
                "error": error.message[:64],  # a recording's event strings: 64 at most
            }
        )
