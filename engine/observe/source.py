"""The sidecar's stand-in for Fluxo's ``Engine``: what ``engine/server/server.py`` reads of an
engine (telemetry, clock, counts, KV use, config), answered from vLLM's records. Its "engine
thread" (``run_forever``) receives the observer's records over ZMQ and turns each into Fluxo's
step record (``translate.py``) as it arrives. It computes nothing and changes nothing in vLLM.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from engine.core.errors import FluxoError
from engine.core.records import Record, RequestRecord
from engine.core.telemetry import Telemetry
from engine.observe.translate import Translator

log = logging.getLogger("fluxo.observe")
MAX_STEPS = 100_000  # step records kept (~1 KB each): a long class, not the server's memory
MAX_REQUESTS = 20_000


class ObservedTelemetry(Telemetry):
    def add_request(self, record: RequestRecord) -> None:
        """A request record built from vLLM's records (Fluxo's own come from a Sequence)."""
        self.requests[record["id"]] = record
        if len(self.requests) > MAX_REQUESTS:
            del self.requests[next(iter(self.requests))]
        for fn in list(self._listeners):
            fn("request", record)


@dataclass
class ObservedConfig:
    """vLLM's settings in Fluxo's words; ``live()`` is what the page shows as the configuration."""

    max_slots: int = 0  # max_num_seqs x data-parallel ranks
    kv_blocks: int = 0
    chunk_budget: int = 0  # max_num_batched_tokens
    max_model_len: int = 0
    runner: str = "sync"
    device: str = "cpu"
    max_new_tokens_limit: int = 0

    def live(self) -> dict[str, object]:
        return {
            "policy": "chunked",
            "runner": self.runner,
            "max_slots": self.max_slots,
            "kv_layout": "paged",
            "kv_blocks": self.kv_blocks,
            "chunk_budget": self.chunk_budget,
            "prefix_cache": True,
        }


class ObservedEngine:
    paused = False

    def __init__(
        self,
        addr: str,
        max_model_len: int,
        runner: str = "sync",
        dp: int = 1,
        capture: Path | None = None,
        max_num_seqs: int = 0,
    ) -> None:
        self.addr = addr
        self.dp = dp  # data-parallel ranks vLLM was started with: lanes for each from the start
        self.capture = capture  # the observer's records, as received, one JSON line each
        self._t0 = time.monotonic()
        self.translator = Translator(epoch=time.time(), runner=runner)
        self.telemetry = ObservedTelemetry(max_steps=MAX_STEPS)
        self.config = ObservedConfig(max_model_len=max_model_len, runner=runner)
        self.config.max_new_tokens_limit = max_model_len
        self.config.max_slots = max_num_seqs * dp  # as declared; the first record says for sure
        self.received = 0
        self.refused = 0  # records the sidecar could not read (another wire version, bad JSON)
        self.ranks: set[int] = set()
        self._last: dict[int, Record] = {}  # rank -> its latest step record
        self.bound = threading.Event()

    # -- what the server reads ----------------------------------------------------------------
    def now(self) -> float:
        return time.time() - self.translator.epoch

    @property
    def step_count(self) -> int:
        return self.translator.step

    def queue_len(self) -> int:
        return sum(r.get("queue_len", 0) for r in self._last.values())

    def running_count(self, include_dead: bool = True) -> int:
        return sum(s["request"] is not None for r in self._last.values() for s in r["slots"])

    def kv_usage(self) -> dict[str, int]:
        kv = self.translator.kv.values()
        return {
            "blocks_total": sum(k["blocks_total"] for k in kv),
            "blocks_used": sum(k["blocks_used"] for k in kv),
        }

    def execution(self) -> dict[str, Any]:
        return {"cuda_graphs": False, "weights": "bf16", "kernels": "vllm", "policies": []}

    def queue_positions(self) -> dict[int, int]:
        return {}  # vLLM's waiting queue is not in the records

    def live_requests(self) -> list:
        return []  # the sidecar holds no request of its own

    def has_work(self) -> bool:
        return False

    def cancel_client(self, client: str | None) -> int:
        return 0

    def fail_all(self, exc: BaseException) -> None:
        pass

    # -- the receiving thread -------------------------------------------------------------------
    def run_forever(self, stop: threading.Event) -> None:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.addr)
        self.bound.set()
        out = open(self.capture, "ab") if self.capture else None  # noqa: SIM115 - closed below
        try:
            while not stop.is_set():
                if sock.poll(100):
                    raw = sock.recv()
                    if out is not None:
                        out.write(raw + b"\n")
                        out.flush()
                    self.take(raw)
        finally:
            sock.close(0)
            if out is not None:
                out.close()

    def take(self, raw: bytes) -> None:
        """One observer record in; its step record (and ended requests) out to the telemetry."""
        try:
            wire = json.loads(raw)
            record, ended = self.translator.feed(wire)
        except (ValueError, KeyError, TypeError, FluxoError) as exc:
            self.refused += 1
            if self.refused == 1:
                log.warning("an observer record was refused: %s", exc)
            return
        self.received += 1
        self._note(wire)
        self._last[wire["rank"]] = record
        self.telemetry.add_step(record)
        for req in ended:
            self.telemetry.add_request(req)

    def _note(self, wire: dict) -> None:
        self.ranks.add(wire["rank"])
        limits = wire["limits"]
        self.config.max_slots = limits["max_num_seqs"] * max(self.dp, len(self.ranks))
        self.config.chunk_budget = limits["max_num_batched_tokens"]
        # every rank has a pool of the same size: counted for all ranks before each has spoken
        per_rank = max(k["blocks_total"] for k in self.translator.kv.values())
        self.config.kv_blocks = per_rank * max(self.dp, len(self.ranks))
