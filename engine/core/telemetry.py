"""Telemetry: one record per step and one per request, as the design's contract says, plus exports.

Records are plain JSON-ready dicts built once, where the fact happens; the server, the page and
the benchmarks all read these same records (derived numbers live in ``engine.metrics``).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.core.records import LANES, Record, RequestRecord, StepRecord
from engine.core.sequence import Sequence

# What a listener is told of: ("step", a step record) or ("request", a request record).
AnyRecord = StepRecord | RequestRecord


def request_record(seq: Sequence) -> RequestRecord:
    """The request's record (the contract: ``engine/core/records.py``)."""
    record: RequestRecord = {
        "id": seq.id,
        "client": seq.client,
        "prompt_tokens": len(seq.prompt_ids),
        "output_tokens": len(seq.output_ids),
        "arrival": seq.arrival,
        "admitted": seq.admitted,
        "first_token": seq.first_token,
        "token_times": list(seq.token_times),
        "finished": seq.finished,
        "status": seq.status.value,
        "error": seq.error,
        "preemptions": seq.preemptions,
        # Prefix cache, over all its admissions: tokens taken from the cache, tokens prefilled.
        "cached_tokens": seq.cached_tokens,
        "computed_prompt_tokens": seq.computed_prompt_tokens,
    }
    return record


class Telemetry:
    def __init__(self, max_steps: int | None = None, max_requests: int | None = None) -> None:
        """``max_steps``/``max_requests`` bound a long-running server's memory: the oldest step
        records, and the oldest records of ended requests, are dropped first."""
        self.steps: deque[StepRecord] = deque(maxlen=max_steps)
        self.requests: dict[int, RequestRecord] = {}
        self.max_requests = max_requests
        self._events: list[Record] = []
        self._listeners: list[Callable[[str, AnyRecord], None]] = []
        self._lock = threading.Lock()

    def subscribe(self, fn: Callable[[str, AnyRecord], None]) -> Callable[[], None]:
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn) if fn in self._listeners else None

    def event(self, t: float, kind: str, **data: Any) -> None:
        """Mode switches, pauses...: attached to the next step record."""
        with self._lock:
            self._events.append({"t": t, "kind": kind, **data})

    def take_events(self) -> list[Record]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def add_step(self, record: StepRecord) -> None:
        self.steps.append(record)
        for fn in list(self._listeners):
            fn("step", record)

    def update_request(self, seq: Sequence) -> None:
        record = request_record(seq)
        self.requests[seq.id] = record
        if self.max_requests is not None and len(self.requests) > self.max_requests:
            ended = [rid for rid, r in self.requests.items() if r["finished"] is not None]
            for rid in ended[: len(self.requests) - self.max_requests]:
                del self.requests[rid]
        for fn in list(self._listeners):
            fn("request", record)

    def clear(self) -> None:
        self.steps.clear()
        self.requests.clear()

    # -- exports ---------------------------------------------------------------------------
    def snapshot(self) -> tuple[list[StepRecord], list[RequestRecord]]:
        """Copies safe to read while the engine thread keeps recording (list() of a deque or of
        dict values runs without releasing the GIL)."""
        return list(self.steps), list(self.requests.values())

    def jsonl(self) -> str:
        steps, requests = self.snapshot()
        lines = [json.dumps({"type": "step", **rec}) for rec in steps]
        lines += [json.dumps({"type": "request", **rec}) for rec in requests]
        return "".join(line + "\n" for line in lines)

    def to_jsonl(self, path: str | Path) -> None:
        Path(path).write_text(self.jsonl())

    def chrome_trace(self) -> Record:
        """Chrome-trace / Perfetto JSON: one track per lane, one per request (queued, prefill,
        decode)."""
        events: list[Record] = [
            {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "engine lanes"}},
            {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "requests"}},
        ]
        for tid, lane in enumerate(LANES):
            events.append(
                {"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": lane}}
            )
        steps, requests = self.snapshot()
        events += _lane_events(steps) + _request_events(requests)
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def to_chrome_trace(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.chrome_trace()))


US = 1e6  # trace timestamps are microseconds


def _lane_events(steps: list[StepRecord]) -> list[Record]:
    """Each step's spans on their lane's track, and its events as instants."""
    us = US
    events: list[Record] = []
    for rec in steps:
        for span in rec["spans"]:
            events.append(
                {
                    "ph": "X",
                    "pid": 1,
                    "tid": LANES.index(span["lane"]),
                    "name": f"{span['lane']} #{rec['step']}",
                    "ts": span["start"] * us,
                    "dur": max(0.0, span["end"] - span["start"]) * us,
                    "args": {"step": rec["step"], "policy": rec["policy"]},
                }
            )
        for ev in rec["events"]:
            events.append(
                {
                    "ph": "i",
                    "pid": 1,
                    "tid": 0,
                    "s": "g",
                    "name": ev["kind"],
                    "ts": ev["t"] * us,
                    "args": ev,
                }
            )
    return events


def _request_events(requests: list[RequestRecord]) -> list[Record]:
    """One track per request: queued, prefill, decode."""
    us = US
    events: list[Record] = []
    for req in requests:
        phases = (
            ("queued", req["arrival"], req["admitted"]),
            ("prefill", req["admitted"], req["first_token"]),
            ("decode", req["first_token"], req["finished"]),
        )
        events.append(
            {
                "ph": "M",
                "pid": 2,
                "tid": req["id"],
                "name": "thread_name",
                "args": {"name": f"request {req['id']}"},
            }
        )
        for name, a, b in phases:
            if a is not None and b is not None:
                events.append(
                    {
                        "ph": "X",
                        "pid": 2,
                        "tid": req["id"],
                        "name": name,
                        "ts": a * us,
                        "dur": (b - a) * us,
                    }
                )
    return events
