"""One engine step as a plain, JSON-ready record: pure functions on plain values.

The scheduler subclass (``scheduler.py``) reads vLLM's objects and hands plain numbers here, so
this logic is tested without vLLM (tests/observe/). A record's fields (wire version 1):

  v, rank, step (vLLM's own ``Scheduler.current_step``), seq (this rank's publish count, from 1),
  dropped (records this rank could not send so far), t (wall-clock stamps on vLLM's monotonic
  clock: schedule start, schedule end, output start, output end), sched ([req, tokens, phase]),
  new ({req: {prompt: its length, cached: tokens from the prefix cache}}: scheduled
  for the first time), arrivals ({req: arrival wall time}),
  out ({req: tokens produced}), finished ({req: reason}), aborted, preempted,
  kv ({total, used, shared}), waiting, running, limits ({max_num_seqs, max_num_batched_tokens,
  block_size}).
"""

from __future__ import annotations

from typing import Any

Record = dict[str, Any]


def phase_of(computed_before: int, scheduled: int, prompt_len: int, num_tokens: int) -> str:
    """``prefill`` while a request computes tokens it already knows (its prompt, or its prompt and
    output again after a preemption: vLLM recomputes), ``decode`` for the one new token a step."""
    if computed_before < prompt_len or computed_before + scheduled < num_tokens:
        return "prefill"
    return "decode"


def step_record(
    *,
    rank: int,
    step: int,
    seq: int,
    dropped: int,
    stamps: tuple[float, float, float, float],
    sched: list[tuple[str, int, str]],
    new: dict[str, dict[str, int]],
    arrivals: dict[str, float],
    out: dict[str, int],
    finished: dict[str, str],
    aborted: list[str],
    preempted: list[str],
    kv: dict[str, int],
    waiting: int,
    running: int,
    limits: dict[str, int],
) -> Record:
    """The wire record (version 1), its stamps rounded to the microsecond."""
    return {
        "v": 1,
        "rank": rank,
        "step": step,
        "seq": seq,
        "dropped": dropped,
        "t": [round(x, 6) for x in stamps],
        "sched": [[r, n, p] for r, n, p in sched],
        "new": new,
        "arrivals": {r: round(t, 6) for r, t in arrivals.items()},
        "out": out,
        "finished": finished,
        "aborted": aborted,
        "preempted": preempted,
        "kv": kv,
        "waiting": waiting,
        "running": running,
        "limits": limits,
    }


def shared_blocks(ref_counts: list[int]) -> int:
    """Blocks referenced by more than one request (the prefix cache sharing them)."""
    return sum(1 for c in ref_counts if c > 1)
