"""The engine: requests in, one scheduled step at a time, token streams and telemetry out.

``submit``/``cancel``/``reconfigure``/``pause`` are safe to call from any thread; they take
effect between steps. ``step()`` runs on one thread (the server's engine thread, or the caller).

A step is prepare -> execute -> finish (nano-vllm's schedule, run, postprocess), in ``step``: the
sync loop runs them in a row, the async loop carries the step in flight from one call to the next
and prepares the next step while it executes. ``prepare`` drains the inbox, schedules, builds the
flat batch; ``Executor`` (``execute.py``) runs it on the device thread; ``finish`` streams the
tokens, ends requests, records (``step_record.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from engine.core import cost_model, device, threads
from engine.core.block_manager import BlockManager
from engine.core.config import EngineConfig
from engine.core.cost_model import CostModel
from engine.core.errors import FluxoError, KVBudgetTooSmall, StepFailed
from engine.core.execute import Executor, InFlight
from engine.core.inbox import Inbox
from engine.core.model import eos_ids, load_for_engine
from engine.core.model_runner import ModelRunner
from engine.core.policy import registry as policies
from engine.core.records import StepRecord
from engine.core.requests import Request, RequestHandle, checked, detokenize
from engine.core.scheduler import Scheduler
from engine.core.sequence import PLACEHOLDER, Event, Sequence, Status
from engine.core.step_record import (
    StepTrace,
    kv_view,
    observe_cost,
    slots_view,
    step_record,
    step_work,
)
from engine.core.telemetry import Telemetry
from kernels import cpu_quant

if TYPE_CHECKING:  # types only: the step in flight's tokens
    import torch

log = logging.getLogger("fluxo.engine")


class Engine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        model=None,
        tokenizer=None,
        clock: Callable[[], float] = time.perf_counter,
        max_telemetry_steps: int | None = None,
        max_telemetry_requests: int | None = None,
    ) -> None:
        self.config = config = replace(config) if config else EngineConfig()  # its own copy
        model, tokenizer = load_for_engine(config, model, tokenizer)
        self.model, self.tokenizer = model, tokenizer
        limit = getattr(model.config, "max_position_embeddings", config.max_model_len)
        config.max_model_len = min(config.max_model_len, limit)
        self.eos_ids = eos_ids(model, tokenizer)
        self.blocks = BlockManager(config.kv_blocks, config.block_size)
        self.scheduler = Scheduler(config, self.blocks)
        # Weights are packed and every forward runs on the process's one device thread (device.py).
        self.device_pool = device.executor()
        self.model_runner = device.run(ModelRunner, model, config)
        self.telemetry = Telemetry(max_telemetry_steps, max_telemetry_requests)
        self._clock = clock
        self._t0 = clock()
        # On CUDA: three streams, events, pinned buffers and decode graphs (cuda_exec.py).
        self.cuda = None
        if config.device == "cuda":
            from engine.core.cuda_exec import CudaExecutor

            self.cuda = device.run(CudaExecutor, self.model_runner, config, self.now)
        self.executor = Executor(self.model_runner, self.device_pool, self.cuda, config, self.now)
        self.inbox = Inbox()
        self.step_lock = threading.RLock()  # the engine thread's steps and single_step alternate
        self.step_count = 0
        self.paused = False
        self._ended_this_step: list[int] = []
        self.inflight: InFlight | None = (
            None  # async: the step executing while the next is prepared
        )
        self.cost_model = self.scheduler.cost_model = CostModel()  # the policies' views price on it
        self.calibrating = False
        self.calibrations = 0
        self.tuner = threads.for_engine(config.device)  # a busy neighbour costs its share

    def now(self) -> float:
        return self._clock() - self._t0

    # -- requests ------------------------------------------------------------------------------
    def submit(
        self,
        request: Request | None = None,
        sink: Callable[[Event], None] | None = None,
        **fields: Any,
    ) -> RequestHandle:
        """Queue ``request`` (or one made of ``fields``: ``submit(prompt="hi", max_new_tokens=8)``
        for library use); raises a :class:`FluxoError` (with a ``code``) if it can never run."""
        if request is None:
            request = Request(**fields)
        elif fields:
            raise TypeError(f"submit: a Request, or its fields, not both ({', '.join(fields)})")
        ids, params = checked(request, self.tokenizer, self.config, self.model.config.vocab_size)
        seq = Sequence(prompt_ids=ids, params=params, client=request.client, arrival=self.now())
        handle = RequestHandle(seq)

        def deliver(event: Event) -> None:
            handle.push(event)
            if sink is not None:
                sink(event)

        seq.sink = deliver
        self.inbox.put(seq)
        return handle

    def cancel(self, request_id: int) -> None:
        self.inbox.cancel(request_id)

    def cancel_client(self, client: str | None) -> int:
        """Cancel every live request of ``client`` (None: of everyone); returns how many."""
        return self.inbox.cancel_client(client)

    def queue_len(self) -> int:
        """Requests submitted but not admitted yet (any thread; approximate while stepping)."""
        return self.inbox.incoming_count() + len(self.scheduler.waiting)

    def queue_positions(self) -> dict[int, int]:
        """Request id -> place in the queue (1 = admitted next), for every request not admitted
        yet: the scheduler's queue in order, then what was submitted since the last step. Safe
        from any thread (the copies are taken whole)."""
        waiting = [s.id for s in list(self.scheduler.waiting)] + self.inbox.incoming_ids()
        return {rid: i + 1 for i, rid in enumerate(waiting)}

    def running_count(self, include_dead: bool = True) -> int:
        """Requests holding a slot now, static dead slots included unless ``include_dead`` is
        False (any thread; approximate while stepping)."""
        if include_dead:
            return len(self.scheduler.running)
        return sum(not s.dead for s in list(self.scheduler.running))

    def kv_usage(self) -> dict[str, int]:
        """``blocks_total`` (the budget) and ``blocks_used`` now (any thread)."""
        return {"blocks_total": self.blocks.budget, "blocks_used": self.blocks.num_used}

    def execution(self) -> dict[str, object]:
        """How steps execute: ``cuda_graphs``, CPU ``weights``, ``kernels`` and ``kernels_reason``
        (``cpu_quant.serving``), and the ``policies`` a ``control`` may name (built-ins first)."""
        weights = getattr(getattr(self.model_runner, "forward_impl", None), "weights", "fp32")
        kernels, why = cpu_quant.serving(weights, self.config.weights, self.config.device)
        graphs = bool(self.cuda and self.cuda.graphs_on)
        out = {"cuda_graphs": graphs, "weights": weights, "kernels": kernels}
        return out | {"kernels_reason": why, "policies": list(policies.names())}

    def live_requests(self) -> list[Sequence]:
        return list(self.inbox.live.values())

    # -- control -------------------------------------------------------------------------------
    def reconfigure(self, **changes: object) -> EngineConfig:
        """Validate now, apply between steps; returns the config as it will be."""
        new = self.config.updated(**changes)
        self.inbox.change(changes)
        return new

    def pause(self) -> None:
        """Stop stepping; returns once the step in progress (if any) has completed."""
        self.paused = True
        with self.step_lock:
            self.telemetry.event(self.now(), "pause")

    def single_step(self) -> StepRecord | None:
        """One step while paused (the class walks through the schedule step by step)."""
        with self.step_lock:
            return self.step()

    def resume(self) -> None:
        self.paused = False
        self.telemetry.event(self.now(), "resume")
        self.inbox.wake.set()

    def has_work(self) -> bool:
        pending = self.inbox.pending()
        scheduled = self.scheduler.waiting or self.scheduler.running
        return pending or self.inflight is not None or bool(scheduled)

    def calibrate(
        self, rounds: tuple[tuple[int, int], ...] = cost_model.CALIBRATION_ROUNDS
    ) -> float:
        """Teach the cost model this machine's quiet step costs (``cost_model.calibrate``)."""
        return cost_model.calibrate(self, rounds)

    # -- between steps -------------------------------------------------------------------------
    def _drain_inbox(self) -> None:
        incoming, cancels, changes = self.inbox.drain()
        for seq in incoming:
            self.scheduler.add(seq)
            self.telemetry.update_request(seq)
        for rid in cancels:
            live = self.inbox.live.get(rid)
            if live is not None:
                self._end(live, Status.CANCELLED)
        for change in changes:
            self._apply(change)

    def _apply(self, changes: dict) -> None:
        old = self.config.live()
        new = self.config.updated(**changes)
        for name in changes:
            setattr(self.config, name, getattr(new, name))
        if "kv_blocks" in changes:
            self._resize_kv(new.kv_blocks)
        if changes.get("policy", old["policy"]) != old["policy"]:
            self.scheduler.on_policy_change(old["policy"], new.policy)
        diff = {k: v for k, v in changes.items() if old.get(k) != v}
        if diff:
            self.telemetry.event(self.now(), "reconfigure", changes=diff)

    def _resize_kv(self, blocks: int) -> None:
        # On the device thread: it runs after any step in flight, whose K/V writes must land
        # in the cache before it is copied into the bigger one.
        self.device_pool.submit((self.cuda or self.model_runner).ensure_capacity, blocks).result()
        self.blocks.set_budget(blocks)
        # a request that can no longer ever fit fails now
        for seq in list(self.inbox.live.values()):
            need = self.blocks.blocks_for(len(seq.prompt_ids) + seq.params.max_new_tokens)
            if need > blocks:
                msg = f"the KV budget shrank to {blocks} blocks; this request needs {need}"
                self._end(seq, Status.FAILED, KVBudgetTooSmall(msg))

    def _end(self, seq: Sequence, status: Status, error: FluxoError | None = None) -> None:
        """The one place a request ends: it happens exactly once."""
        if seq.status.ended:
            return
        seq.status = status
        seq.finished = self.now()
        while seq.output_ids and seq.output_ids[-1] == PLACEHOLDER:  # async: never to be streamed
            seq.output_ids.pop()
        if error is not None:
            seq.error, seq.error_code = error.message, error.code
        self.scheduler.release(seq)
        self.inbox.live.pop(seq.id, None)
        self._ended_this_step.append(seq.id)
        self.telemetry.update_request(seq)
        kind = "error" if status is Status.FAILED else "done"
        code, message = (seq.error_code, seq.error) if kind == "error" else (None, None)
        seq.emit(Event(kind, seq.id, status=status.value, error_code=code, error=message))

    # -- one step: prepare -> execute (execute.py) -> finish ------------------------------------
    def step(self) -> StepRecord | None:
        """Run one step; the record of the step that completed, or None when nothing ran.

        sync: prepare, execute, finish in a row. async: the step in flight (``inflight``, carried
        from the last call) executes while the next is prepared and launched behind it, its
        placeholder inputs filled from the first's tokens on the device; then the first is
        finished. Nothing in flight: launch one, and prepare the next behind it at once."""
        self._ended_this_step = []
        prev = self.inflight
        if self.config.runner == "sync":
            if prev is not None:  # switched from async: land the step still in flight first
                self.inflight = None
                return self._land_and_finish(prev)
            step = self._launch(self.prepare(None), None)
            return None if step is None else self._land_and_finish(step)
        if prev is None:
            prev = self.inflight = self._launch(self.prepare(None), None)
            if prev is None:
                return None
        step = self.prepare(prev)  # N+1, scheduled while N computes
        try:
            tokens = self.executor.land(prev)
        except Exception as exc:  # noqa: BLE001 - a failed forward fails its requests, not the engine
            self.inflight = None
            if step is not None:  # prepared to continue from tokens that never came: not launched,
                self._requeue_events(step)  # its sequences keep their blocks, scheduled again
            return self.fail_step(prev, exc)
        self.inflight = self._launch(step, prev.tokens)
        return self.finish(prev, tokens)

    def prepare(self, prev: InFlight | None) -> InFlight | None:
        """Drain the inbox, schedule, build the flat batch (CUDA: stage it behind ``prev``)."""
        t_start = self.now()
        self._drain_inbox()
        batch = self.scheduler.schedule(t_start)
        for error in batch.errors:  # a refused policy decision: an event of this step's record
            self.telemetry.event(t_start, **error)
        if not batch:
            return None
        for seq in batch.admitted:
            if seq.admitted is None:
                seq.admitted = t_start
            self.telemetry.update_request(seq)
        for seq in batch.preempted:
            self.telemetry.update_request(seq)
        fb, rows = self.model_runner.build(batch)
        if self.config.host_work_ms > 0:  # simulated host work (a teaching knob): the sleep frees
            time.sleep(self.config.host_work_ms / 1000)  # the GIL, so async hides it under compute
        cfg = self.config
        trace = StepTrace(
            t_start,
            cfg.policy,
            cfg.runner,
            slots_view(batch, self.scheduler.running, cfg.max_slots),
            [s.id for s in batch.admitted],
            [s.id for s in batch.preempted],
            dict(batch.prefix_hits),
            list(batch.decided),
            events=self.telemetry.take_events(),  # switches applied before this step belong to it
            cost=step_work(batch, rows),
        )
        trace.spans.append({"lane": "cpu_prepare", "start": t_start, "end": self.now()})
        step = InFlight(batch, rows, fb, trace)
        self.executor.stage(step, prev)
        return step

    def _launch(self, step: InFlight | None, prev_tokens: torch.Tensor | None) -> InFlight | None:
        """Its sequences move on as if its tokens were known (placeholders); it starts."""
        if step is None:
            return None
        for seq, n in step.batch.items:
            seq.num_computed += n
        for row, owner in enumerate(step.rows):
            if owner is not None:
                owner.output_ids.append(PLACEHOLDER)
                owner.carry_row = row
                step.outputs.append((row, owner, len(owner.output_ids) - 1))
        step.trace.kv = kv_view(self.blocks, self.scheduler.running, self.config.block_size)
        self.executor.launch(step, prev_tokens)
        return step

    def _land_and_finish(self, step: InFlight) -> StepRecord:
        try:
            tokens = self.executor.land(step)
        except Exception as exc:  # noqa: BLE001 - a failed forward fails its requests, not the engine
            return self.fail_step(step, exc)
        return self.finish(step, tokens)

    def _requeue_events(self, step: InFlight) -> None:
        for event in step.trace.events:
            data = {k: v for k, v in event.items() if k not in ("t", "kind")}
            self.telemetry.event(event["t"], event["kind"], **data)

    def finish(self, work: InFlight, tokens: list[int]) -> StepRecord:
        """Write the step's tokens back, stream them, end the requests that stopped."""
        t = self.now()
        self.scheduler.on_computed(work.batch)  # its full blocks are real: findable in the cache
        for row, seq, index in work.outputs:
            if seq.status.ended:  # stopped while this token was computed: the surplus is dropped
                continue
            tok = tokens[row]
            seq.output_ids[index] = tok
            seq.token_times.append(t)
            if seq.first_token is None:
                seq.first_token = t
            text = detokenize(self.tokenizer, seq, index + 1)
            seq.emit(Event("token", seq.id, token_id=tok, text=text))
            eos = tok in self.eos_ids and not seq.params.ignore_eos
            if eos or index + 1 >= seq.params.max_new_tokens:
                self._end(seq, Status.FINISHED)
        t_end = self.now()
        work.trace.spans.append({"lane": "cpu_update", "start": t, "end": t_end})
        return self._record(work.trace, t_end)

    def fail_step(self, work: InFlight, exc: BaseException) -> StepRecord:
        """The step raised: every request it computed fails with ``step_failed``; the rest go on."""
        log.exception("step failed; failing its %d requests", len(work.batch.items), exc_info=exc)
        error = StepFailed(f"the engine step computing this request failed: {_describe(exc)}")
        for seq, _ in work.batch.items:
            self._end(seq, Status.FAILED, error)
        work.trace.events.append({"t": self.now(), "kind": "step_failed", "error": _describe(exc)})
        return self._record(work.trace, self.now())

    def fail_all(self, exc: BaseException) -> None:
        """Fail every request live or submitted, keep going: the last resort after an error
        outside a forward (``step_failed``), or a coded reason (``shutting_down``)."""
        with self.step_lock:
            self.inflight = None
            coded = exc if isinstance(exc, FluxoError) else None
            error = coded or StepFailed(f"the engine failed: {_describe(exc)}")
            self._drain_inbox()  # what was submitted and not yet drained is live now
            for seq in list(self.inbox.live.values()):
                self._end(seq, Status.FAILED, error)
            kind = error.code if coded else "engine_error"
            self.telemetry.event(self.now(), kind, error=_describe(exc))

    def _record(self, trace: StepTrace, t_end: float) -> StepRecord:
        self.step_count += 1
        queue_len = len(self.scheduler.waiting)
        record = step_record(
            trace, self.step_count, t_end, self._ended_this_step, queue_len, self.cost_model
        )
        observe_cost(self.cost_model, trace, pin=self.calibrating)
        if self.tuner is not None and not self.calibrating:
            self.tuner.step(trace.spans, trace.cost, self.cost_model, self.telemetry, t_end)
        self.telemetry.add_step(record)
        return record

    # -- drivers ----------------------------------------------------------------------------
    def run_until_idle(self, max_steps: int = 1_000_000) -> int:
        """Step until nothing is queued or running (waiting out a static batch's fill timeout)."""
        steps = 0
        while self.has_work() and steps < max_steps:
            if self.step() is None:
                time.sleep(0.002)
            else:
                steps += 1
        return steps

    def run_forever(self, stop: threading.Event) -> None:
        """The server's engine thread: step while there is work and the engine is not paused."""
        wake = self.inbox.wake
        while not stop.is_set():
            if self.paused or not self.has_work():
                wake.wait(0.05)
                wake.clear()
                continue
            try:
                with self.step_lock:
                    record = None if self.paused else self.step()
            except Exception as exc:  # noqa: BLE001 - the server's engine must outlive any one bug
                log.exception("engine step raised outside a forward")
                self.fail_all(exc)
                record = None
            if record is None:
                wake.wait(0.005)
                wake.clear()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
