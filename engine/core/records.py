"""The telemetry contract: the step and request records, as types.

Everything the lab shows is read off these two records: the page's charts, the benchmarks, the
lessons' claims, the Prometheus metrics and the recorded sessions. They are plain JSON-ready
dicts at run time (``TypedDict`` costs nothing); this module is the one place that says what each
field means and what a reader may accept (``Annotated`` bounds: ``Range``, ``Text``, ``Default``;
``engine/core/schema.py`` reads them to check a recording, ``schema_export.py`` to write the
browser's copy and the tables in ``docs/protocol.md``). ``engine/core/telemetry.py`` builds
request records, ``engine/core/step_record.py`` step records, ``engine/observe/translate.py`` an
observed vLLM's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, TypedDict, get_args

Record = dict[str, Any]  # where no TypedDict is declared: events, the Chrome trace, chart rows
Phase = Literal["prefill", "decode", "dead", "idle"]
Lane = Literal["cpu_prepare", "h2d", "compute", "d2h", "cpu_update"]
Runner = Literal["sync", "async"]  # sync: prepare, execute, finish in a row; async: overlapped
Hook = Literal["token_budget", "prefill_tokens", "preempt", "admit"]  # a policy's, asked in order
PHASES: tuple[Phase, ...] = get_args(Phase)  # a slot's phase in a step
LANES: tuple[Lane, ...] = get_args(Lane)  # the lanes of a step's spans, in the trace's order
HOOKS: tuple[Hook, ...] = get_args(Hook)
OBSERVED_ONLY = ("rank", "vllm_step")  # step record fields only an observed vLLM writes


# -- bounds: what a reader of a record (a recording anyone may hand the teacher) checks ----------
@dataclass(frozen=True)
class Range:
    """An integer in [lo, hi]; a list of at most ``hi`` items; a string of at most ``hi``."""

    lo: int = 0
    hi: int = 10**12


@dataclass(frozen=True)
class Text:
    """A string matching ``pattern`` (a regular expression, whole), at most ``most`` long."""

    pattern: str = r"[A-Za-z0-9_.:-]{1,64}"
    most: int = 64


@dataclass(frozen=True)
class Default:
    """A field older records may lack: read as ``value``."""

    value: Any


Count = Annotated[int, Range()]  # a count or an id, 0 .. 10**12
Seconds = Annotated[float, "seconds"]  # the engine clock: a finite number
Name = Annotated[str, Text()]  # a policy's or a client's name
Ids = Annotated[list[Count], Range(0, 100_000)]  # request ids
# mode switches, pauses, failures: {"kind", ...} with plain names for keys, short scalars (or
# flat objects of them) for values; a refused policy decision is {"kind": "policy_error",
# "code": "policy_error", "policy", "hook", "error"}
Event = Annotated[dict[str, Any], "event"]


class SlotRecord(TypedDict):
    slot: Annotated[int, Range(0, 4096)]  # batch slot index
    request: Count | None  # the request holding it, None when idle
    phase: Phase  # dead: a static batch's ended member, still computed; idle: nothing computed
    tokens: Count  # tokens this slot computed in the step (a prefill chunk's length, 1 for decode)


class KVRecord(TypedDict):
    blocks_total: Count  # the presenter's budget, in blocks
    blocks_used: NotRequired[Count]  # blocks referenced by at least one sequence
    tokens_stored: Count  # sum of num_computed over sequences holding blocks (a shared block once)
    tokens_allocated: Count  # blocks_used * block_size
    blocks_shared: NotRequired[Count]  # prefix cache: blocks referenced by more than one sequence
    blocks_cached: NotRequired[Count]  # prefix cache: free blocks whose content is still findable


class SpanRecord(TypedDict):
    lane: Lane
    start: Seconds  # engine clock, seconds
    end: Seconds


class TokenCounts(TypedDict):
    prefill: Annotated[Count, Default(0)]
    decode: Annotated[Count, Default(0)]
    dead: Annotated[Count, Default(0)]


class StepRecord(TypedDict):
    step: Count  # 1, 2, ... since the engine started (or was reset)
    # engine clock (seconds since the engine started); state.wall_offset maps it to wall time
    t_start: Seconds
    t_end: Seconds  # engine clock as the step's tokens were back and streamed
    policy: Name  # static / continuous / chunked or a loaded policy's name, as scheduled
    runner: Runner  # sync: prepare, execute, finish in a row; async: overlapped
    slots: Annotated[list[SlotRecord], Range(0, 4096)]  # every slot, idle ones included
    admitted: Ids  # request ids admitted in this step
    finished: Ids  # request ids that ended in this step
    preempted: Ids  # request ids preempted (their KV dropped; they wait again)
    # prefix cache: request id -> prompt tokens taken from the cache
    admitted_cached: NotRequired[dict[int, Count]]
    cached_tokens: NotRequired[Count]  # sum of admitted_cached
    queue_len: Count  # requests waiting after the step was scheduled
    kv: KVRecord  # the KV pool as the step leaves it
    tokens: TokenCounts  # tokens computed in the step, by phase
    spans: Annotated[list[SpanRecord], Range(0, 64)]  # measured host and device work of the step
    events: Annotated[list[Event], Range(0, 64)]  # mode switches, pauses, failures before this step
    # the hooks whose answers this step were a loaded policy's own, in the order first asked;
    # empty for a built-in. A hook refused (its policy_error event) and everything after it was
    # decided by the continuous defaults.
    decided: NotRequired[Annotated[list[Hook], Range(0, 4)]]
    # the cost model's duration for this step's work on a quiet machine
    expected_s: NotRequired[Seconds | None]
    rank: NotRequired[Annotated[int, Range(0, 1024)]]  # an observed vLLM's data-parallel rank
    vllm_step: NotRequired[Count]  # that rank's own step count (observed vLLM only)


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
