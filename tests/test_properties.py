"""Property tests (hypothesis) of the KV block pool and of the engine under random programs.

1. The block pool alone, as a state machine: grow / release / set_budget keep exact accounting.
2. Random programs against the engine (submit, cancel, step, live reconfigure, then drain): the
   scheduler's contracts hold at every step and every request ends exactly once.
3. Preemption under a tight paged budget does not change greedy outputs.
4. Greedy outputs do not depend on policy, layout, runner, slots, budget or live switches.

Everything runs on the tiny float64 Llama (byte tokenizer, EOS = 258): a step takes a few ms.
Engine bugs these properties found are pinned at the end by their minimal reproductions, now
regression tests: BUG-A (fixed in c486857) and BUG-B (fixed in edf3bb1).
"""

from __future__ import annotations

from collections import deque

import pytest
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple, rule

from engine.core.block_manager import BlockManager, OutOfBlocks
from engine.core.errors import FluxoError
from engine.core.sequence import SamplingParams, Sequence, Status

EOS = 258
BLOCK_SIZE = 4
MAX_PROMPT = 20
MAX_NEW = 12
POLICIES = ("static", "continuous", "chunked")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny model gains nothing from intra-op threads, and on a busy 2-core machine torch's
    thread pool makes a step ~100x slower (7 s instead of 0.04 s for one preemption run)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


PROP = dict(
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


# --------------------------------------------------------------------------------------------------
# 1. BlockManager alone
# --------------------------------------------------------------------------------------------------


def _fake_seq() -> Sequence:
    return Sequence(prompt_ids=[0], params=SamplingParams())


class BlockPoolMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    @initialize(
        target=seqs,
        budget=st.integers(1, 24),
        block_size=st.integers(1, 8),
        extra=st.one_of(st.none(), st.integers(0, 16)),
    )
    def setup(self, budget: int, block_size: int, extra: int | None):
        capacity = None if extra is None else budget + extra
        self.bm = BlockManager(budget, block_size, capacity)
        assert self.bm.capacity == max(budget, capacity or 0)
        assert self.bm.num_used == 0 and self.bm.num_free == budget
        # every sequence made (tables may be empty)
        self.held: list[Sequence] = [_fake_seq() for _ in range(3)]
        return multiple(*self.held)

    @rule(target=seqs)
    def new_seq(self) -> Sequence:
        seq = _fake_seq()
        self.held.append(seq)
        return seq

    @rule(seq=seqs, num_tokens=st.integers(0, 80))
    def grow(self, seq: Sequence, num_tokens: int) -> None:
        bm = self.bm
        need = bm.blocks_for(num_tokens) - len(seq.block_table)
        used, table = bm.num_used, list(seq.block_table)
        can = bm.can_grow(seq, num_tokens)
        assert can == (need <= bm.num_free)
        if can:
            bm.grow(seq, num_tokens)
            assert len(seq.block_table) == max(len(table), bm.blocks_for(num_tokens))
            assert seq.block_table[: len(table)] == table  # existing blocks are kept, in order
            if need > 0:
                assert bm.num_used == used + need
                assert bm.num_used <= bm.budget, "a grow went over the budget"
        else:
            with pytest.raises(OutOfBlocks):
                bm.grow(seq, num_tokens)
            assert seq.block_table == table and bm.num_used == used, "a failed grow changed state"

    @rule(seq=seqs)
    # a released sequence may grow again, as a preempted one does
    def release(self, seq: Sequence) -> None:
        bm = self.bm
        used, n, table = bm.num_used, len(seq.block_table), list(seq.block_table)
        bm.release(seq)
        assert seq.block_table == [] and bm.num_used == used - n
        # releasing the same sequence again is a no-op (its table is empty now) ...
        bm.release(seq)
        assert bm.num_used == used - n
        # ... but handing the same blocks back a second time is a double free, and is refused
        if table:
            stale = _fake_seq()
            stale.block_table = list(table)
            with pytest.raises(AssertionError, match="double free"):
                bm.release(stale)
            assert bm.num_used == used - n, "a refused double free changed state"

    @rule(budget=st.integers(1, 40))
    def set_budget(self, budget: int) -> None:
        bm = self.bm
        used, capacity = bm.num_used, bm.capacity
        bm.set_budget(budget)
        assert bm.budget == budget and bm.capacity == max(capacity, budget)
        assert bm.num_used == used  # shrinking never takes blocks away from holders
        if used >= budget:
            assert bm.num_free == 0
            probe = _fake_seq()
            assert not bm.can_grow(probe, 1)

    @invariant()
    def accounting(self) -> None:
        bm = self.bm
        bm.check()
        tables = [b for s in self.held for b in s.block_table]
        assert len(tables) == len(set(tables)), "a block is held by two sequences"
        assert set(tables) == bm._used
        assert bm.num_used + len(bm._free) == bm.capacity
        assert bm.num_free == max(0, bm.budget - bm.num_used)
        assert all(0 <= b < bm.capacity for b in tables)


BlockPoolMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, **PROP)
test_block_pool_state_machine = BlockPoolMachine.TestCase


# --------------------------------------------------------------------------------------------------
# Engine harness: step-by-step invariant checks
# --------------------------------------------------------------------------------------------------

# lengths drawn first so long prompts (which make paged runs preempt) are as likely as short ones
prompts = st.integers(1, MAX_PROMPT).flatmap(
    lambda n: st.lists(st.integers(0, 255), min_size=n, max_size=n)
)


def reconfig_changes(policies=POLICIES):
    return st.fixed_dictionaries(
        {},
        optional={
            "policy": st.sampled_from(policies),
            "max_slots": st.integers(1, 5),
            "kv_layout": st.sampled_from(("paged", "reserved")),
            # 8 blocks hold the longest request; 5..7 exercise the "budget shrank" failure
            "kv_blocks": st.integers(5, 24),
            "chunk_budget": st.integers(1, 12),
            "runner": st.sampled_from(("sync", "async")),
        },
    )


def programs(policies=POLICIES):
    submit = st.tuples(st.just("submit"), prompts, st.integers(1, MAX_NEW), st.booleans())
    op = st.one_of(
        submit,
        st.tuples(st.just("burst"), st.lists(submit, min_size=2, max_size=5)),
        st.tuples(st.just("cancel"), st.integers(0, 1 << 20)),
        st.tuples(st.just("step"), st.integers(1, 6)),
        st.tuples(st.just("reconfigure"), reconfig_changes(policies)),
        st.tuples(st.just("reconfigure"), reconfig_changes(policies)),
    )
    start = st.fixed_dictionaries(
        {
            "policy": st.sampled_from(policies),
            "max_slots": st.integers(1, 5),
            "kv_layout": st.sampled_from(("paged", "reserved")),
            "kv_blocks": st.integers(8, 16),  # tight enough that paged runs preempt
            "chunk_budget": st.integers(1, 12),
            "runner": st.sampled_from(("sync", "async")),
        }
    )
    return st.tuples(start, st.lists(op, min_size=3, max_size=25))


def _sub(n: int, max_new: int, ignore_eos: bool = True, first: int = 0) -> tuple:
    return ("submit", [(first + 7 * i) % 256 for i in range(n)], max_new, ignore_eos)


# Hand-written programs that random generation reaches only rarely; both engine-level properties run
# them.
SCENARIOS = [
    # pool runs dry under paged continuous, then chunked (small budget), static and back, fewer
    # slots
    (
        {
            "policy": "continuous",
            "max_slots": 5,
            "kv_layout": "paged",
            "kv_blocks": 8,
            "chunk_budget": 8,
        },
        [
            ("burst", [_sub(12, 12, first=k) for k in range(5)]),
            ("step", 4),
            ("reconfigure", {"policy": "chunked", "chunk_budget": 3, "runner": "async"}),
            ("step", 5),
            ("reconfigure", {"policy": "static"}),
            ("step", 6),
            ("reconfigure", {"policy": "continuous", "max_slots": 2}),
            ("step", 3),
            ("reconfigure", {"kv_layout": "reserved", "runner": "sync"}),
            ("cancel", 5),
            ("step", 2),
        ],
    ),
    # live decrease of slots and a KV budget shrunk below what is in use, then grown back
    (
        {
            "policy": "chunked",
            "max_slots": 5,
            "kv_layout": "paged",
            "kv_blocks": 16,
            "chunk_budget": 7,
        },
        [
            ("burst", [_sub(n, 10, first=n) for n in (3, 20, 9, 14, 5)]),
            ("step", 6),
            ("reconfigure", {"max_slots": 1}),
            ("step", 1),
            ("reconfigure", {"kv_blocks": 6}),
            ("step", 6),
            ("reconfigure", {"max_slots": 3, "kv_blocks": 24, "chunk_budget": 1}),
            ("step", 4),
            ("burst", [_sub(2, 3, False), _sub(17, 12, first=3)]),
            ("step", 2),
        ],
    ),
    # a static batch with dead slots is released into continuous mid-batch, then static again
    (
        {
            "policy": "static",
            "max_slots": 3,
            "kv_layout": "reserved",
            "kv_blocks": 24,
            "chunk_budget": 4,
            "runner": "async",
        },
        [
            ("burst", [_sub(4, 1), _sub(6, 6, False), _sub(8, 12)]),
            ("step", 3),
            ("reconfigure", {"policy": "continuous"}),
            ("submit", [1, 2, 3], 4, True),
            ("step", 2),
            ("reconfigure", {"policy": "static", "kv_layout": "paged", "kv_blocks": 8}),
            ("burst", [_sub(9, 5), _sub(11, 7)]),
            ("cancel", 1),
            ("step", 5),
        ],
    ),
]


def with_scenarios(test):
    for start, ops in SCENARIOS:
        test = example(program=(start, ops))(test)
    return test


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


# --------------------------------------------------------------------------------------------------
# 2. Engine invariants under random programs
# --------------------------------------------------------------------------------------------------


@settings(max_examples=150, **PROP)
@with_scenarios
@given(programs())
def test_random_programs_keep_engine_invariants(make_tiny_engine, program):
    start, ops = program
    run_program(make_tiny_engine, start, ops)


# --------------------------------------------------------------------------------------------------
# 3. Preemption does not change greedy outputs
# --------------------------------------------------------------------------------------------------


@settings(max_examples=20, **PROP)
@given(
    policy=st.sampled_from(("continuous", "static")),
    runner=st.sampled_from(("sync", "async")),
    reqs=st.lists(
        st.tuples(st.lists(st.integers(0, 255), min_size=8, max_size=12), st.integers(8, 12)),
        min_size=4,
        max_size=5,
    ),
)
def test_preemption_keeps_greedy_outputs(make_tiny_engine, policy, runner, reqs):
    # Each request needs 4..6 blocks at full length and fits alone in 10; three running together
    # need 12 by the time each has 5 outputs (none can have finished), so the pool must run dry.
    outputs = {}
    for kv_blocks in (10, 64):
        hz = Harness(
            make_tiny_engine(
                policy=policy, runner=runner, kv_layout="paged", kv_blocks=kv_blocks, max_slots=4
            )
        )
        handles = [hz.submit(p, n, True) for p, n in reqs]
        hz.drain()
        hz.check_end()
        outputs[kv_blocks] = [h.token_ids for h in handles]
        if kv_blocks == 10:
            assert hz.preempted, "no preemption happened: the test would be meaningless"
            assert any(h.seq.preemptions for h in handles)
        else:
            assert not hz.preempted
        assert all(h.seq.status is Status.FINISHED for h in handles)
    assert outputs[10] == outputs[64]
    assert outputs[10] == [reference(make_tiny_engine, p, n, True) for p, n in reqs]


# --------------------------------------------------------------------------------------------------
# 4. Greedy outputs do not depend on the schedule
# --------------------------------------------------------------------------------------------------


@settings(max_examples=100, **PROP)
@with_scenarios
@given(programs())
def test_greedy_outputs_independent_of_schedule(make_tiny_engine, program):
    start, ops = program
    hz = run_program(make_tiny_engine, start, ops)
    check_greedy(make_tiny_engine, hz)


# --------------------------------------------------------------------------------------------------
# Bugs these properties found: minimal reproductions, kept as regression tests
# --------------------------------------------------------------------------------------------------


def test_bug_a_one_token_prefill_chunk_does_not_sample(make_tiny_engine):
    """BUG-A (fixed in c486857): a 1-token prefill chunk that does not finish the prompt rode with
    the
    decodes in ModelRunner.build and sampled a token mid-prompt: [1, 2, 3, 4, 5] under
    chunk_budget=1
    gave [258, 258, 258, 96] instead of [40, 40, 182, 87]."""
    prompt = [1, 2, 3, 4, 5]
    ref = reference(make_tiny_engine, prompt, 4, True)
    e = make_tiny_engine(policy="chunked", chunk_budget=1)
    h = e.submit(token_ids=prompt, max_new_tokens=4, ignore_eos=True)
    for _ in range(len(prompt) - 1):  # one prompt token per step; none of these steps may sample
        rec = e.step()
        assert rec["tokens"] == {"prefill": 1, "decode": 0, "dead": 0}
        assert h.token_ids == [], "a token was sampled before the prompt was complete"
    e.run_until_idle()
    assert h.token_ids == ref


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_bug_b_last_token_step_is_recorded(make_tiny_engine, policy):
    """BUG-B (present up to c486857; fixed in edf3bb1 by the prepare/execute/finish step):
    the record was built after the step's bookkeeping, so a request computing its last token was
    already gone from the running list: its slot showed 'idle' with 0 tokens (continuous/chunked) or
    'dead' (static, while tokens['dead'] said 0), and tokens['prefill'] + tokens['decode']
    undercounted."""
    e = make_tiny_engine(policy=policy)
    h = e.submit(token_ids=[1, 2, 3, 4, 5], max_new_tokens=2, ignore_eos=True)
    first = e.step()  # prefill of 5 tokens, samples output 1
    last = e.step()  # decode of 1 token, samples output 2: the request finishes
    assert first["tokens"] == {"prefill": 5, "decode": 0, "dead": 0}
    assert last["finished"] == [h.id]
    assert last["tokens"] == {"prefill": 0, "decode": 1, "dead": 0}
    assert {"slot": 0, "request": h.id, "phase": "decode", "tokens": 1} in last["slots"], last[
        "slots"
    ]
