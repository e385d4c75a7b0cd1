"""What a policy sees: a read-only snapshot of the engine between two steps.

Every value is a copy (frozen dataclasses, tuples, numbers): a hook can read the queue, the
running requests, the free slots and blocks, its token budget and the clock, and can change
nothing. The tuples are built on first use, so a hook that never reads the queue never pays for
copying it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from engine.core.sequence import Sequence


@dataclass(frozen=True, slots=True)
class Waiting:
    """A request in the queue (never admitted, or preempted and sent back)."""

    id: int
    client: str  # who sent it: a connection id, "traffic", a trace's client
    arrival: float  # engine clock, seconds
    prompt_len: int  # prompt tokens
    num_tokens: int  # prompt + tokens generated so far (more than prompt_len after a preemption)
    max_new_tokens: int
    preemptions: int


@dataclass(frozen=True, slots=True)
class Running:
    """A request holding a slot (static dead slots are left out: they compute nothing)."""

    id: int
    client: str
    arrival: float
    prompt_len: int
    generated: int  # output tokens so far
    pending: int  # tokens not in the KV cache yet: 1 while decoding, more while prefilling
    max_new_tokens: int
    blocks: int  # KV blocks it holds
    preemptions: int


def waiting_view(seq: Sequence) -> Waiting:
    return Waiting(
        seq.id,
        seq.client,
        seq.arrival,
        len(seq.prompt_ids),
        seq.num_tokens,
        seq.params.max_new_tokens,
        seq.preemptions,
    )


def running_view(seq: Sequence) -> Running:
    return Running(
        seq.id,
        seq.client,
        seq.arrival,
        len(seq.prompt_ids),
        len(seq.output_ids),
        seq.pending,
        seq.params.max_new_tokens,
        len(seq.block_table),
        seq.preemptions,
    )


class View:
    """The engine as a hook sees it. ``waiting`` and ``running`` are tuples in queue and
    admission order; ``tokens_left`` is what the step's token budget still allows (None: no
    budget); ``step_cost_s(tokens, logit_rows, attention_pairs)`` prices a step on the engine's
    cost model (None before it is fitted); ``itl_chunk_budget(factor)`` is the largest chunk
    budget whose step costs at most ``factor`` decode-only steps (``cost_model.itl_chunk_budget``).
    """

    __slots__ = (
        "now",
        "free_slots",
        "free_blocks",
        "block_size",
        "max_slots",
        "chunk_budget",
        "fill_timeout_s",
        "tokens_left",
        "_queue",
        "_live",
        "_waiting",
        "_running",
        "_price",
        "_itl",
    )

    def __init__(
        self,
        now: float,
        queue: Iterable[Sequence],
        live: Iterable[Sequence],
        limits: tuple[int, int, int, int, int, float],
        tokens_left: int | None,
        price: Callable[[int, int, int], float | None],
        itl: Callable[[float], int | None],
    ) -> None:
        self.now = now
        self._queue, self._live = queue, live
        (
            self.free_slots,
            self.free_blocks,
            self.block_size,
            self.max_slots,
            self.chunk_budget,
            self.fill_timeout_s,
        ) = limits
        self.tokens_left = tokens_left
        self._waiting: tuple[Waiting, ...] | None = None
        self._running: tuple[Running, ...] | None = None
        self._price, self._itl = price, itl

    @property
    def waiting(self) -> tuple[Waiting, ...]:
        if self._waiting is None:
            self._waiting = tuple(map(waiting_view, self._queue))
        return self._waiting

    @property
    def running(self) -> tuple[Running, ...]:
        if self._running is None:
            self._running = tuple(map(running_view, self._live))
        return self._running

    def step_cost_s(self, tokens: int, logit_rows: int, attention_pairs: int) -> float | None:
        return self._price(tokens, logit_rows, attention_pairs)

    def itl_chunk_budget(self, factor: float = 2.0) -> int | None:
        return self._itl(factor)
