"""The engine harness the property tests drive (tests/core/test_properties.py): random programs of
submit / cancel / step / live reconfigure, hand-written scenarios random generation rarely reaches,
a step-by-step checker of the scheduler's contracts (tests/core/engine_contracts.py), and greedy
references (each prompt alone).

Everything runs on the tiny float64 Llama (byte tokenizer, EOS = 258): a step takes a few ms.
"""

from __future__ import annotations

from collections import deque

import engine_contracts as contracts
from engine_programs import EOS, MAX_NEW
from hypothesis import event

from engine.core.errors import FluxoError
from engine.core.sequence import Status

# --------------------------------------------------------------------------------------------------
# Engine harness: step-by-step invariant checks
# --------------------------------------------------------------------------------------------------


class Harness:
    """Drives an engine and checks the scheduler's contracts at every step.

    ``scheduler.schedule`` is wrapped (on this instance only) so each batch is checked the moment
    it is formed, against the state just before: the step record alone cannot tell what was live
    when admission ran. Batches queue up and are matched, in order, to the step records that
    report them (an async runner reports step N while N+1 is already scheduled).
    """

    def __init__(self, engine) -> None:
        self.engine = engine
        self.handles: list = []
        self.events: dict[int, list] = {}
        self.prompts: dict[int, tuple[list[int], int, bool]] = {}
        self.records: list[dict] = []
        self.preempted: list[int] = []
        self.idle_steps = 0
        self.seen: set[str] = set()  # what a run exercised, reported as hypothesis events
        self.pending: deque[dict] = deque()  # scheduled batches whose record has not come yet
        sched = engine.scheduler
        original = sched.schedule

        def schedule(now):
            live = [q.id for q in sched.live()]  # admission order
            info = {
                "cfg": engine.config.live(),
                "live_before": len(live),
                "live_order": live,
                "used_before": engine.blocks.num_used,
            }
            batch = original(now)
            info.update(
                batch=batch,
                running_after=len(sched.running),
                live_after=len(sched.live()),
                used_after=engine.blocks.num_used,
                budget=engine.blocks.budget,
                admitted_blocks=[len(s.block_table) for s in batch.admitted],
                items=[
                    (s.id, n, s.slot, s.num_computed, s.num_tokens, len(s.prompt_ids))
                    for s, n in batch.items
                ],
                dead=[(s.id, s.slot) for s in batch.dead],
            )
            self.check_pool()
            self.check_batch(info)
            if batch:
                self.pending.append(info)
            return batch

        sched.schedule = schedule

    # -- operations ---------------------------------------------------------------------------
    def submit(self, prompt: list[int], max_new: int, ignore_eos: bool):
        log: list = []
        try:
            h = self.engine.submit(
                token_ids=list(prompt),
                max_new_tokens=max_new,
                ignore_eos=ignore_eos,
                sink=log.append,
            )
        except FluxoError as e:  # can never run under the current budget: refused up front
            assert e.code == "kv_budget_too_small"
            return None
        self.handles.append(h)
        self.events[h.id] = log
        self.prompts[h.id] = (list(prompt), max_new, ignore_eos)
        return h

    def cancel(self, pick: int) -> None:
        if self.handles and pick % 4:
            self.engine.cancel(self.handles[pick % len(self.handles)].id)
        else:
            self.engine.cancel(10**9 + pick)  # an id nobody has: ignored

    def step(self) -> dict | None:
        rec = self.engine.step()
        self.check_pool()
        if rec is not None:
            assert self.pending, "a step record for a batch never scheduled"
            self.check_record(rec, self.pending.popleft())
        self.idle_steps = 0 if rec is not None else self.idle_steps + 1
        assert self.idle_steps < 50, "livelock: work remains but nothing is ever scheduled"
        return rec

    def drain(self) -> None:
        # every step computes a token (or a static batch's dead slots, at most MAX_NEW steps per
        # batch), so four times the total length is ample; a bound keeps a livelock from hanging
        max_steps = 100 + 4 * sum(len(p) + n for p, n, _ in self.prompts.values())
        for _ in range(max_steps):
            if not self.engine.has_work():
                break
            self.step()
        assert not self.engine.has_work(), "the engine did not drain"
        assert not self.pending, "a scheduled batch never got its step record"
        assert self.engine.run_until_idle() == 0

    # -- checks (tests/core/engine_contracts.py) -----------------------------------------------
    def check_pool(self) -> None:
        contracts.check_pool(self.engine, self.handles)

    def check_batch(self, info: dict) -> None:
        self.note(info, info["batch"])
        contracts.check_batch(self.engine, info)
        self.preempted.extend(s.id for s in info["batch"].preempted)

    def check_record(self, rec: dict, info: dict) -> None:
        self.records.append(rec)
        contracts.check_record(self.engine, rec, info)

    def check_end(self) -> None:
        contracts.check_end(self.engine, self.handles, self.events, self.prompts)

    def note(self, info: dict, batch) -> None:
        cfg, seen = info["cfg"], self.seen
        seen.add(f"policy {cfg['policy']} / {cfg['kv_layout']}")
        seen.add(f"runner {cfg['runner']}")
        if batch.preempted:
            seen.add("preemption")
        if batch.dead:
            seen.add("static dead slot computed")
        if info["live_before"] > cfg["max_slots"]:
            seen.add("more live than max_slots (live decrease)")
        if info["used_before"] > info["budget"]:
            seen.add("KV used over a shrunk budget")
        if any(n == 1 and s.num_computed + 1 < s.num_tokens for s, n in batch.items):
            seen.add("1-token prefill chunk mid-prompt")
        if cfg["policy"] == "chunked" and any(1 < n < s.pending for s, n in batch.items):
            seen.add("partial prefill chunk")

    def report(self) -> None:
        for h in self.handles:
            self.seen.add(f"request {h.seq.status.value}")
        for rec in self.records:
            for ev in rec["events"]:
                if ev["kind"] == "reconfigure" and "policy" in ev["changes"]:
                    self.seen.add("policy switch")
        for name in sorted(self.seen):
            event(name)


def run_program(make_engine, start: dict, ops: list) -> Harness:
    hz = Harness(make_engine(**start))
    for op in ops:
        kind = op[0]
        if kind == "submit":
            hz.submit(*op[1:])
        elif kind == "burst":
            for sub in op[1]:
                hz.submit(*sub[1:])
        elif kind == "cancel":
            hz.cancel(op[1])
        elif kind == "step":
            for _ in range(op[1]):
                hz.step()
        else:
            hz.engine.reconfigure(**op[1])
    hz.drain()
    hz.check_end()
    hz.report()
    return hz


# --------------------------------------------------------------------------------------------------
# Greedy references: each prompt alone on a fresh engine, once
# --------------------------------------------------------------------------------------------------

_REFERENCE: dict[tuple[int, ...], list[int]] = {}


def reference(make_engine, prompt: list[int], max_new: int, ignore_eos: bool) -> list[int]:
    """Greedy output of ``prompt`` run alone. Greedy is a prefix process, so one run of MAX_NEW
    tokens with EOS ignored answers every (max_new, ignore_eos)."""
    key = tuple(prompt)
    if key not in _REFERENCE:
        e = make_engine(policy="continuous", kv_layout="paged", kv_blocks=64, max_slots=1)
        h = e.submit(token_ids=list(prompt), max_new_tokens=MAX_NEW, ignore_eos=True)
        e.run_until_idle()
        assert h.seq.status is Status.FINISHED and len(h.token_ids) == MAX_NEW
        _REFERENCE[key] = h.token_ids
    out = _REFERENCE[key][:max_new]
    if not ignore_eos and EOS in out:
        out = out[: out.index(EOS) + 1]
    return out


def check_greedy(make_engine, hz: Harness) -> int:
    """Finished requests match their reference exactly; cancelled/failed ones stream a prefix of
    it."""
    compared = 0
    for h in hz.handles:
        ref = reference(make_engine, *hz.prompts[h.id])
        if h.seq.status is Status.FINISHED:
            assert h.token_ids == ref, f"request {h.id} {hz.prompts[h.id]}: {h.token_ids} != {ref}"
            compared += 1
        else:
            assert h.token_ids == ref[: len(h.token_ids)], (
                f"request {h.id} streamed wrong tokens before ending"
            )
    return compared
