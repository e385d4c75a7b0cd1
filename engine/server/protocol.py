"""The wire format of ``docs/protocol.md``: parsing and validating client messages.

Every way a message can be wrong maps to a :class:`FluxoError` with a stable code, raised before
anything reaches the engine; the server turns it into an ``error`` message and keeps the
connection open.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, TypeGuard, overload

from engine.core.errors import FluxoError
from engine.core.numbers import is_finite, is_int
from engine.core.requests import Request

VIEWER_TYPES = frozenset({"chat", "cancel", "subscribe", "unsubscribe", "auth", "export"})
PRESENTER_TYPES = frozenset({"control", "pause", "resume", "step", "traffic", "reset", "compare"})
MAX_MESSAGES = 64  # chat turns in one request
MAX_REF = 128


class BadJson(FluxoError):
    code = "bad_json"


class BadUtf8(FluxoError):
    code = "bad_utf8"


class UnknownType(FluxoError):
    code = "unknown_type"


class BadField(FluxoError):
    code = "bad_field"
    ref: str | None  # declared, set by ``parse`` only: the refused message's own ref, if text


class MessageTooLarge(FluxoError):
    code = "message_too_large"


class Forbidden(FluxoError):
    code = "forbidden"


class BadToken(FluxoError):
    code = "bad_token"


class TooManyRequests(FluxoError):
    code = "too_many_requests"


class RateLimited(FluxoError):
    code = "rate_limited"


class Busy(FluxoError):
    code = "busy"


class FairShare(FluxoError):
    """This address holds its fair share of the queue; the others' places are kept for them."""

    code = "fair_share"


class TooManyConnections(FluxoError):
    """This address has as many connections open as one student may."""

    code = "too_many_connections"


class ForbiddenOrigin(FluxoError):
    """A browser page of another origin, or a ``Host`` that is not this machine (DNS rebinding)."""

    code = "forbidden_origin"


class NotPaused(FluxoError):
    code = "not_paused"


class NothingToRun(FluxoError):
    code = "nothing_to_run"


class CompareRunning(FluxoError):
    code = "compare_running"


class CompareUnavailable(FluxoError):
    code = "compare_unavailable"


def finite(v: object) -> TypeGuard[int | float]:
    """A finite number; an integer too large for a float (``1`` and 400 zeros) is not one (the
    float conversion of ``math.isfinite`` raises ``OverflowError`` for it)."""
    try:
        return is_finite(v)
    except OverflowError:
        return False


_SURROGATE = re.compile("[\ud800-\udfff]")


def refuse_surrogates(value: Any, what: str = "the message") -> None:
    """JSON's ``\\ud800`` escapes can spell a lone surrogate, a code point that is not text: it
    cannot be encoded, tokenized or compared to a token. Refused as ``bad_field`` naming where it
    is (a key or a string at any depth; walked without recursion)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            bad = _SURROGATE.search(v)
            if bad:
                exc = BadField(
                    f"{(path or what)[:80]} holds a lone surrogate (U+{ord(bad.group()):04X}), "
                    "which is not text; send UTF-8 text"
                )
                exc.param = re.split(r"[.\[]", path, maxsplit=1)[0] or None  # the top field
                raise exc
        elif isinstance(v, dict):
            for k, item in v.items():
                if _SURROGATE.search(k):
                    raise BadField(
                        f"a key of {(path or what)[:80]} holds a lone surrogate, which is not text"
                    )
                stack.append((f"{path}.{k}" if path else k, item))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(v))


def parse(raw: str | bytes, max_bytes: int) -> dict[str, Any]:
    """One websocket frame to a message dict (text or binary frames holding UTF-8 JSON)."""
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise MessageTooLarge(f"the message has {size} bytes; the limit is {max_bytes}")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadUtf8(
                f"the message is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
    try:
        msg = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadJson(f"the message is not valid JSON: {str(exc)[:120]}") from None
    if not isinstance(msg, dict):
        raise BadJson(f"a message must be a JSON object, got {type(msg).__name__}")
    kind = msg.get("type")
    if not isinstance(kind, str) or kind not in VIEWER_TYPES | PRESENTER_TYPES:
        shown = repr(kind)[:60]
        raise UnknownType(
            f"unknown message type {shown}; known: "
            f"{', '.join(sorted(VIEWER_TYPES | PRESENTER_TYPES))}"
        )
    if "\\u" in raw:  # only an escape spells a surrogate: the frame itself was valid UTF-8
        try:
            refuse_surrogates(msg)
        except BadField as exc:  # still answered with the message's ref, if that one is text
            ref = msg.get("ref")
            ok = isinstance(ref, str) and len(ref) <= MAX_REF and not _SURROGATE.search(ref)
            exc.ref = ref if ok else None
            raise
    return msg


# -- field readers ---------------------------------------------------------------------------------
@overload
def get_int(msg: dict, name: str, default: int, lo: int, hi: int) -> int: ...
@overload
def get_int(msg: dict, name: str, default: None, lo: int, hi: int) -> int | None: ...
def get_int(msg: dict, name: str, default: int | None, lo: int, hi: int) -> int | None:
    """``msg[name]``, an integer in ``[lo, hi]``, else ``default`` when absent (or null: allowed
    only where ``default`` is None, the one case that returns None)."""
    v = msg.get(name, default)
    if v is None and default is None:
        return None
    if not is_int(v) or not lo <= v <= hi:
        raise BadField(f"{name} must be an integer in [{lo}, {hi}], got {show(v)}")
    return v


def get_float(msg: dict, name: str, default: float, lo: float, hi: float) -> float:
    v = msg.get(name, default)
    if not finite(v) or not lo <= v <= hi:
        raise BadField(f"{name} must be a number in [{lo}, {hi}], got {show(v)}")
    return float(v)


def get_str(msg: dict, name: str, default: str | None, max_len: int) -> str | None:
    v = msg.get(name, default)
    if v is None and default is None:
        return None
    if not isinstance(v, str) or len(v) > max_len:
        raise BadField(f"{name} must be a string of at most {max_len} characters, got {show(v)}")
    return v


def show(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(slots=True)
class ChatArgs:
    messages: list[dict] | None
    prompt: str | None
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    ref: str | None
    ignore_eos: bool

    def request(self, client: str) -> Request:
        """The engine's request for this chat, from ``client`` (a connection id)."""
        return Request(
            messages=self.messages,
            prompt=self.prompt,
            max_new_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            ignore_eos=self.ignore_eos,
            client=client,
        )


def chat_args(msg: dict, max_tokens: int) -> ChatArgs:
    """Shape checks only; the engine checks meaning (empty prompt, context length, KV budget)."""
    messages = msg.get("messages")
    prompt = msg.get("prompt")
    if (messages is None) == (prompt is None):
        raise BadField(
            "a chat needs exactly one of messages (a list of {role, content}) or prompt (a string)"
        )
    if messages is not None:
        if not isinstance(messages, list) or not 0 < len(messages) <= MAX_MESSAGES:
            raise BadField(
                f"messages must be a list of 1 to {MAX_MESSAGES} {{role, content}} objects"
            )
        for m in messages:
            if not (
                isinstance(m, dict)
                and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str)
            ):
                raise BadField(
                    "each message must be {role: system|user|assistant, content: string}"
                )
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    elif not isinstance(prompt, str):
        raise BadField(f"prompt must be a string, got {show(prompt)}")
    mt = msg.get("max_tokens", 128)
    if not is_int(mt) or not 1 <= mt <= max_tokens:
        # Same code as the engine's own check, so a client sees one code for one mistake.
        from engine.core.errors import InvalidMaxTokens

        raise InvalidMaxTokens(
            f"max_tokens must be an integer in [1, {max_tokens}], got {show(mt)}"
        )
    seed = msg.get("seed")
    if seed is not None and (not is_int(seed) or not 0 <= seed < 2**63):
        raise BadField(f"seed must be a non-negative integer or null, got {show(seed)}")
    ignore_eos = msg.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadField(f"ignore_eos must be true or false, got {show(ignore_eos)}")
    return ChatArgs(
        messages,
        prompt,
        mt,
        get_float(msg, "temperature", 0.0, 0.0, 10.0),
        get_float(msg, "top_p", 1.0, 1e-6, 1.0),
        seed,
        get_str(msg, "ref", None, MAX_REF),
        ignore_eos,
    )


CHARS_PER_TOKEN = 16  # more characters than this per token of context cannot fit it


def check_text_size(max_model_len: int, messages: list[dict] | None, prompt: str | None) -> None:
    """A prompt far longer than the context could hold is ``prompt_too_long`` before it is
    tokenized (tens of ms per 60 KB on SmolLM2's tokenizer): no token of a real vocabulary
    covers ``CHARS_PER_TOKEN`` characters on average (security review 2, M2)."""
    from engine.core.errors import PromptTooLong

    n = len(prompt) if prompt is not None else sum(len(m["content"]) for m in messages or ())
    most = CHARS_PER_TOKEN * max_model_len
    if n > most:
        raise PromptTooLong(
            f"the prompt has {n} characters; the context holds {max_model_len} tokens "
            f"(at most {most} characters are tokenized)"
        )


def dumps(msg: dict[str, Any]) -> str:
    """Strict JSON for every client (browsers reject NaN): a ratio of nothing over nothing, or a
    percentile of no data, is sent as null."""
    try:
        return json.dumps(msg, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_finite(msg), separators=(",", ":"), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


@dataclass(slots=True)
class TokenBucket:
    """Requests/s per client (websocket connection or HTTP peer): a bucket of ``2 x rate`` tokens
    (at least 1), full at first, refilled at ``rate`` tokens a second."""

    tokens: float = -1.0  # -1: full on first use
    t: float = field(default_factory=time.monotonic)

    def take(self, rate: float) -> bool:
        now = time.monotonic()
        burst = max(1.0, 2 * rate)
        if self.tokens < 0:
            self.tokens = burst
        self.tokens = min(burst, self.tokens + (now - self.t) * rate)
        self.t = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True
