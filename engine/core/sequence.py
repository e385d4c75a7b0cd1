"""A request as the engine sees it: its tokens, KV blocks, sampling rules and lifecycle."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: a sequence never imports torch
    import torch


class Status(str, Enum):  # noqa: UP042 - a StrEnum would print differently
    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"  # sent back to the queue; its KV will be recomputed
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def ended(self) -> bool:
        return self in (Status.FINISHED, Status.CANCELLED, Status.FAILED)


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False


@dataclass(slots=True)
class Event:
    """What a request's stream receives: ``token`` events, then exactly one ``done`` or
    ``error``."""

    kind: str  # "token" | "done" | "error"
    request: int
    token_id: int | None = None
    text: str = ""
    status: str | None = None
    error_code: str | None = None
    error: str | None = None


_ids = itertools.count(1)

# An output token the in-flight step is still computing (async runner); never streamed as such.
PLACEHOLDER = -1


@dataclass(slots=True, eq=False)
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    client: str = ""
    id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.QUEUED
    block_table: list[int] = field(default_factory=list)
    # prefix-cache keys of its first full blocks
    block_keys: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are computed and in the KV cache
    cached_tokens: int = 0  # tokens its admissions took from the prefix cache (all admissions)
    computed_prompt_tokens: int = (
        0  # tokens it prefilled (prompt, or prompt + output after a preemption)
    )
    prefill_end: int = 0  # tokens known at its latest admission: below this, computing is prefill
    slot: int | None = None
    dead: bool = False  # finished inside a static batch that has not closed yet
    arrival: float = 0.0
    admitted: float | None = None
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    error: str | None = None
    error_code: str | None = None
    preemptions: int = 0
    last_served: int = 0  # scheduler tick of the last step that computed tokens for it
    sink: Callable[[Event], None] | None = None
    generator: torch.Generator | None = None  # for seeded sampling, created lazily
    carry_row: int = -1  # async: row of the in-flight step's output that holds our newest token
    # incremental detokenization offsets
    prefix_offset: int = 0
    read_offset: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def pending(self) -> int:
        """Tokens not yet in the KV cache: the rest of the prompt while prefilling, 1 while
        decoding."""
        return self.num_tokens - self.num_computed

    def token_at(self, i: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[i] if i < n else self.output_ids[i - n]

    def tokens(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:] + self.output_ids[: end - n]

    def emit(self, event: Event) -> None:
        if self.sink is not None:
            self.sink(event)
