"""The engine harness the property tests drive (tests/test_properties.py): random programs of
submit / cancel / step / live reconfigure, hand-written scenarios random generation rarely reaches,
a step-by-step checker of the scheduler's contracts, and greedy references (each prompt alone).

Everything runs on the tiny float64 Llama (byte tokenizer, EOS = 258): a step takes a few ms.
"""

from __future__ import annotations

from collections import deque

from hypothesis import event

from engine.core.errors import FluxoError
from engine.core.sequence import Status

EOS = 258
BLOCK_SIZE = 4
MAX_PROMPT = 20
MAX_NEW = 12
POLICIES = ("static", "continuous", "chunked")

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
                    (s.id, n, s.slot, s.num_cached, s.num_tokens, len(s.prompt_ids))
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
        used_before = self.engine.blocks.num_used
        rec = self.engine.step()
        self.check_pool()
        if rec is not None:
            assert self.pending, "a step record for a batch never scheduled"
            self.check_record(rec, self.pending.popleft(), used_before)
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

    # -- checks -------------------------------------------------------------------------------
    def check_pool(self) -> None:
        """Exact KV accounting, and every sequence in exactly one consistent place."""
        e = self.engine
        bm, sch = e.blocks, e.scheduler
        bm.check(holders=sch.running)  # each reference count = the running tables holding the block
        held = [b for s in sch.running for b in s.block_table]
        # prefix caching: sequences may share a block (counted once in num_used)
        assert bm.num_used == len(set(held)), (
            "blocks used != blocks held by running sequences (leak)"
        )
        assert bm.num_used + len(bm._free) == bm.capacity
        assert bm.num_used + bm.num_free == max(bm.budget, bm.num_used)
        assert len(sch.running) == len(set(map(id, sch.running)))
        assert not set(map(id, sch.running)) & set(map(id, sch.waiting)), (
            "a sequence both waits and runs"
        )
        slots = [s.slot for s in sch.running]
        assert None not in slots and len(slots) == len(set(slots)), "slot taken twice"
        for s in sch.waiting:
            assert (
                s.block_table == []
                and s.num_cached == 0
                and s.status in (Status.QUEUED, Status.PREEMPTED)
            )
        for s in sch.running:
            assert s.status is Status.RUNNING or (s.dead and s.status.ended)
            assert not s.dead or (e.config.policy == "static" and sch.batch_open)
            assert len(s.block_table) * bm.block_size >= s.num_cached
        for h in self.handles:
            if h.seq.status.ended and not h.seq.dead:
                assert h.seq.block_table == [], "an ended request still holds KV blocks"

    def check_batch(self, info: dict) -> None:
        """The scheduling contracts, checked on each batch as it is formed."""
        batch, cfg = info["batch"], info["cfg"]
        self.note(info, batch)
        # slots: admission only below max_slots; a live decrease never evicts, only blocks admission
        if batch.admitted:
            assert info["running_after"] <= cfg["max_slots"], "admitted past max_slots"
        assert info["live_after"] <= max(cfg["max_slots"], info["live_before"])
        # KV: admission and growth stay inside the budget; a shrunk budget only stops growth
        if batch.admitted:
            assert info["used_after"] <= info["budget"], "admitted past the KV budget"
        assert info["used_after"] <= max(info["budget"], info["used_before"])
        if cfg["kv_layout"] == "reserved":
            # reserved up front, whole
            for s, held in zip(batch.admitted, info["admitted_blocks"], strict=False):
                assert held >= self.engine.blocks.blocks_for(
                    len(s.prompt_ids) + s.params.max_new_tokens
                )
        # static never admits into a batch that still has a live member
        if cfg["policy"] == "static" and batch.admitted:
            assert info["live_before"] == 0, "static admitted mid-batch"
        # chunked never computes more than its token budget
        if cfg["policy"] == "chunked":
            assert sum(n for _, n in batch.items) <= cfg["chunk_budget"], (
                "chunked went over its token budget"
            )
        assert not {s.id for s in batch.admitted} & {s.id for s in batch.preempted}
        # the newest running sequence is preempted first: anything newer than a victim was itself
        # preempted or got its tokens this step
        order, done = (
            info["live_order"],
            {s.id for s, _ in batch.items} | {s.id for s in batch.preempted},
        )
        for victim in batch.preempted:
            assert victim.id in order, "preempted a sequence that was not running"
            assert all(q in done for q in order[order.index(victim.id) + 1 :]), (
                "preempted an older sequence first"
            )
        self.preempted.extend(s.id for s in batch.preempted)

    def check_record(self, rec: dict, info: dict, used_before: int) -> None:
        """The step record tells the truth about the batch it reports."""
        batch, cfg = info["batch"], info["cfg"]
        self.records.append(rec)
        if cfg["runner"] == "sync":
            assert rec["policy"] == cfg["policy"]
        if cfg["policy"] == "chunked":
            assert rec["tokens"]["prefill"] + rec["tokens"]["decode"] <= cfg["chunk_budget"]
        # every token the step computed is in the record, on the slot of the sequence it belongs to
        assert rec["tokens"]["prefill"] + rec["tokens"]["decode"] == sum(
            n for _, n in batch.items
        ), rec["tokens"]
        assert rec["tokens"]["dead"] == len(batch.dead)
        slots = {s["slot"]: s for s in rec["slots"]}
        assert len(slots) == len(rec["slots"])
        for rid, n, slot, cached, total, prompt_len in info["items"]:
            view = slots[slot]
            assert (view["request"], view["tokens"]) == (rid, n), (view, rid, n)
            # decode: the one token that samples the next one; anything else (prompt, or outputs
            # recomputed after a preemption) is prefill
            decode = n == 1 and cached + 1 == total and cached >= prompt_len
            assert view["phase"] == ("decode" if decode else "prefill"), (
                view,
                cached,
                total,
                prompt_len,
            )
        for rid, slot in info["dead"]:
            assert slots[slot] == {"slot": slot, "request": rid, "phase": "dead", "tokens": 1}
        assert rec["admitted"] == [s.id for s in batch.admitted]
        assert rec["preempted"] == [s.id for s in batch.preempted]
        assert rec["queue_len"] == len(self.engine.scheduler.waiting)
        kv = rec["kv"]
        # as the step ran (right after scheduling), or as it ended: both are states check_pool
        # vetted
        assert kv["blocks_used"] in (info["used_after"], self.engine.blocks.num_used)
        assert kv["blocks_total"] == info["budget"]
        assert kv["tokens_allocated"] == kv["blocks_used"] * BLOCK_SIZE
        assert kv["tokens_stored"] <= kv["tokens_allocated"]

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
        if any(n == 1 and s.num_cached + 1 < s.num_tokens for s, n in batch.items):
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

    def check_end(self) -> None:
        e = self.engine
        assert not e.scheduler.running and not e.scheduler.waiting
        assert e.blocks.num_used == 0 and e.live_requests() == []
        e.blocks.check()
        for h in self.handles:
            seq = h.seq
            log = self.events[h.id]
            # the handle's own stream saw the same events, in the same order
            assert list(h._events.queue) == log
            assert seq.status in (Status.FINISHED, Status.CANCELLED, Status.FAILED), seq.status
            terminal = [i for i, ev in enumerate(log) if ev.kind != "token"]
            assert len(terminal) == 1, f"request {h.id}: {len(terminal)} terminal events"
            assert terminal[0] == len(log) - 1, "an event came after the terminal one"
            last = log[-1]
            assert last.request == h.id
            if seq.status is Status.FAILED:
                assert last.kind == "error" and last.error_code == "kv_budget_too_small"
            else:
                assert last.kind == "done" and last.status == seq.status.value
            tokens = [ev.token_id for ev in log[:-1]]
            assert tokens == seq.output_ids, "streamed tokens != output tokens"
            prompt, max_new, ignore_eos = self.prompts[h.id]
            assert len(seq.output_ids) <= max_new
            if seq.status is Status.FINISHED:
                assert len(seq.output_ids) == max_new or (
                    not ignore_eos and seq.output_ids[-1] == EOS
                )
            if not ignore_eos:
                assert EOS not in seq.output_ids[:-1], "generation went on past EOS"
            assert e.telemetry.requests[h.id]["status"] == seq.status.value


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
