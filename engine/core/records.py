"""The telemetry contract: the step and request records, as types.

Everything the lab shows is read off these two records: the page's charts, the benchmarks, the
lessons' claims, the Prometheus metrics and the recorded sessions. They are plain JSON-ready
dicts at run time (``TypedDict`` costs nothing); this module is the one place that says what each
field means. ``engine/core/telemetry.py`` builds request records, ``Engine._record`` step records.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, get_args

Record = dict[str, Any]  # a record where its TypedDict is not needed (telemetry, metrics, charts)
Phase = Literal["prefill", "decode", "dead", "idle"]
Lane = Literal["cpu_prepare", "h2d", "compute", "d2h", "cpu_update"]
PHASES: tuple[Phase, ...] = get_args(Phase)  # a slot's phase in a step
LANES: tuple[Lane, ...] = get_args(Lane)  # the lanes of a step's spans, in the trace's order


class SlotRecord(TypedDict):
    slot: int  # batch slot index
    request: int | None  # the request holding it, None when idle
    phase: Phase  # dead: a static batch's ended member, still computed; idle: nothing computed
    tokens: int  # tokens this slot computed in the step (a prefill chunk's length, 1 for decode)


class KVRecord(TypedDict, total=False):
    blocks_total: int  # the presenter's budget, in blocks
    blocks_used: int  # blocks referenced by at least one sequence
    tokens_stored: int  # sum of num_computed over sequences holding blocks
    tokens_allocated: int  # blocks_used * block_size
    blocks_shared: int  # prefix cache: blocks referenced by more than one sequence
    blocks_cached: int  # prefix cache: free blocks whose content is still findable


class SpanRecord(TypedDict):
    lane: Lane
    start: float  # engine clock, seconds
    end: float


class TokenCounts(TypedDict):
    prefill: int
    decode: int
    dead: int


class StepRecord(TypedDict, total=False):
    step: int  # 1, 2, ... since the engine started (or was reset)
    # engine clock (seconds since the engine started); state.wall_offset maps it to wall time
    t_start: float
    t_end: float
    policy: str  # static / continuous / chunked, as scheduled
    runner: str  # sync / async
    slots: list[SlotRecord]
    admitted: list[int]  # request ids admitted in this step
    finished: list[int]  # request ids that ended in this step
    preempted: list[int]  # request ids preempted (their KV dropped; they wait again)
    # prefix cache: request id -> prompt tokens taken from the cache
    admitted_cached: dict[int, int]
    cached_tokens: int  # sum of admitted_cached
    queue_len: int  # requests waiting after the step was scheduled
    kv: KVRecord
    tokens: TokenCounts  # tokens computed in the step, by phase
    spans: list[SpanRecord]  # measured host and device work of the step
    # mode switches, pauses, failures applied before this step; a refused policy decision is
    # {"kind": "policy_error", "code": "policy_error", "policy", "hook", "error"}
    events: list[dict]
    # the hooks (token_budget, prefill_tokens, preempt, admit) whose answers this step were a
    # loaded policy's own, in the order first asked; empty for a built-in. A hook refused (its
    # policy_error event) and everything after it was decided by the continuous defaults.
    decided: list[str]
    expected_s: float | None  # the cost model's duration for this step's work on a quiet machine


class RequestRecord(TypedDict, total=False):
    id: int
    client: str  # the connection id (c3), "traffic", "http:<peer>", or "" for library use
    prompt_tokens: int
    output_tokens: int
    arrival: float  # engine clock
    admitted: float | None  # first admission
    first_token: float | None
    token_times: list[float]  # engine clock of every streamed token
    finished: float | None
    status: str  # queued / running / preempted / finished / cancelled / failed
    error: str | None
    preemptions: int
    cached_tokens: int  # prefix cache: prompt tokens taken from the cache
    computed_prompt_tokens: int  # prompt tokens actually prefilled
