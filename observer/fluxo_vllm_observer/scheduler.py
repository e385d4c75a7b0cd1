"""vLLM's scheduler, observed: every method calls the parent first and returns its answer as is.

Start vLLM with ``--scheduler-cls fluxo_vllm_observer.scheduler.ObservedScheduler`` (the CPU
build schedules synchronously) or ``...ObservedAsyncScheduler`` (CUDA's async scheduling), and
``FLUXO_OBSERVER_ADDR=tcp://127.0.0.1:PORT`` where the sidecar listens. One engine core process
runs one scheduler per data-parallel rank, so each rank publishes its own records.

What it reads is vLLM internals (the scheduler interface is "not public", vLLM's own warning
says): ``SchedulerOutput`` (scheduled tokens per request, new requests with their prefix-cache
hits, preemptions), ``Request`` (tokens computed, prompt length, arrival), the block pool (free
blocks, reference counts) and ``EngineCoreOutput`` (tokens produced, finish reasons). Pinned to
``VLLM_RANGE``. Any error of the observer's own is counted and logged once; it never reaches vLLM.
"""

from __future__ import annotations

import logging
import time

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from fluxo_vllm_observer.publish import Publisher
from fluxo_vllm_observer.record import phase_of, shared_blocks, step_record

log = logging.getLogger("fluxo.observer")


class _Observed:
    """The observing half; mixed in before a vLLM scheduler class."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._fx_pub = Publisher()
        # The data-parallel rank: vLLM leaves data_parallel_rank at 0 on every rank of a dense
        # model (its ranks are independent engines) and sets data_parallel_index to the rank.
        pc = self.parallel_config
        self._fx_rank = getattr(pc, "data_parallel_index", None) or pc.data_parallel_rank
        self._fx_wall = time.time() - time.monotonic()  # monotonic -> wall, sampled once
        self._fx_pending: dict[int, dict] = {}  # id(SchedulerOutput) -> what schedule() saw
        self._fx_arrivals: dict[str, float] = {}
        self._fx_aborted: list[str] = []
        self._fx_errors = 0
        self._fx_seq = 0
        sc = self.scheduler_config
        self._fx_limits = {
            "max_num_seqs": sc.max_num_seqs,
            "max_num_batched_tokens": sc.max_num_batched_tokens,
            "block_size": self.block_size,
        }
        log.info("fluxo observer: rank %d -> %s", self._fx_rank, self._fx_pub.addr or "(off)")

    def _fx_now(self) -> float:
        return time.monotonic() + self._fx_wall

    def _fx_failed(self, exc: BaseException) -> None:
        self._fx_errors += 1
        if self._fx_errors == 1:
            log.exception("fluxo observer: a record was lost to an error", exc_info=exc)

    # -- vLLM's methods, each calling the parent first -----------------------------------------
    def add_request(self, request) -> None:
        super().add_request(request)
        if self._fx_pub.on:
            self._fx_arrivals[request.request_id] = request.arrival_time

    def finish_requests(self, request_ids, finished_status):
        aborted = super().finish_requests(request_ids, finished_status)
        if self._fx_pub.on:
            self._fx_aborted.extend(r.request_id for r in aborted)
        return aborted

    def schedule(self, *args, **kwargs):
        t0 = self._fx_now()
        output = super().schedule(*args, **kwargs)
        if self._fx_pub.on:
            try:
                self._fx_pending[id(output)] = self._fx_scheduled(output, t0)
            except Exception as exc:  # noqa: BLE001 - the observer never breaks vLLM
                self._fx_failed(exc)
        return output

    def update_from_output(self, scheduler_output, model_runner_output):
        t2 = self._fx_now()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        seen = self._fx_pending.pop(id(scheduler_output), None)
        if seen is not None:
            try:
                self._fx_publish(seen, outputs, t2)
            except Exception as exc:  # noqa: BLE001 - the observer never breaks vLLM
                self._fx_failed(exc)
        return outputs

    # -- reading vLLM's objects into plain values ----------------------------------------------
    def _fx_scheduled(self, output, t0: float) -> dict:
        sched = []
        for rid, n in output.num_scheduled_tokens.items():
            req = self.requests[rid]
            before = req.num_computed_tokens - n  # schedule() has already advanced it
            sched.append((rid, n, phase_of(before, n, req.num_prompt_tokens, req.num_tokens)))
        return {
            "step": self.current_step,
            "t01": (t0, self._fx_now()),
            "sched": sched,
            "new": {
                r.req_id: {"prompt": r.prompt_len, "cached": r.num_computed_tokens}
                for r in output.scheduled_new_reqs
            },
            "preempted": sorted(output.preempted_req_ids or ()),
            "kv": self._fx_kv(),
            "waiting": len(self.waiting),
            "running": len(self.running),
        }

    def _fx_kv(self) -> dict[str, int]:
        manager = self.kv_cache_manager
        pool = manager.block_pool
        total = pool.num_gpu_blocks - 1  # block 0 is vLLM's null block, never handed out
        held: set[int] = set()
        for req in self.running:
            held.update(manager.get_block_ids(req.request_id)[0])
        refs = [pool.blocks[b].ref_cnt for b in held]
        used = total - pool.get_num_free_blocks()
        return {"total": total, "used": used, "shared": shared_blocks(refs)}

    def _fx_publish(self, seen: dict, outputs, t2: float) -> None:
        out: dict[str, int] = {}
        finished: dict[str, str] = {}
        for eco in outputs.values():
            for o in eco.outputs:
                out[o.request_id] = len(o.new_token_ids)
                if o.finish_reason is not None:
                    reason = o.finish_reason
                    finished[o.request_id] = getattr(reason, "name", str(reason)).lower()
        arrivals, self._fx_arrivals = self._fx_arrivals, {}
        aborted, self._fx_aborted = self._fx_aborted, []
        self._fx_seq += 1
        record = step_record(
            rank=self._fx_rank,
            step=seen["step"],
            seq=self._fx_seq,
            dropped=self._fx_pub.dropped,
            stamps=(*seen["t01"], t2, self._fx_now()),
            sched=seen["sched"],
            new=seen["new"],
            arrivals=arrivals,
            out=out,
            finished=finished,
            aborted=aborted,
            preempted=seen["preempted"],
            kv=seen["kv"],
            waiting=seen["waiting"],
            running=seen["running"],
            limits=self._fx_limits,
        )
        self._fx_pub.send(record)


class ObservedScheduler(_Observed, Scheduler):
    """vLLM's synchronous scheduler (the CPU build's), observed."""


class ObservedAsyncScheduler(_Observed, AsyncScheduler):
    """vLLM's async scheduler (CUDA's default), observed."""
