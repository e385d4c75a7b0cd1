"""A request from the outside: turning chat input into token ids, validating it, and the caller's
handle on its stream. Everything here raises a coded :class:`FluxoError` before anything is
queued."""

from __future__ import annotations

import math
import queue
from collections.abc import Iterator
from dataclasses import dataclass

from engine.core.config import EngineConfig
from engine.core.errors import (
    EmptyPrompt,
    InvalidMaxTokens,
    InvalidSampling,
    InvalidTokenIds,
    KVBudgetTooSmall,
    PromptTooLong,
)
from engine.core.model import chat_ids
from engine.core.numbers import ceil_div, is_int
from engine.core.sequence import PLACEHOLDER, Event, SamplingParams, Sequence


@dataclass(frozen=True, slots=True)
class Request:
    """What a caller asks the engine for: one prompt (exactly one of chat ``messages``, a text
    ``prompt`` or ``token_ids``) and how to answer it. ``Engine.submit`` checks it; the server
    makes one from a chat message or an HTTP body, the traffic generator from its arrivals."""

    messages: list[dict] | None = None
    prompt: str | None = None
    token_ids: list[int] | None = None
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False  # generate to max_new_tokens (load generators, benchmarks)
    client: str = ""  # who sent it: a connection id, "traffic", "http:<peer>"; "" for library use


def checked(
    request: Request, tokenizer, config: EngineConfig, vocab_size: int
) -> tuple[list[int], SamplingParams]:
    """``request``'s prompt as token ids and its sampling parameters, every field checked."""
    token_ids = request.token_ids
    if token_ids is None:
        token_ids = encode(tokenizer, request.messages, request.prompt)
    check_token_ids(token_ids, vocab_size)
    r = request
    params = check_params(config, len(token_ids), r.max_new_tokens, r.temperature, r.top_p, r.seed)
    params.ignore_eos = bool(r.ignore_eos)
    return list(token_ids), params


def encode(tokenizer, messages: list[dict] | None = None, prompt: str | None = None) -> list[int]:
    """Chat messages (or a single user prompt) through the model's chat template."""
    if messages is not None:
        if not messages or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role")
            for m in messages
        ):
            raise EmptyPrompt("messages must be a non-empty list of {role, content} objects")
        if not any(m["content"].strip() for m in messages):
            raise EmptyPrompt("the chat messages are empty")
        return chat_ids(tokenizer, messages)
    if not isinstance(prompt, str) or not prompt.strip():
        raise EmptyPrompt("the prompt is empty")
    return chat_ids(tokenizer, [{"role": "user", "content": prompt}])


def check_token_ids(token_ids: list[int], vocab: int) -> None:
    if not token_ids:
        raise EmptyPrompt("the prompt has no tokens")
    if not all(is_int(t) and 0 <= t < vocab for t in token_ids):
        raise InvalidTokenIds(f"token ids must be integers in [0, {vocab})")


def check_params(
    cfg: EngineConfig,
    n_prompt: int,
    max_new: object,
    temperature: object,
    top_p: object,
    seed: object,
) -> SamplingParams:
    if n_prompt >= cfg.max_model_len:
        raise PromptTooLong(
            f"the prompt has {n_prompt} tokens; the context holds {cfg.max_model_len}"
        )
    if not is_int(max_new) or max_new <= 0:
        raise InvalidMaxTokens(f"max_new_tokens must be a positive integer, got {max_new!r}")
    if max_new > cfg.max_new_tokens_limit:
        raise InvalidMaxTokens(
            f"max_new_tokens {max_new} is over this engine's limit of {cfg.max_new_tokens_limit}"
        )
    if n_prompt + max_new > cfg.max_model_len:
        raise InvalidMaxTokens(
            f"prompt ({n_prompt}) + max_new_tokens ({max_new}) exceeds the context of "
            f"{cfg.max_model_len}"
        )
    if (
        not isinstance(temperature, (int, float))
        or not 0 <= temperature <= 10  # first: an int past a float's range is out of it
        or not math.isfinite(temperature)
    ):
        raise InvalidSampling(f"temperature must be in [0, 10], got {temperature!r}")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise InvalidSampling(f"top_p must be in (0, 1], got {top_p!r}")
    if seed is not None and not is_int(seed):
        raise InvalidSampling(f"seed must be an integer, got {seed!r}")
    need = ceil_div(n_prompt + max_new, cfg.block_size)
    if need > cfg.kv_blocks:
        raise KVBudgetTooSmall(
            f"this request needs {need} KV blocks at full length; the budget is {cfg.kv_blocks}"
        )
    return SamplingParams(
        max_new_tokens=max_new, temperature=float(temperature), top_p=float(top_p), seed=seed
    )


class RequestHandle:
    """The caller's side of a request: a stream of events ending in exactly one done/error."""

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.id = seq.id
        self._events: queue.Queue[Event] = queue.Queue()

    def push(self, event: Event) -> None:
        self._events.put(event)

    def __iter__(self) -> Iterator[Event]:
        while True:
            event = self._events.get()
            yield event
            if event.kind != "token":
                return

    @property
    def done(self) -> bool:
        return self.seq.status.ended

    @property
    def token_ids(self) -> list[int]:
        """Tokens produced so far (a token the async runner is still computing is not one yet)."""
        return [t for t in self.seq.output_ids if t != PLACEHOLDER]


def detokenize(tokenizer, seq: Sequence, upto: int) -> str:
    """Text added by output token ``upto - 1``; holds back the bytes of a character not yet
    complete (incremental detokenization over ``seq``'s prefix/read offsets)."""
    ids = seq.output_ids
    prev = tokenizer.decode(ids[seq.prefix_offset : seq.read_offset], skip_special_tokens=True)
    new = tokenizer.decode(ids[seq.prefix_offset : upto], skip_special_tokens=True)
    if new.endswith("\ufffd"):
        return ""
    seq.prefix_offset, seq.read_offset = seq.read_offset, upto
    return new[len(prev) :]
