"""The sync and async runners, and the execute stage they drive.

A step is three stages: *prepare* (``Engine.prepare``: inbox, schedule, build the flat tensors),
*execute* (``launch`` then ``land``: host-to-device copy, forward, sampling, on the process's
device thread or the CUDA executor) and *finish* (``Engine.finish``: tokens back, detokenize,
stream, stop checks, telemetry).

- ``step_sync`` runs them in a row, so the device waits during prepare and finish.
- ``step_async`` keeps one step in flight: while step N executes, it prepares N+1, launches it
  behind N (its placeholder inputs are filled from N's tokens on the device), then finishes N.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from engine.core.records import StepRecord
from engine.core.sequence import PLACEHOLDER
from engine.core.step_record import Work, kv_view
from engine.core.telemetry import Telemetry

if TYPE_CHECKING:  # types only: these modules never import this one
    from engine.core.block_manager import BlockManager
    from engine.core.config import EngineConfig
    from engine.core.cuda_exec import CudaExecutor
    from engine.core.inbox import Inbox
    from engine.core.model_runner import ModelRunner
    from engine.core.scheduler import Scheduler

log = logging.getLogger("fluxo.engine")


@runtime_checkable
class StepEngine(Protocol):
    """What the runners use of ``engine.core.engine.Engine`` (which satisfies it): the stages of a
    step, the step in flight, and the parts a step reads. Typed here, not imported, so the step
    recipe reads in both files without a cycle."""

    config: EngineConfig
    blocks: BlockManager
    scheduler: Scheduler
    model_runner: ModelRunner
    cuda: CudaExecutor | None
    device_pool: ThreadPoolExecutor  # the device thread (engine/core/device.py)
    telemetry: Telemetry
    inbox: Inbox
    inflight: Work | None
    paused: bool
    step_lock: threading.RLock  # held around a step (the engine thread, single_step)

    def now(self) -> float: ...
    def prepare(self) -> Work | None: ...
    def finish(self, work: Work, tokens: list[int]) -> StepRecord: ...
    def fail_step(self, work: Work, exc: BaseException) -> StepRecord: ...
    def fail_all(self, exc: BaseException) -> None: ...
    def has_work(self) -> bool: ...
    def step(self) -> StepRecord | None: ...


def launch(engine: StepEngine, work: Work, prev_tokens: torch.Tensor | None) -> None:
    """Start executing ``work``; bookkeeping moves on as if its tokens were known (placeholders)."""
    for seq, n in work.batch.items:
        seq.num_computed += n
    for row, owner in enumerate(work.rows):
        if owner is not None:
            owner.output_ids.append(PLACEHOLDER)
            owner.carry_row = row
            work.outputs.append((row, owner, len(owner.output_ids) - 1))
    work.kv = kv_view(engine.blocks, engine.scheduler.running, engine.config.block_size)
    if engine.cuda is not None:  # already queued by prepare; carry-over from the step in flight
        return
    model_runner, now = engine.model_runner, engine.now
    t = now()
    fb, rows, seed = model_runner.to_device(work.fb), work.rows, engine.config.seed
    if fb.input_ids.is_cuda:
        work.spans.append({"lane": "h2d", "start": t, "end": now()})

    def execute() -> tuple[torch.Tensor, float, float]:
        t0 = now()
        tokens = model_runner.execute(fb, rows, seed, prev_tokens)
        return tokens, t0, now()

    work.future = engine.device_pool.submit(execute)


def land(engine: StepEngine, work: Work) -> list[int]:
    """Wait for ``work``'s sampled tokens; adds its compute and d2h spans."""
    assert work.future is not None  # ``launch`` (or, on CUDA, ``prepare``) set it
    if engine.cuda is not None:  # spans timed by CUDA events, on the engine clock
        work.tokens, ids, spans = engine.cuda.wait(work.future)
        work.spans.extend(spans)
        return ids
    work.tokens, t0, t1 = work.future.result()
    work.spans.append({"lane": "compute", "start": t0, "end": t1})
    t = engine.now()
    ids = work.tokens.tolist()
    work.spans.append({"lane": "d2h", "start": t, "end": engine.now()})
    return ids


def _land_and_finish(engine: StepEngine, work: Work) -> StepRecord:
    try:
        tokens = land(engine, work)
    except Exception as exc:  # noqa: BLE001 - a failed forward fails its requests, not the engine
        return engine.fail_step(work, exc)
    return engine.finish(work, tokens)


def step_sync(engine: StepEngine) -> StepRecord | None:
    """prepare, execute, finish, in a row."""
    if engine.inflight is not None:  # switched from async: land the step still in flight first
        prev, engine.inflight = engine.inflight, None
        return _land_and_finish(engine, prev)
    work = engine.prepare()
    if work is None:
        return None
    launch(engine, work, None)
    return _land_and_finish(engine, work)


def step_async(engine: StepEngine) -> StepRecord | None:
    """Prepare N+1 while N executes, launch it behind N, then finish N."""
    prev = engine.inflight
    work = engine.prepare()
    if prev is None:  # nothing in flight: launch this one, and prepare the next behind it now
        if work is None:
            return None
        launch(engine, work, None)
        prev = engine.inflight = work
        work = engine.prepare()
    try:
        tokens = land(engine, prev)
    except Exception as exc:  # noqa: BLE001
        engine.inflight = None
        if work is not None:
            # ``work`` was prepared to continue from ``prev``'s tokens, which never came. Nothing
            # of it has been launched: its sequences keep their blocks and are scheduled again.
            for event in work.events:
                data = {k: v for k, v in event.items() if k not in ("t", "kind")}
                engine.telemetry.event(event["t"], event["kind"], **data)
        return engine.fail_step(prev, exc)
    if work is not None:
        launch(engine, work, prev.tokens)
    engine.inflight = work
    return engine.finish(prev, tokens)


# -- drivers ---------------------------------------------------------------------------------------
def run_until_idle(engine: StepEngine, max_steps: int = 1_000_000) -> int:
    """Step until nothing is queued or running (waiting out a static batch's fill timeout)."""
    steps = 0
    while engine.has_work() and steps < max_steps:
        if engine.step() is None:
            time.sleep(0.002)
        else:
            steps += 1
    return steps


def run_forever(engine: StepEngine, stop: threading.Event) -> None:
    """The server's engine thread: step while there is work and the engine is not paused."""
    wake = engine.inbox.wake
    while not stop.is_set():
        if engine.paused or not engine.has_work():
            wake.wait(0.05)
            wake.clear()
            continue
        try:
            with engine.step_lock:
                record = None if engine.paused else engine.step()
        except Exception as exc:  # noqa: BLE001 - the server's engine must outlive any one bug
            log.exception("engine step raised outside a forward")
            engine.fail_all(exc)
            record = None
        if record is None:
            wake.wait(0.005)
            wake.clear()
