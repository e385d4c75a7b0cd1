"""The observer's records (observer/fluxo_vllm_observer/record.py) as Fluxo's own step and request
records (engine/core/records.py): pure logic, fed one record at a time, no sockets.

vLLM names requests with strings (``chatcmpl-...``); Fluxo's records use integers, so each new
name gets the next id. Lanes are the sidecar's: a request takes the lowest free lane of its rank
when it is first scheduled (or again after a preemption) and keeps it until it ends; rank r's
lanes are slots ``r * max_num_seqs ...``. Times are vLLM's own (its engine core's monotonic clock,
stamped as wall time), minus the sidecar's epoch. What a record cannot carry is in
docs/observe.md ("What an observed step can say").
"""

from __future__ import annotations

from typing import Any

from engine.core.errors import FluxoError
from engine.core.records import KVRecord, RequestRecord, SlotRecord, SpanRecord, StepRecord

WIRE_VERSION = 1  # observer/fluxo_vllm_observer/__init__.py: WIRE_VERSION


class ObserverMismatch(FluxoError):
    """A record from an observer of another wire version, or not a record at all."""

    code = "observer_mismatch"


class Translator:
    def __init__(self, epoch: float, runner: str = "sync") -> None:
        self.epoch = epoch  # wall time of the sidecar's clock zero (state.wall_offset)
        self.runner = runner
        self.step = 0
        self.ids: dict[str, int] = {}
        self.requests: dict[int, RequestRecord] = {}
        self.lanes: dict[int, dict[str, int]] = {}  # rank -> request name -> lane
        self.seq: dict[int, int] = {}  # rank -> last seq seen
        self.missed = 0  # records lost between observer and sidecar (seq gaps), all ranks
        self.kv: dict[int, KVRecord] = {}  # rank -> its latest KV use
        self.width = 0  # max_num_seqs: lanes per rank
        self.stored: dict[str, int] = {}  # request name -> tokens its KV blocks hold

    def _id(self, name: str) -> int:
        if name not in self.ids:
            self.ids[name] = len(self.ids) + 1
        return self.ids[name]

    def _lane(self, rank: int, name: str) -> int:
        held = self.lanes.setdefault(rank, {})
        if name not in held:
            taken = set(held.values())
            held[name] = next(i for i in range(len(taken) + 1) if i not in taken)
        return held[name]

    def feed(self, wire: dict[str, Any]) -> tuple[StepRecord, list[RequestRecord]]:
        """One observer record -> the step record and the request records that ended in it."""
        if not isinstance(wire, dict) or wire.get("v") != WIRE_VERSION:
            got = wire.get("v") if isinstance(wire, dict) else type(wire).__name__
            raise ObserverMismatch(f"observer record version {got!r}; this sidecar reads 1")
        rank = wire["rank"]
        gap = wire["seq"] - self.seq.get(rank, 0) - 1
        self.missed += max(gap, 0)
        self.seq[rank] = wire["seq"]
        self.width = max(self.width, wire["limits"]["max_num_seqs"])
        t0, t1, t2, t3 = (x - self.epoch for x in wire["t"])
        self._arrivals(wire, t0)
        admitted = [n for n, _, _ in wire["sched"] if n not in self.lanes.get(rank, {})]
        slots = self._slots(wire, rank)
        # as vLLM's block counts: at schedule time, before this step's ends free their blocks
        stored = sum(self.stored.get(n, 0) for n in self.lanes.get(rank, {}))
        ended = self._ended(wire, rank, t0, t3)
        self.step += 1
        kv = wire["kv"]
        self.kv[rank] = {
            "blocks_total": kv["total"],
            "blocks_used": kv["used"],
            "blocks_shared": kv["shared"],
            "tokens_allocated": kv["used"] * wire["limits"]["block_size"],
            "tokens_stored": stored,
        }
        cached = {self.ids[n]: v["cached"] for n, v in wire["new"].items() if v["cached"]}
        record: StepRecord = {
            "step": self.step,
            "t_start": t0,
            "t_end": t3,
            "policy": "chunked",  # vLLM batches continuously and always chunks prefills
            "runner": self.runner,
            "slots": slots,
            "admitted": [self.ids[n] for n in admitted],
            "finished": [r["id"] for r in ended],
            "preempted": [self.ids[n] for n in wire["preempted"] if n in self.ids],
            "admitted_cached": cached,
            "cached_tokens": sum(cached.values()),
            "queue_len": wire["waiting"],
            "kv": self.kv[rank],
            "tokens": _tokens(slots),
            "spans": _spans(t0, t1, t2, t3),
            "events": _dropped_event(t0, gap, wire["dropped"]),
            "decided": [],
            "expected_s": None,
            "rank": rank,  # the contract's observed-only fields (records.OBSERVED_ONLY)
            "vllm_step": wire["step"],
        }
        return record, ended

    def _arrivals(self, wire: dict, t0: float) -> None:
        for name, wall in wire["arrivals"].items():
            rid = self._id(name)
            self.requests[rid] = _request(rid, wall - self.epoch)
        for name, info in wire["new"].items():
            rec = self.requests.setdefault(self._id(name), _request(self.ids[name], t0))
            rec["prompt_tokens"] = info["prompt"]
            rec["cached_tokens"] += info["cached"]
            self.stored[name] = info["cached"]  # its prefix hits: KV it holds before computing

    def _slots(self, wire: dict, rank: int) -> list[SlotRecord]:
        t0, t3 = (x - self.epoch for x in (wire["t"][0], wire["t"][3]))
        by_lane: dict[int, SlotRecord] = {}
        for name, n, phase in wire["sched"]:
            rid, lane = self._id(name), self._lane(rank, name)
            rec = self.requests.setdefault(rid, _request(rid, t0))
            if rec["admitted"] is None:
                rec["admitted"] = t0
            if phase == "prefill":
                rec["computed_prompt_tokens"] += n
            self.stored[name] = self.stored.get(name, 0) + n
            by_lane[lane] = {"slot": lane, "request": rid, "phase": phase, "tokens": n}
        for name, k in wire["out"].items():
            rec = self.requests[self._id(name)]
            rec["output_tokens"] += k
            rec["token_times"].extend([t3] * k)
            if rec["first_token"] is None and k:
                rec["first_token"] = t3
        held = self.lanes.get(rank, {})
        for name, lane in held.items():
            by_lane.setdefault(lane, _idle(lane, self.ids[name]))
        width = max(self.width, max(by_lane, default=-1) + 1)
        base = rank * self.width
        slots = [by_lane.get(i, _idle(i, None)) for i in range(width)]
        return [{**s, "slot": base + s["slot"]} for s in slots]

    def _ended(self, wire: dict, rank: int, t0: float, t3: float) -> list[RequestRecord]:
        held = self.lanes.get(rank, {})
        for name in wire["preempted"]:
            held.pop(name, None)
            self.stored.pop(name, None)  # its blocks were freed: recomputed when it returns
            if name in self.ids:
                self.requests[self.ids[name]]["preemptions"] += 1
        ended = []
        gone = [(n, "finished", t3) for n in wire["finished"]]
        gone += [(n, "cancelled", t0) for n in wire["aborted"]]
        for name, status, t in gone:
            held.pop(name, None)
            self.stored.pop(name, None)
            rec = self.requests.pop(self.ids.get(name, -1), None)
            if rec is not None:
                rec.update(finished=t, status=status)
                ended.append(rec)
        return ended


def _request(rid: int, arrival: float) -> RequestRecord:
    return {
        "id": rid,
        "client": "vllm",  # vLLM does not say who sent it
        "prompt_tokens": 0,
        "output_tokens": 0,
        "arrival": arrival,
        "admitted": None,
        "first_token": None,
        "token_times": [],
        "finished": None,
        "status": "running",
        "error": None,
        "preemptions": 0,
        "cached_tokens": 0,
        "computed_prompt_tokens": 0,
    }


def _idle(slot: int, request: int | None) -> SlotRecord:
    return {"slot": slot, "request": request, "phase": "idle", "tokens": 0}


def _tokens(slots: list[SlotRecord]) -> dict[str, int]:
    out = {"prefill": 0, "decode": 0, "dead": 0}
    for s in slots:
        if s["phase"] in out:
            out[s["phase"]] += s["tokens"]
    return out


def _spans(t0: float, t1: float, t2: float, t3: float) -> list[SpanRecord]:
    """schedule() -> cpu_prepare; the model's forward and sampling (vLLM's executor, between
    schedule() returning and update_from_output() being called) -> compute; update -> cpu_update."""
    return [
        {"lane": "cpu_prepare", "start": t0, "end": t1},
        {"lane": "compute", "start": t1, "end": t2},
        {"lane": "cpu_update", "start": t2, "end": t3},
    ]


def _dropped_event(t: float, gap: int, dropped: int) -> list[dict]:
    if gap <= 0:
        return []
    return [{"t": t, "kind": "observer_dropped", "missed": gap, "dropped_total": dropped}]
