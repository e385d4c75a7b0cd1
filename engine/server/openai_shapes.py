"""The OpenAI API's shapes: request bodies checked into ``CompletionArgs``, errors as
``{"error": {"message", "type", "param", "code"}}`` with an HTTP status per Fluxo code
(``STATUS``), and stop strings cut out of a stream of text deltas (``StopCutter``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from engine.core.errors import FluxoError
from engine.core.numbers import is_int, is_number
from engine.server import protocol

MAX_STOP = 16  # stop strings per request
MAX_STOP_CHARS = 256


# -- errors ----------------------------------------------------------------------------------------
class NotFound(FluxoError):
    code = "not_found"


class MethodNotAllowed(FluxoError):
    code = "method_not_allowed"


class ModelNotFound(FluxoError):
    code = "model_not_found"


class Unsupported(FluxoError):
    """A parameter value Fluxo does not implement (``n`` other than 1, non-text message parts)."""

    code = "unsupported"


class LengthRequired(FluxoError):
    code = "length_required"


class RequestTimeout(FluxoError):
    """A request's head and body did not arrive within one deadline (a trickled body)."""

    code = "request_timeout"


class BadRequest(FluxoError):
    """The HTTP framing itself is wrong (request line, headers, Content-Length)."""

    code = "bad_request"


# Fluxo code -> (HTTP status, OpenAI error type). Every code of engine/core/errors.py and
# engine/server/protocol.py is here (tests/server/test_http_errors.py checks it).
STATUS: dict[str, tuple[int, str]] = {
    # the engine
    "empty_prompt": (400, "invalid_request_error"),
    "invalid_token_ids": (400, "invalid_request_error"),
    "prompt_too_long": (400, "invalid_request_error"),
    "invalid_max_tokens": (400, "invalid_request_error"),
    "invalid_sampling": (400, "invalid_request_error"),
    # well formed, but this KV budget can't hold it
    "kv_budget_too_small": (
        422,
        "invalid_request_error",
    ),
    "unknown_mode": (400, "invalid_request_error"),
    "invalid_config": (400, "invalid_request_error"),
    "invalid_policy": (400, "invalid_request_error"),
    "policy_error": (500, "server_error"),
    "kv_over_memory": (422, "invalid_request_error"),
    "unknown_request": (404, "not_found_error"),
    "step_failed": (500, "server_error"),
    "shutting_down": (503, "server_error"),  # SIGTERM: retry on another server, or later
    "internal": (500, "server_error"),
    # raised at start (no GPU), listed for completeness
    "device_unavailable": (
        503,
        "server_error",
    ),
    "unsupported_model": (400, "invalid_request_error"),  # at start only, never over HTTP
    # the wire protocol
    "bad_json": (400, "invalid_request_error"),
    "bad_utf8": (400, "invalid_request_error"),
    "unknown_type": (400, "invalid_request_error"),
    "bad_field": (400, "invalid_request_error"),
    "message_too_large": (413, "invalid_request_error"),
    "forbidden": (403, "permission_error"),
    "bad_token": (401, "authentication_error"),
    "too_many_requests": (429, "rate_limit_error"),
    "rate_limited": (429, "rate_limit_error"),
    "busy": (503, "overloaded_error"),
    "fair_share": (429, "rate_limit_error"),
    "too_many_connections": (429, "rate_limit_error"),
    "forbidden_origin": (403, "permission_error"),
    "not_paused": (409, "conflict_error"),
    "nothing_to_run": (409, "conflict_error"),
    "compare_running": (409, "conflict_error"),
    "compare_unavailable": (503, "server_error"),
    # HTTP only
    "not_found": (404, "not_found_error"),
    "method_not_allowed": (405, "invalid_request_error"),
    "model_not_found": (404, "not_found_error"),
    "unsupported": (400, "invalid_request_error"),
    "length_required": (411, "invalid_request_error"),
    "bad_request": (400, "invalid_request_error"),
    "request_timeout": (408, "invalid_request_error"),
}


def error_body(code: str, message: str, param: str | None = None) -> tuple[int, bytes]:
    status, kind = STATUS.get(code, (400, "invalid_request_error"))
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return status, protocol.dumps(body).encode()


def _bad(name: str, want: str, got: object) -> FluxoError:
    exc = protocol.BadField(f"{name} must be {want}, got {protocol.show(got)}")
    exc.param = name
    return exc


# -- request bodies --------------------------------------------------------------------------------
@dataclass(slots=True)
class CompletionArgs:
    """A chat or text completion request, shape-checked; the engine checks the meaning."""

    kind: str  # "chat" | "text"
    model: str | None
    messages: list[dict] | None = None
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    max_tokens: int | None = None
    temperature: float = 1.0  # the OpenAI API's default; temperature 0 is greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False


def _number(body: dict, name: str, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not is_number(v):
        raise _bad(name, "a number", v)
    if is_int(v) and not protocol.finite(v):  # 1 and 400 zeros: past a float's range
        raise _bad(name, "a number in a float's range", v)
    return float(v)


def _bool(body: dict, name: str) -> bool:
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _bad(name, "true or false", v)
    return v


def _content(m: dict) -> str:
    content = m.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise _bad(
                    "messages",
                    "a list of {role, content} objects (content parts are {type, text})",
                    part,
                )
            if part["type"] != "text":
                exc = Unsupported(
                    f"content parts of type {protocol.show(part['type'])} are not supported; "
                    "this model reads text"
                )
                exc.param = "messages"
                raise exc
            if not isinstance(part.get("text"), str):
                raise _bad("messages", "text parts with a string text", part.get("text"))
            texts.append(part["text"])
        return "\n".join(texts)
    raise _bad("messages", "a list of {role, content: string} objects", content)


def parse_body(raw: bytes, kind: str) -> CompletionArgs:
    """Body bytes to :class:`CompletionArgs`. Unknown fields are ignored, as the reference servers
    do, but the OpenAI fields this server does not implement (``UNSUPPORTED``, logprobs, a
    response format other than text) get ``unsupported``; a known field of the wrong type is
    refused with ``bad_field``."""
    body = _json_object(raw)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", "a string", model)
    args = CompletionArgs(kind, model)
    if kind == "chat":
        args.messages = _messages(body)
    else:
        args.prompt, args.prompt_ids = _prompt(body)
    _refuse_unsupported(body)
    _sampling(body, args)
    args.stop = _stop(body)
    args.stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _bad("stream_options", "an object", options)
        args.include_usage = _bool(options, "include_usage")
    args.ignore_eos = _bool(body, "ignore_eos")  # vLLM's extension: forced lengths for benchmarks
    return args


# Fields the API does not implement: refused, never silently ignored (a client that asked for tools
# or logprobs would otherwise get a 200 with free text and wrong assumptions).
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call")


def _refuse_unsupported(body: dict) -> None:
    asked = [f for f in UNSUPPORTED if body.get(f) not in (None, [], {})]
    if body.get("logprobs") not in (None, False, 0) or body.get("top_logprobs") not in (None, 0):
        asked.append("logprobs")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        asked.append("response_format")
    if asked:
        exc = Unsupported(f"{asked[0]} is not implemented by this server")
        exc.param = asked[0]
        raise exc


def _json_object(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise protocol.BadUtf8(
            f"the body is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise protocol.BadJson(f"the body is not valid JSON: {str(exc)[:120]}") from None
    if not isinstance(body, dict):
        raise protocol.BadJson(f"the body must be a JSON object, got {type(body).__name__}")
    if "\\u" in text:  # a lone surrogate can only be spelled as an escape
        protocol.refuse_surrogates(body, "the body")
    return body


# OpenAI's newer name for a role: looked up with whatever JSON value the role field holds
_ROLE_ALIASES: dict[object, str] = {"developer": "system"}


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not 0 < len(messages) <= protocol.MAX_MESSAGES:
        raise _bad(
            "messages",
            f"a list of 1 to {protocol.MAX_MESSAGES} {{role, content}} objects",
            messages,
        )
    messages_out: list[dict] = []
    for m in messages:
        if not isinstance(m, dict):
            raise _bad("messages", "a list of {role, content} objects", m)
        role = m.get("role")  # a list or an object is no key: a bad_field, not a TypeError
        role = _ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        if role not in ("system", "user", "assistant"):
            raise _bad(
                "messages",
                "messages with role system, developer, user or assistant",
                m.get("role"),
            )
        messages_out.append({"role": role, "content": _content(m)})
    return messages_out


def _prompt(body: dict) -> tuple[str | None, list[int] | None]:
    """A text completion's prompt: a string, or a list of token ids (a batch of one at most)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt, None
    elif isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        return None, list(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1:
        exc = Unsupported("one prompt per request (a batch of prompts is not supported)")
        exc.param = "prompt"
        raise exc
    else:
        raise _bad("prompt", "a string or a list of token ids", prompt)


def _sampling(body: dict, args: CompletionArgs) -> None:
    """max_tokens (or max_completion_tokens), temperature, top_p, seed; ``n`` must be 1."""
    for name in ("max_completion_tokens", "max_tokens"):  # the newer name wins when both are given
        v = body.get(name)
        if v is not None:
            if not is_int(v):
                raise _bad(name, "an integer", v)
            args.max_tokens = v
            break
    args.temperature = _number(body, "temperature", 1.0)
    args.top_p = _number(body, "top_p", 1.0)
    seed = body.get("seed")
    if seed is not None and (not is_int(seed) or not 0 <= seed < 2**63):
        raise _bad("seed", "a non-negative integer or null", seed)
    args.seed = seed
    n = body.get("n")
    if n is not None:
        if not is_int(n):
            raise _bad("n", "an integer", n)
        if n != 1:
            exc = Unsupported(f"n must be 1 (one choice per request), got {n}")
            exc.param = "n"
            raise exc


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if (
            not isinstance(stop, list)
            or len(stop) > MAX_STOP
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop)
        ):
            raise _bad(
                "stop",
                f"a non-empty string or a list of at most {MAX_STOP} of them "
                f"(each at most {MAX_STOP_CHARS} characters)",
                stop,
            )
        return stop
    return []


# -- stop strings ----------------------------------------------------------------------------------
class StopCutter:
    """Cuts streamed text before the first stop string. Text that could still become the start of
    a stop string is held back until the next delta shows it does not."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.held = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        if not self.stops:
            return delta
        text = self.held + delta
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return text[: min(hits)]
        keep = 0  # the longest suffix of text that is a proper prefix of a stop string
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:k]):
                    keep = k
                    break
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held
