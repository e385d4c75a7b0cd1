"""The engine: requests in, one scheduled step at a time, token streams and telemetry out.

``submit``/``cancel``/``reconfigure``/``pause`` are safe to call from any thread; they take
effect between steps. ``step()`` runs on one thread (the server's engine thread, or the caller).
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.core import cpu
from engine.core import device
from engine.core.block_manager import BlockManager
from engine.core.config import EngineConfig
from engine.core.cost_model import CostModel, StepWork
from engine.core.records import StepRecord
from engine.core.errors import DeviceUnavailable, FluxoError, InvalidConfig, KVBudgetTooSmall, StepFailed
from engine.core.model import load_model
from engine.core.llama import ForwardBatch
from engine.core.model_runner import ModelRunner
from engine.core.scheduler import ScheduledBatch, Scheduler
from engine.core.requests import RequestHandle, check_params, check_token_ids, encode
from engine.core.sequence import PLACEHOLDER, Event, Sequence, Status
from engine.core.telemetry import Record, Telemetry

log = logging.getLogger("fluxo.engine")


@dataclass(slots=True, eq=False)
class _Work:
    """One step on its way through prepare -> execute -> finish."""

    batch: ScheduledBatch
    rows: list[Sequence | None]
    fb: ForwardBatch
    t_start: float
    policy: str = ""  # as scheduled: a switch applied while this step executes must not relabel it
    runner: str = ""
    slots: list[dict] = field(default_factory=list)
    kv: dict = field(default_factory=dict)
    spans: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    outputs: list[tuple[int, Sequence, int]] = field(default_factory=list)  # (row, sequence, output index)
    future: Future | None = None
    tokens: torch.Tensor | None = None
    cost: StepWork | None = None  # what the cost model prices (engine/core/cost_model.py)


class Engine:
    def __init__(self, config: EngineConfig | None = None, model=None, tokenizer=None,
                 clock: Callable[[], float] = time.perf_counter, max_telemetry_steps: int | None = None,
                 max_telemetry_requests: int | None = None) -> None:
        self.config = config or EngineConfig()
        if self.config.threads or self.config.cpus:
            cpu.apply(self.config.threads, self.config.cpus)
            device.run(torch.set_num_threads, torch.get_num_threads())  # the device thread's pool too
        if model is None:
            model, tokenizer = device.run(load_model, self.config.model, self.config.dtype, self.config.seed)
        if self.config.device == "cuda":
            if not torch.cuda.is_available():
                raise DeviceUnavailable("device 'cuda' was asked for, but torch sees no CUDA device on this machine "
                                        f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})")
            model = model.to("cuda")
        self.model, self.tokenizer = model, tokenizer
        limit = getattr(model.config, "max_position_embeddings", self.config.max_model_len)
        self.config.max_model_len = min(self.config.max_model_len, limit)
        self.eos_ids = self._eos_ids()
        self.blocks = BlockManager(self.config.kv_blocks, self.config.block_size)
        self.scheduler = Scheduler(self.config, self.blocks)
        # Weights are packed and every forward runs on the process's one device thread (see device.py).
        self._pool = device.executor()
        self.runner = device.run(ModelRunner, model, self.config)
        self.telemetry = Telemetry(max_telemetry_steps, max_telemetry_requests)
        self._clock = clock
        self._t0 = clock()
        # On CUDA: three streams, events, pinned buffers and decode graphs (engine/core/cuda_exec.py).
        self.cuda = None
        if self.config.device == "cuda":
            from engine.core.cuda_exec import CudaExecutor

            self.cuda = device.run(CudaExecutor, self.runner, self.config, self.now)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._step_lock = threading.RLock()  # the engine thread's steps and single_step never interleave
        self._incoming: list[Sequence] = []
        self._cancels: list[int] = []
        self._changes: list[dict] = []
        self._live: dict[int, Sequence] = {}
        self.step_count = 0
        self.paused = False
        self._ended_this_step: list[int] = []
        self._inflight: _Work | None = None
        self.cost_model = CostModel()
        self._calibrating = False
        self._calibrations = 0

    def _eos_ids(self) -> set[int]:
        eos = getattr(self.model.generation_config, "eos_token_id", None) or self.tokenizer.eos_token_id
        return set(eos) if isinstance(eos, (list, tuple)) else {eos}

    def now(self) -> float:
        return self._clock() - self._t0

    # -- requests ----------------------------------------------------------------------------
    def submit(self, messages: list[dict] | None = None, prompt: str | None = None, token_ids: list[int] | None = None,
               max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
               ignore_eos: bool = False, client: str = "", sink: Callable[[Event], None] | None = None) -> RequestHandle:
        """Queue a request; raises a :class:`FluxoError` (with a ``code``) if it can never run."""
        if token_ids is None:
            token_ids = encode(self.tokenizer, messages, prompt)
        check_token_ids(token_ids, self.model.config.vocab_size)
        params = check_params(self.config, len(token_ids), max_new_tokens, temperature, top_p, seed)
        params.ignore_eos = bool(ignore_eos)
        seq = Sequence(prompt_ids=list(token_ids), params=params, client=client, arrival=self.now())
        handle = RequestHandle(seq)

        def deliver(event: Event) -> None:
            handle._push(event)
            if sink is not None:
                sink(event)

        seq.sink = deliver
        with self._lock:
            self._incoming.append(seq)
        self._wake.set()
        return handle

    def cancel(self, request_id: int) -> None:
        with self._lock:
            self._cancels.append(request_id)
        self._wake.set()

    def cancel_client(self, client: str) -> int:
        with self._lock:
            ids = [s.id for s in list(self._live.values()) + self._incoming if s.client == client]
            self._cancels.extend(ids)
        self._wake.set()
        return len(ids)

    def cancel_all(self) -> int:
        with self._lock:
            ids = [s.id for s in list(self._live.values()) + self._incoming]
            self._cancels.extend(ids)
        self._wake.set()
        return len(ids)

    def queue_len(self) -> int:
        """Requests submitted but not admitted yet (safe from any thread, approximate while stepping)."""
        with self._lock:
            incoming = len(self._incoming)
        return incoming + len(self.scheduler.waiting)

    def queue_positions(self) -> dict[int, int]:
        """Request id -> place in the queue (1 = admitted next), for every request not admitted
        yet: the scheduler's queue in order, then what was submitted since the last step. Safe
        from any thread (the copies are taken whole)."""
        with self._lock:
            incoming = [s.id for s in self._incoming]
        waiting = [s.id for s in list(self.scheduler.waiting)] + incoming
        return {rid: i + 1 for i, rid in enumerate(waiting)}

    # -- control -----------------------------------------------------------------------------
    def reconfigure(self, **changes: object) -> EngineConfig:
        """Validate now, apply between steps; returns the config as it will be."""
        new = self.config.updated(**changes)
        with self._lock:
            self._changes.append(changes)
        self._wake.set()
        return new

    def pause(self) -> None:
        """Stop stepping; returns once the step in progress (if any) has completed."""
        self.paused = True
        with self._step_lock:
            self.telemetry.event(self.now(), "pause")

    def single_step(self) -> Record | None:
        """One step while paused (the class walks through the schedule step by step)."""
        with self._step_lock:
            return self.step()

    def resume(self) -> None:
        self.paused = False
        self.telemetry.event(self.now(), "resume")
        self._wake.set()

    def has_work(self) -> bool:
        with self._lock:
            pending = bool(self._incoming or self._cancels or self._changes)
        return pending or self._inflight is not None or bool(self.scheduler.waiting or self.scheduler.running)

    # -- between steps -----------------------------------------------------------------------
    def _drain_inbox(self) -> None:
        with self._lock:
            incoming, self._incoming = self._incoming, []
            cancels, self._cancels = self._cancels, []
            changes, self._changes = self._changes, []
            for seq in incoming:  # under the lock: cancel_client must find them in one place or the other
                self._live[seq.id] = seq
        for seq in incoming:
            self.scheduler.add(seq)
            self.telemetry.update_request(seq)
        for rid in cancels:
            seq = self._live.get(rid)
            if seq is not None:
                self._end(seq, Status.CANCELLED)
        for change in changes:
            self._apply(change)

    def _apply(self, changes: dict) -> None:
        old = self.config.live()
        new = self.config.updated(**changes)
        for name in changes:
            setattr(self.config, name, getattr(new, name))
        if "kv_blocks" in changes:
            # On the device thread: it runs after any step in flight, whose K/V writes must land
            # in the cache before it is copied into the bigger one.
            self._pool.submit((self.cuda or self.runner).ensure_capacity, new.kv_blocks).result()
            self.blocks.set_budget(new.kv_blocks)
            for seq in list(self._live.values()):  # a request that can no longer ever fit fails now
                need = self.blocks.blocks_for(len(seq.prompt_ids) + seq.params.max_new_tokens)
                if need > new.kv_blocks:
                    self._end(seq, Status.FAILED, KVBudgetTooSmall(f"the KV budget shrank to {new.kv_blocks} blocks; this request needs {need}"))
        if changes.get("policy", old["policy"]) != old["policy"]:
            self.scheduler.on_policy_change(old["policy"], new.policy)
        diff = {k: v for k, v in changes.items() if old.get(k) != v}
        if diff:
            self.telemetry.event(self.now(), "reconfigure", changes=diff)

    def _end(self, seq: Sequence, status: Status, error: FluxoError | None = None) -> None:
        """The one place a request ends: it happens exactly once."""
        if seq.status.ended:
            return
        seq.status = status
        seq.finished = self.now()
        while seq.output_ids and seq.output_ids[-1] == PLACEHOLDER:  # async: a token never to be streamed
            seq.output_ids.pop()
        if error is not None:
            seq.error, seq.error_code = error.message, error.code
        self.scheduler.release(seq)
        self._live.pop(seq.id, None)
        self._ended_this_step.append(seq.id)
        self.telemetry.update_request(seq)
        if status is Status.FAILED:
            seq.emit(Event("error", seq.id, status=status.value, error_code=seq.error_code, error=seq.error))
        else:
            seq.emit(Event("done", seq.id, status=status.value))

    # -- one step ----------------------------------------------------------------------------
    # A step has three stages: prepare (inbox, schedule, build tensors) on the CPU; execute
    # (forward + sampling) on the accelerator - here a worker thread; finish (bookkeeping,
    # detokenization, streaming, telemetry) on the CPU. The sync runner does them in a row. The
    # async runner prepares step N+1 while N executes and finishes N while N+1 executes; inputs
    # of N+1 that N produces are placeholders filled on the device side (carry-over), and a stop
    # decided when N finishes takes effect one step late (the surplus token is discarded).
    def step(self) -> Record | None:
        """Run one engine step; returns the telemetry record of the step that completed, or None
        when there was nothing to run."""
        self._ended_this_step = []
        if self.config.runner == "async":
            return self._step_async()
        if self._inflight is not None:  # switched from async: land the step still in flight first
            work, self._inflight = self._inflight, None
            try:
                tokens = self._await(work)
            except Exception as exc:  # noqa: BLE001
                return self._fail(work, exc)
            return self._finish(work, tokens)
        work = self._prepare()
        if work is None:
            return None
        self._launch(work, None)
        try:
            tokens = self._await(work)
        except Exception as exc:  # noqa: BLE001 - a failed forward fails its requests, not the engine
            return self._fail(work, exc)
        return self._finish(work, tokens)

    def _step_async(self) -> Record | None:
        prev = self._inflight
        work = self._prepare()
        if prev is None:
            if work is None:
                return None
            self._launch(work, None)
            self._inflight = work
            return self._step_async()  # nothing to finish yet: prepare the next one right away
        try:
            tokens = self._await(prev)
        except Exception as exc:  # noqa: BLE001
            self._inflight = None
            if work is not None:
                # ``work`` was prepared to continue from ``prev``'s tokens, which never came. Nothing of
                # it has been launched: its sequences keep their blocks and are scheduled again.
                for event in work.events:
                    self.telemetry.event(event["t"], event["kind"], **{k: v for k, v in event.items() if k not in ("t", "kind")})
            return self._fail(prev, exc)
        if work is not None:
            self._launch(work, prev.tokens)
        self._inflight = work
        return self._finish(prev, tokens)

    def _prepare(self) -> _Work | None:
        t_start = self.now()
        self._drain_inbox()
        batch = self.scheduler.schedule(t_start)
        if not batch:
            return None
        for seq in batch.admitted:
            if seq.admitted is None:
                seq.admitted = t_start
            self.telemetry.update_request(seq)
        for seq in batch.preempted:
            self.telemetry.update_request(seq)
        fb, rows = self.runner.build(batch)
        if self.config.host_work_ms > 0:  # simulated host work (a teaching knob): the sleep releases
            time.sleep(self.config.host_work_ms / 1000)  # the GIL, so async hides it under a compute
        work = _Work(batch, rows, fb, t_start, self.config.policy, self.config.runner, slots=self._slots_view(batch),
                     events=self.telemetry.take_events())  # switches applied before this step belong to it
        work.spans.append({"lane": "cpu_prepare", "start": t_start, "end": self.now()})
        work.cost = _step_work(batch, rows)
        if self.cuda is not None:  # copied in now and queued behind the step in flight (cuda_exec.py)
            work.future = self.cuda.launch(work.fb, rows, self.config.seed, self._inflight and self._inflight.future)
        return work

    def _launch(self, work: _Work, prev_tokens: torch.Tensor | None) -> None:
        """Start executing ``work``; bookkeeping moves on as if its tokens were known (placeholders)."""
        for seq, n in work.batch.items:
            seq.num_cached += n
        for row, seq in enumerate(work.rows):
            if seq is not None:
                seq.output_ids.append(PLACEHOLDER)
                seq.carry_row = row
                work.outputs.append((row, seq, len(seq.output_ids) - 1))
        work.kv = self._kv_view()
        if self.cuda is not None:  # already queued by _prepare; carry-over from the step in flight
            return
        t = self.now()
        fb, rows, seed = self.runner.to_device(work.fb), work.rows, self.config.seed
        if fb.input_ids.is_cuda:
            work.spans.append({"lane": "h2d", "start": t, "end": self.now()})

        def execute() -> tuple[torch.Tensor, float, float]:
            t0 = self.now()
            tokens = self.runner.execute(fb, rows, seed, prev_tokens)
            return tokens, t0, self.now()

        work.future = self._pool.submit(execute)

    def _await(self, work: _Work) -> list[int]:
        if self.cuda is not None:  # spans timed by CUDA events, on the engine clock
            work.tokens, ids, spans = self.cuda.wait(work.future)
            work.spans.extend(spans)
            return ids
        work.tokens, t0, t1 = work.future.result()
        work.spans.append({"lane": "compute", "start": t0, "end": t1})
        t = self.now()
        ids = work.tokens.tolist()
        work.spans.append({"lane": "d2h", "start": t, "end": self.now()})
        return ids

    def _finish(self, work: _Work, tokens: list[int]) -> Record:
        t = self.now()
        self.scheduler.on_computed(work.batch)  # its full blocks are real now: findable in the prefix cache
        for row, seq, index in work.outputs:
            if seq.status.ended:  # stopped while this token was computed: the surplus is dropped
                continue
            tok = tokens[row]
            seq.output_ids[index] = tok
            seq.token_times.append(t)
            if seq.first_token is None:
                seq.first_token = t
            seq.emit(Event("token", seq.id, token_id=tok, text=self._detokenize(seq, index + 1)))
            if (tok in self.eos_ids and not seq.params.ignore_eos) or index + 1 >= seq.params.max_new_tokens:
                self._end(seq, Status.FINISHED)
        t_end = self.now()
        work.spans.append({"lane": "cpu_update", "start": t, "end": t_end})
        return self._record(work, t_end)

    def _fail(self, work: _Work, exc: BaseException) -> Record:
        """The step raised: every request it computed fails with ``step_failed``; the rest go on."""
        log.exception("step failed; failing its %d requests", len(work.batch.items), exc_info=exc)
        error = StepFailed(f"the engine step computing this request failed: {type(exc).__name__}: {exc}")
        for seq, _ in work.batch.items:
            self._end(seq, Status.FAILED, error)
        work.events.append({"t": self.now(), "kind": "step_failed", "error": f"{type(exc).__name__}: {exc}"})
        return self._record(work, self.now())

    def fail_all(self, exc: BaseException) -> None:
        """Last resort after an error outside a forward: fail everything live, keep the engine up."""
        with self._step_lock:
            self._inflight = None
            error = StepFailed(f"the engine failed: {type(exc).__name__}: {exc}")
            for seq in list(self._live.values()):
                self._end(seq, Status.FAILED, error)
            self.telemetry.event(self.now(), "engine_error", error=f"{type(exc).__name__}: {exc}")

    def _detokenize(self, seq: Sequence, upto: int) -> str:
        """Text added by token ``upto - 1``; holds back bytes of a character not yet complete."""
        ids = seq.output_ids
        prev = self.tokenizer.decode(ids[seq.prefix_offset:seq.read_offset], skip_special_tokens=True)
        new = self.tokenizer.decode(ids[seq.prefix_offset:upto], skip_special_tokens=True)
        if new.endswith("\ufffd"):
            return ""
        seq.prefix_offset, seq.read_offset = seq.read_offset, upto
        return new[len(prev):]

    def _slots_view(self, batch: ScheduledBatch) -> list[dict]:
        scheduled = {s.id: n for s, n in batch.items}
        by_slot = {s.slot: s for s in self.scheduler.running}
        width = max([self.config.max_slots] + [k + 1 for k in by_slot if k is not None])
        slots = []
        for i in range(width):
            seq = by_slot.get(i)
            if seq is None:
                slots.append({"slot": i, "request": None, "phase": "idle", "tokens": 0})
                continue
            n = scheduled.get(seq.id, 0)
            if seq.dead:
                phase, n = "dead", 1
            elif n > 1 or seq.num_cached + max(n, 1) < seq.num_tokens or not seq.output_ids:
                phase = "prefill"
            else:
                phase = "decode"
            slots.append({"slot": i, "request": seq.id, "phase": phase, "tokens": n})
        return slots

    def _kv_view(self) -> dict:
        return {
            "blocks_total": self.blocks.budget,
            "blocks_used": self.blocks.num_used,
            # A shared block is full and counted once per holder in num_cached: count it once.
            "tokens_stored": sum(s.num_cached for s in self.scheduler.running)
            - self.blocks.extra_refs * self.config.block_size,
            "tokens_allocated": self.blocks.num_used * self.config.block_size,
            "blocks_shared": self.blocks.num_shared,  # referenced by more than one sequence
            "blocks_cached": self.blocks.num_cached,  # free, content still findable (counted as free)
        }

    def _record(self, work: _Work, t_end: float) -> Record:
        self.step_count += 1
        tokens = {"prefill": 0, "decode": 0, "dead": 0}
        for s in work.slots:
            if s["phase"] != "idle":
                tokens[s["phase"]] += s["tokens"]
        record: StepRecord = {  # the contract: engine/core/records.py
            "step": self.step_count,
            "t_start": work.t_start,
            "t_end": t_end,
            "policy": work.policy,
            "runner": work.runner,
            "slots": work.slots,
            "admitted": [s.id for s in work.batch.admitted],
            "finished": list(self._ended_this_step),
            "preempted": [s.id for s in work.batch.preempted],
            # Prefix cache: tokens each admission took from it (request id -> tokens), and their sum.
            "admitted_cached": dict(work.batch.cached),
            "cached_tokens": sum(work.batch.cached.values()),
            "queue_len": len(self.scheduler.waiting),
            "kv": work.kv,
            "tokens": tokens,
            "spans": work.spans,
            "events": work.events,
            # The cost model's duration for this step's work on a quiet machine (None until it
            # has seen enough steps): measured >> expected with nothing admitted is the machine.
            "expected_s": None if work.cost is None else self.cost_model.expected(work.cost),
        }
        self._observe_cost(work)
        self.telemetry.add_step(record)
        return record

    def _observe_cost(self, work: _Work) -> None:
        compute = [s["end"] - s["start"] for s in work.spans if s["lane"] == "compute"]
        if work.cost is None or not compute:  # a failed step computed nothing worth learning
            return
        host = sum(s["end"] - s["start"] for s in work.spans if s["lane"] != "compute")
        self.cost_model.observe(work.cost, compute[0], host, pin=self._calibrating)

    def calibrate(self, rounds: tuple[tuple[int, int], ...] = ((1, 24), (4, 48), (8, 96), (2, 384))) -> float:
        """Run a few prompts of different sizes (``(requests, prompt tokens)`` per round, 6 new
        tokens each) so the cost model knows this machine's quiet step costs; call it on an idle
        engine before serving. The calibration steps are then dropped from the telemetry.
        Returns the seconds it took (~3 s for SmolLM2 on 2 cores)."""
        t0 = time.perf_counter()
        base = self.tokenizer.encode("The weights are read once per step, whatever the batch. ") or [1]
        self._calibrating = True
        try:
            for n, length in rounds:
                ids = (base * (length // len(base) + 1))[:min(length, self.config.max_model_len - 8)]
                for i in range(n):
                    try:  # a different first token each: no prompt shares a cached prefix with another
                        first = (self._calibrations + i) % max(1, len(base))
                        self.submit(token_ids=[base[first]] + [7 + i] + ids[2:], max_new_tokens=6,
                                    ignore_eos=True, client="calibration")
                    except FluxoError:  # a small KV budget or context: skip the sizes that cannot fit
                        break
                self._calibrations += n
                self.run_until_idle()
        finally:
            self._calibrating = False
        self.cost_model.fit()
        self.telemetry.clear()
        self.step_count = 0
        return time.perf_counter() - t0

    # -- drivers -----------------------------------------------------------------------------
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
        while not stop.is_set():
            if self.paused or not self.has_work():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                with self._step_lock:
                    record = None if self.paused else self.step()
            except Exception as exc:  # noqa: BLE001 - the server's engine must outlive any one bug
                log.exception("engine step raised outside a forward")
                self.fail_all(exc)
                record = None
            if record is None:
                self._wake.wait(0.005)
                self._wake.clear()

    def live_requests(self) -> list[Sequence]:
        return list(self._live.values())


def _step_work(batch: ScheduledBatch, rows: list) -> StepWork:
    """The counts the cost model prices, taken before the step advances ``num_cached``."""
    pairs = sum(n * (seq.num_cached + n) for seq, n in batch.items) + sum(s.num_cached + 1 for s in batch.dead)
    tokens = sum(n for _, n in batch.items) + len(batch.dead)
    return StepWork(tokens=tokens, logit_rows=len(rows), attention_pairs=pairs)
