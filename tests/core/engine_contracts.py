"""The scheduler's contracts, checked by the engine harness (tests/core/engine_harness.py) at every
step of a random program: exact KV accounting and one place per sequence (the pool), the rules a
batch is formed by (slots, KV budget, policies, preemption order), a step record that tells the
truth about its batch, and every request ending exactly once with the tokens it streamed.
"""

from __future__ import annotations

from engine_programs import BLOCK_SIZE, EOS

from engine.core.sequence import Status


def check_pool(engine, handles: list) -> None:
    """Exact KV accounting, and every sequence in exactly one consistent place."""
    e = engine
    bm, sch = e.blocks, e.scheduler
    bm.check(holders=sch.running)  # each reference count = the running tables holding the block
    held = [b for s in sch.running for b in s.block_table]
    # prefix caching: sequences may share a block (counted once in num_used)
    assert bm.num_used == len(set(held)), "blocks used != blocks held by running sequences (leak)"
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
            and s.num_computed == 0
            and s.status in (Status.QUEUED, Status.PREEMPTED)
        )
    for s in sch.running:
        assert s.status is Status.RUNNING or (s.dead and s.status.ended)
        assert not s.dead or (e.config.policy == "static" and sch.batch_open)
        assert len(s.block_table) * bm.block_size >= s.num_computed
    for h in handles:
        if h.seq.status.ended and not h.seq.dead:
            assert h.seq.block_table == [], "an ended request still holds KV blocks"


def check_batch(engine, info: dict) -> None:
    """The scheduling contracts, checked on each batch as it is formed."""
    batch, cfg = info["batch"], info["cfg"]
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
            assert held >= engine.blocks.blocks_for(len(s.prompt_ids) + s.params.max_new_tokens)
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


def check_record(engine, rec: dict, info: dict) -> None:
    """The step record tells the truth about the batch it reports."""
    batch, cfg = info["batch"], info["cfg"]
    if cfg["runner"] == "sync":
        assert rec["policy"] == cfg["policy"]
    if cfg["policy"] == "chunked":
        assert rec["tokens"]["prefill"] + rec["tokens"]["decode"] <= cfg["chunk_budget"]
    # every token the step computed is in the record, on the slot of the sequence it belongs to
    assert rec["tokens"]["prefill"] + rec["tokens"]["decode"] == sum(n for _, n in batch.items), (
        rec["tokens"]
    )
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
    assert rec["queue_len"] == len(engine.scheduler.waiting)
    kv = rec["kv"]
    # as the step ran (right after scheduling), or as it ended: both are states check_pool
    # vetted
    assert kv["blocks_used"] in (info["used_after"], engine.blocks.num_used)
    assert kv["blocks_total"] == info["budget"]
    assert kv["tokens_allocated"] == kv["blocks_used"] * BLOCK_SIZE
    assert kv["tokens_stored"] <= kv["tokens_allocated"]


def check_end(engine, handles: list, events: dict, prompts: dict) -> None:
    e = engine
    assert not e.scheduler.running and not e.scheduler.waiting
    assert e.blocks.num_used == 0 and e.live_requests() == []
    e.blocks.check()
    for h in handles:
        seq = h.seq
        log = events[h.id]
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
        prompt, max_new, ignore_eos = prompts[h.id]
        assert len(seq.output_ids) <= max_new
        if seq.status is Status.FINISHED:
            assert len(seq.output_ids) == max_new or (not ignore_eos and seq.output_ids[-1] == EOS)
        if not ignore_eos:
            assert EOS not in seq.output_ids[:-1], "generation went on past EOS"
        assert e.telemetry.requests[h.id]["status"] == seq.status.value
