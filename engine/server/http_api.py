"""The HTTP conventions of serving engines: an OpenAI-compatible API, a health check and Prometheus
metrics, in front of the same engine as the websocket server (``docs/protocol.md``, section HTTP).

Two ports, one set of answers:

- the websocket port answers plain ``GET /health``, ``/metrics`` and ``/v1/models`` through the
  websockets ``process_request`` hook (a handshake hook cannot stream, and cannot read a body);
- a sibling port (``--http-port``, default websocket port + 1) runs a small asyncio HTTP/1.1 server
  of this module: everything above plus ``POST /v1/chat/completions`` and ``POST /v1/completions``,
  JSON or server-sent events, keep-alive, ``Expect: 100-continue``, CORS for browser front ends.

A completion goes through ``Server.submit_for``: the same engine, the same queue limit, the same
per-burst hand-off of token events and the same telemetry as a websocket chat; its requests are
tagged ``http:<peer address>`` in the records, and the per-client limits (open requests,
requests/s) apply per peer address. A closed connection cancels its request, which frees its KV
blocks at the next step boundary. Every error is ``{"error": {"message", "type", "param", "code"}}``
with Fluxo's stable code and an HTTP status from ``STATUS``.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Response

from engine.server import prom
from engine.server import protocol
from engine.core.errors import EmptyPrompt, FluxoError
from engine.core.requests import encode

log = logging.getLogger("fluxo.http")

MAX_HEAD_BYTES = 16 * 1024  # request line + headers
MAX_CONNECTIONS = 1024
IDLE_S = 75.0  # a keep-alive connection with no request for this long is closed
BODY_S = 30.0  # time to send a whole body
STALL_S = (
    60.0  # a stream whose client reads nothing for this long is dropped (its request cancelled)
)
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


class BadRequest(FluxoError):
    """The HTTP framing itself is wrong (request line, headers, Content-Length)."""

    code = "bad_request"


# Fluxo code -> (HTTP status, OpenAI error type). Every code of engine/core/errors.py and
# engine/server/protocol.py is here (tests/server/test_http_errors.py checks it).
STATUS: dict[str, tuple[int, str]] = {
    # the engine
    "empty_prompt": (400, "invalid_request_error"),
    "prompt_too_long": (400, "invalid_request_error"),
    "invalid_max_tokens": (400, "invalid_request_error"),
    "invalid_sampling": (400, "invalid_request_error"),
    "kv_budget_too_small": (
        422,
        "invalid_request_error",
    ),  # well formed, but this KV budget can't hold it
    "unknown_mode": (400, "invalid_request_error"),
    "invalid_config": (400, "invalid_request_error"),
    "unknown_request": (404, "not_found_error"),
    "step_failed": (500, "server_error"),
    "internal": (500, "server_error"),
    "device_unavailable": (
        503,
        "server_error",
    ),  # raised at start (no GPU), listed for completeness
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
}


def error_body(code: str, message: str, param: str | None = None) -> tuple[int, bytes]:
    status, kind = STATUS.get(code, (400, "invalid_request_error"))
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return status, protocol.dumps(body).encode()


def _bad(name: str, want: str, got: object) -> FluxoError:
    exc = protocol.BadField(f"{name} must be {want}, got {protocol._show(got)}")
    exc.param = name  # type: ignore[attr-defined]
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


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(body: dict, name: str, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise _bad(name, "a number", v)
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
                    f"content parts of type {protocol._show(part['type'])} are not supported; "
                    "this model reads text"
                )
                exc.param = "messages"  # type: ignore[attr-defined]
                raise exc
            if not isinstance(part.get("text"), str):
                raise _bad("messages", "text parts with a string text", part.get("text"))
            texts.append(part["text"])
        return "\n".join(texts)
    raise _bad("messages", "a list of {role, content: string} objects", content)


def parse_body(raw: bytes, kind: str) -> CompletionArgs:
    """Body bytes to :class:`CompletionArgs`. Unknown fields are ignored, as the reference servers
    do; a known field of the wrong type is refused with ``bad_field``."""
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
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", "a string", model)
    args = CompletionArgs(kind, model)
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not 0 < len(messages) <= protocol.MAX_MESSAGES:
            raise _bad(
                "messages",
                f"a list of 1 to {protocol.MAX_MESSAGES} {{role, content}} objects",
                messages,
            )
        args.messages = []
        for m in messages:
            if not isinstance(m, dict):
                raise _bad("messages", "a list of {role, content} objects", m)
            role = {"developer": "system"}.get(m.get("role"), m.get("role"))
            if role not in ("system", "user", "assistant"):
                raise _bad(
                    "messages",
                    "messages with role system, developer, user or assistant",
                    m.get("role"),
                )
            args.messages.append({"role": role, "content": _content(m)})
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            args.prompt = prompt
        elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
            args.prompt_ids = list(prompt)
        elif isinstance(prompt, list) and len(prompt) > 1:
            exc = Unsupported("one prompt per request (a batch of prompts is not supported)")
            exc.param = "prompt"  # type: ignore[attr-defined]
            raise exc
        else:
            raise _bad("prompt", "a string or a list of token ids", prompt)
    for name in ("max_completion_tokens", "max_tokens"):  # the newer name wins when both are given
        v = body.get(name)
        if v is not None:
            if not _is_int(v):
                raise _bad(name, "an integer", v)
            args.max_tokens = v
            break
    args.temperature = _number(body, "temperature", 1.0)
    args.top_p = _number(body, "top_p", 1.0)
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise _bad("seed", "a non-negative integer or null", seed)
    args.seed = seed
    n = body.get("n")
    if n is not None:
        if not _is_int(n):
            raise _bad("n", "an integer", n)
        if n != 1:
            exc = Unsupported(f"n must be 1 (one choice per request), got {n}")
            exc.param = "n"  # type: ignore[attr-defined]
            raise exc
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
        args.stop = stop
    args.stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _bad("stream_options", "an object", options)
        args.include_usage = _bool(options, "include_usage")
    args.ignore_eos = _bool(body, "ignore_eos")  # vLLM's extension: forced lengths for benchmarks
    return args


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


# -- one request's stream --------------------------------------------------------------------------
class _Gone(Exception):
    """The client closed its connection."""


class _Coded(FluxoError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Stream:
    """What ``Server.submit_for`` delivers to: the protocol's token/done/error messages, queued on
    the server's loop (``open`` and ``closed`` are what the server's delivery reads)."""

    __slots__ = ("open", "closed", "queue")

    def __init__(self) -> None:
        self.open: dict[int, dict] = {}
        self.closed = False
        self.queue: asyncio.Queue[dict] = asyncio.Queue()

    def send(self, msg: dict) -> None:
        if not self.closed:
            self.queue.put_nowait(msg)


class Generation:
    """Text deltas of one request, stop strings applied; ``finish`` and ``usage`` at the end."""

    def __init__(
        self, api: "HttpApi", stream: Stream, request: int, args: CompletionArgs, prompt_tokens: int
    ) -> None:
        self.api, self.stream, self.request, self.args = api, stream, request, args
        self.cutter = StopCutter(args.stop)
        self.prompt_tokens = prompt_tokens
        self.tokens = 0
        self.last_token: int | None = None
        self.finish: str | None = None
        self.ended = False  # the engine has ended the request (done or error arrived)

    @property
    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.tokens,
            "total_tokens": self.prompt_tokens + self.tokens,
        }

    async def next(self) -> str | None:
        """The next non-empty text delta, or None once finished (then ``finish`` is set). Raises
        ``_Gone`` when the client left and a coded error when the engine failed the request."""
        while self.finish is None:
            msg = await self.stream.queue.get()
            kind = msg["type"]
            if kind == "token":
                self.tokens += 1
                self.last_token = msg["token_id"]
                text = self.cutter.feed(msg["text"])
                if self.cutter.stopped:
                    self.finish = "stop"
                if text:
                    return text
            elif kind == "done":
                self.ended = True
                if msg["status"] == "finished":
                    eos = self.last_token in self.api.engine.eos_ids and not self.args.ignore_eos
                    self.finish = "stop" if eos else "length"
                else:
                    self.finish = "abort"  # cancelled by the presenter (cancel, reset): vLLM's word
                text = self.cutter.flush()
                if text:
                    return text
            elif kind == "error":
                self.ended = True
                raise _Coded(msg["code"], msg["message"])
            else:  # "gone"
                raise _Gone()
        return None

    def close(self) -> None:
        """Called once the HTTP side is done: a request still running (stopped by a stop string,
        or its client gone) is cancelled, which frees its KV at the next step boundary."""
        self.stream.closed = True
        if not self.ended:
            self.api.engine.cancel(self.request)


# -- the HTTP/1.1 connection -----------------------------------------------------------------------
@dataclass(slots=True)
class Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]
    body: bytes = b""

    @property
    def keep_alive(self) -> bool:
        conn = self.headers.get("connection", "").lower()
        return "close" not in conn if self.version == "HTTP/1.1" else "keep-alive" in conn


class Conn:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_body: int
    ) -> None:
        self.reader, self.writer = reader, writer
        self.max_body = max_body
        self.buf = bytearray()
        peer = writer.get_extra_info("peername")
        self.ip = peer[0] if isinstance(peer, tuple) and peer else "unknown"
        self.chunked = False  # the response in progress uses chunked transfer coding

    async def _fill(self) -> bool:
        data = await self.reader.read(65536)
        self.buf += data
        return bool(data)

    async def read_request(self) -> Request | None:
        """The next request, or None when the client closed between requests."""
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                raise protocol.MessageTooLarge(f"the request head is over {MAX_HEAD_BYTES} bytes")
            if not await self._fill():
                if self.buf.strip():
                    raise BadRequest("the connection closed in the middle of a request head")
                return None
        if end > MAX_HEAD_BYTES:
            raise protocol.MessageTooLarge(f"the request head is over {MAX_HEAD_BYTES} bytes")
        head = bytes(self.buf[:end]).decode("latin-1")
        del self.buf[: end + 4]
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
            raise BadRequest(f"not an HTTP/1.x request line: {protocol._show(lines[0])}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise BadRequest(f"malformed header line: {protocol._show(line)}")
            name = name.lower()
            if name == "content-length" and name in headers and headers[name] != value.strip():
                raise BadRequest("conflicting Content-Length headers")
            headers[name] = value.strip()
        return Request(parts[0], parts[1], parts[2], headers)

    async def read_body(self, req: Request) -> None:
        if "transfer-encoding" in req.headers:
            raise LengthRequired("chunked request bodies are not supported; send Content-Length")
        raw = req.headers.get("content-length")
        if raw is None:
            if req.method == "POST":
                raise LengthRequired("a POST needs a Content-Length header")
            return
        if not raw.isdigit():
            raise BadRequest(f"Content-Length must be a number of bytes, got {protocol._show(raw)}")
        length = int(raw)
        expect = req.headers.get("expect", "").lower() == "100-continue" and length > len(self.buf)
        if length > self.max_body:
            message = f"the body has {length} bytes; the limit is {self.max_body}"
            if expect or length > 16 * self.max_body:
                # A client waiting for 100 sends no body; a huge one is not worth reading: answer,
                # then close (after a short linger so the client sees the answer, not a reset).
                self.buf.clear()
                raise _TooLargeClose(message)
            while (
                len(self.buf) < length
            ):  # a modest excess is read and dropped: the connection stays
                if not await asyncio.wait_for(self._fill(), BODY_S):
                    raise _Gone()
            del self.buf[:length]
            raise protocol.MessageTooLarge(message)
        if expect:
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        while len(self.buf) < length:
            if not await asyncio.wait_for(self._fill(), BODY_S):
                raise _Gone()
        req.body = bytes(self.buf[:length])
        del self.buf[:length]

    async def watch(self, stream: Stream) -> None:
        """While a request runs: notice the client closing (EOF) and say so on its stream. Bytes a
        client pipelines meanwhile are kept for the next request."""
        try:
            while len(self.buf) <= self.max_body + MAX_HEAD_BYTES:
                if not await self._fill():
                    break
            else:
                return
        except (ConnectionError, OSError):
            pass
        stream.queue.put_nowait({"type": "gone"})

    def head(self, status: int, headers: list[tuple[str, str]], keep: bool) -> bytes:
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Date: {email.utils.formatdate(usegmt=True)}",
            "Server: fluxo",
            "Access-Control-Allow-Origin: *",
            f"Connection: {'keep-alive' if keep else 'close'}",
        ]
        lines += [f"{k}: {v}" for k, v in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send(
        self,
        status: int,
        body: bytes,
        ctype: str,
        keep: bool,
        extra: list[tuple[str, str]] | None = None,
    ) -> None:
        headers = [("Content-Type", ctype), ("Content-Length", str(len(body)))] + (extra or [])
        self.writer.write(self.head(status, headers, keep) + body)
        await self.writer.drain()

    async def send_error(self, exc: FluxoError, keep: bool) -> None:
        status, body = error_body(exc.code, exc.message, getattr(exc, "param", None))
        extra = [("Allow", "GET, POST, OPTIONS")] if status == 405 else None
        await self.send(status, body, "application/json", keep, extra)

    async def start_events(self, req: Request) -> bool:
        """Headers of a server-sent-event stream; returns whether the connection can be kept."""
        keep = req.keep_alive and req.version == "HTTP/1.1"
        self.chunked = keep
        headers = [
            ("Content-Type", "text/event-stream; charset=utf-8"),
            ("Cache-Control", "no-cache"),
            ("X-Accel-Buffering", "no"),
        ]
        if keep:
            headers.append(("Transfer-Encoding", "chunked"))
        self.writer.write(self.head(200, headers, keep))
        await self.writer.drain()
        return keep

    async def event(self, data: str) -> None:
        if self.writer.transport.is_closing():
            raise _Gone()
        payload = f"data: {data}\n\n".encode()
        self.writer.write(b"%x\r\n%s\r\n" % (len(payload), payload) if self.chunked else payload)
        if self.writer.transport.get_write_buffer_size() > 65536:  # a client that stopped reading
            try:
                await asyncio.wait_for(self.writer.drain(), STALL_S)
            except asyncio.TimeoutError:
                raise _Gone() from None

    async def end_events(self) -> None:
        if self.chunked:
            self.writer.write(b"0\r\n\r\n")
            await self.writer.drain()


class _TooLargeClose(FluxoError):
    code = "message_too_large"


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes
    ctype: str = "application/json"


@dataclass(slots=True)
class _Peer:
    """Per-client limits for one peer address: open requests and a token bucket, as for a
    websocket connection."""

    open: int = 0
    bucket: protocol.TokenBucket = field(default_factory=protocol.TokenBucket)

    def take(self, rate: float) -> bool:
        return self.bucket.take(rate)


# -- the API ---------------------------------------------------------------------------------------
class HttpApi:
    """Created by ``Server.serve``; owns the metrics listener, the sibling HTTP server and the
    answers the websocket port gives to plain GETs."""

    def __init__(self, server) -> None:
        self.server = server
        self.engine = server.engine
        self.limits = server.limits
        self.model_id = server.model_name
        self.created = int(time.time())
        self.metrics = prom.Metrics(self.engine, self.model_id, extra=self._gauges)
        self.peers: dict[str, _Peer] = {}
        self.in_flight = 0
        self.url: str | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> str:
        self._server = await asyncio.start_server(
            self._connection, host, port, limit=MAX_HEAD_BYTES
        )
        bound = self._server.sockets[0].getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound}"
        return self.url

    async def close(self) -> None:
        self.metrics.unsubscribe()
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=5)
            self._server = None

    def _gauges(self) -> dict[str, tuple[str, str, float]]:
        return {
            "fluxo:http_requests_in_flight": (
                "gauge",
                "OpenAI-API completions in flight.",
                self.in_flight,
            ),
            "fluxo:websocket_clients": (
                "gauge",
                "Open websocket connections.",
                len(self.server.conns),
            ),
        }

    # -- GET answers (both ports) ---------------------------------------------------------------
    def health(self) -> Reply:
        thread = getattr(self.server, "_engine_thread", None)
        if not self.server.ready.is_set():
            status = "loading"
        elif thread is None or not thread.is_alive():
            status = "stopped"
        else:
            status = "ok"
        body = {
            "status": status,
            "step": self.engine.step_count,
            "paused": self.engine.paused,
            "running": len(self.engine.scheduler.running),
            "waiting": self.engine.queue_len(),
        }
        return Reply(200 if status == "ok" else 503, protocol.dumps(body).encode())

    def _model(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "fluxo",
            "max_model_len": self.engine.config.max_model_len,
        }

    def get(self, path: str) -> Reply | None:
        """The answer to ``GET path``, or None when the path is not an HTTP endpoint."""
        if path == "/health":
            return self.health()
        if path == "/metrics":
            return Reply(
                200, self.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8"
            )
        if path == "/v1/models":
            return Reply(200, protocol.dumps({"object": "list", "data": [self._model()]}).encode())
        if path.startswith("/v1/models/"):
            if path[len("/v1/models/") :] == self.model_id:
                return Reply(200, protocol.dumps(self._model()).encode())
            return Reply(
                *error_body(
                    "model_not_found",
                    f"no model {protocol._show(path[11:])}; this server serves {self.model_id!r}",
                    "model",
                )
            )
        if path in ("/v1/chat/completions", "/v1/completions"):
            return Reply(
                *error_body("method_not_allowed", f"{path} takes POST" + self._post_hint())
            )
        if path.startswith("/v1/"):
            return Reply(*error_body("not_found", f"no endpoint {protocol._show(path)}"))
        return None

    def _post_hint(self) -> str:
        return f" at {self.url}" if self.url else " on the HTTP port (--http-port)"

    def process_request(self, connection, request) -> Response | None:
        """The websocket port's ``process_request`` hook: plain GETs of the HTTP endpoints are
        answered here; anything else goes on to the websocket handshake."""
        path = urlsplit(request.path).path
        reply = self.get(path)
        if reply is None:
            return None
        headers = Headers(
            [
                ("Date", email.utils.formatdate(usegmt=True)),
                ("Connection", "close"),
                ("Content-Length", str(len(reply.body))),
                ("Content-Type", reply.ctype),
                ("Access-Control-Allow-Origin", "*"),
            ]
        )
        return Response(reply.status, HTTPStatus(reply.status).phrase, headers, reply.body)

    # -- the sibling port -----------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        conn = Conn(reader, writer, self.limits.max_message_bytes)
        try:
            if len(self._tasks) > MAX_CONNECTIONS:
                await conn.send_error(
                    protocol.Busy(f"over {MAX_CONNECTIONS} HTTP connections"), False
                )
                return
            while True:
                keep = False
                try:
                    req = await asyncio.wait_for(conn.read_request(), IDLE_S)
                    if req is None:
                        return
                    keep = req.keep_alive
                    await conn.read_body(req)
                    keep = await self._dispatch(conn, req)
                except _TooLargeClose as exc:
                    await conn.send_error(exc, False)
                    await self._linger(conn)
                    return
                except FluxoError as exc:  # framing errors: the body may be unread, so close after
                    keep = (
                        keep and exc.code == "message_too_large"
                    )  # that body was read and dropped
                    await conn.send_error(exc, keep)
                    if not keep:
                        await self._linger(conn)
                if not keep:
                    return
        except (_Gone, ConnectionError, OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # the server is closing: end quietly (streams' done callback
            pass  # reports a cancelled connection task as an unhandled error)
        except Exception:  # noqa: BLE001 - one broken connection, never the server
            log.exception("HTTP connection from %s failed", conn.ip)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _linger(self, conn: Conn) -> None:
        """Before closing on an error: stop writing, then read and drop what the client still sends
        (until it has been quiet for 0.2 s, at most 2 s), so it sees the answer, not a reset."""
        try:
            conn.writer.write_eof()
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                if not await asyncio.wait_for(conn.reader.read(1 << 20), 0.2):
                    break
        except (ConnectionError, OSError, asyncio.TimeoutError):
            pass

    async def _dispatch(self, conn: Conn, req: Request) -> bool:
        """Answer one request; returns whether the connection stays open."""
        keep = req.keep_alive
        path = urlsplit(req.path).path
        try:
            if req.method == "OPTIONS":  # a browser's CORS preflight
                await conn.send(
                    204,
                    b"",
                    "text/plain",
                    keep,
                    [
                        ("Access-Control-Allow-Methods", "GET, POST, OPTIONS"),
                        ("Access-Control-Allow-Headers", "Authorization, Content-Type"),
                        ("Access-Control-Max-Age", "600"),
                    ],
                )
                return keep
            if req.method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
                return await self._completion(
                    conn, req, "chat" if path == "/v1/chat/completions" else "text"
                )
            known = path in (
                "/health",
                "/metrics",
                "/v1/models",
                "/v1/chat/completions",
                "/v1/completions",
            )
            if not known and not path.startswith("/v1/models/"):
                raise NotFound(f"no endpoint {protocol._show(path)}")
            if req.method != "GET":
                raise MethodNotAllowed(f"{path} does not take {protocol._show(req.method)}")
            reply = self.get(path)
            await conn.send(reply.status, reply.body, reply.ctype, keep)
            return keep
        except FluxoError as exc:
            await conn.send_error(exc, keep)
            return keep
        except Exception as exc:  # noqa: BLE001 - a server bug answers this request, not the class
            log.exception("HTTP %s %s failed", req.method, path)
            await conn.send_error(
                _Coded("internal", f"internal error: {type(exc).__name__}"), False
            )
            return False

    def _default_max(self, n_prompt: int) -> int:
        """No max_tokens: as long as the context and the KV budget allow (as vLLM does)."""
        cfg = self.engine.config
        room = min(
            cfg.max_new_tokens_limit,
            cfg.max_model_len - n_prompt,
            cfg.kv_blocks * cfg.block_size - n_prompt,
        )
        return max(1, room)

    async def _completion(self, conn: Conn, req: Request, kind: str) -> bool:
        args = parse_body(req.body, kind)
        if args.model is not None and args.model != self.model_id:
            exc = ModelNotFound(
                f"no model {args.model!r} here; this server serves {self.model_id!r}"
            )
            exc.param = "model"  # type: ignore[attr-defined]
            raise exc
        tok = self.engine.tokenizer
        if args.messages is not None:
            token_ids = encode(tok, messages=args.messages)
        elif args.prompt_ids is not None:
            token_ids = args.prompt_ids
        else:
            if not args.prompt.strip():
                raise EmptyPrompt("the prompt is empty")
            token_ids = list(tok.encode(args.prompt))
        max_tokens = (
            args.max_tokens if args.max_tokens is not None else self._default_max(len(token_ids))
        )
        if max_tokens < 1:
            exc = protocol.BadField(f"max_tokens must be at least 1, got {max_tokens}")
            exc.param = "max_tokens"  # type: ignore[attr-defined]
            raise exc
        key = f"http:{conn.ip}"
        peer = self.peers.get(key)
        if peer is None:
            if len(self.peers) > 4096:  # forget idle peers
                self.peers = {k: p for k, p in self.peers.items() if p.open}
            peer = self.peers[key] = _Peer()
        if peer.open >= self.limits.max_open_requests:
            raise protocol.TooManyRequests(
                f"{key} already has {peer.open} open requests "
                f"(limit {self.limits.max_open_requests})"
            )
        if not peer.take(self.limits.max_requests_per_s):
            raise protocol.RateLimited(
                f"over {self.limits.max_requests_per_s:g} requests/s from {key}; slow down"
            )
        stream = Stream()
        handle = self.server.submit_for(
            stream,
            key,
            token_ids=token_ids,
            max_new_tokens=max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            ignore_eos=args.ignore_eos,
        )
        gen = Generation(self, stream, handle.id, args, len(token_ids))
        peer.open += 1
        self.in_flight += 1
        watcher = asyncio.create_task(conn.watch(stream))
        try:
            if args.stream:
                return await self._events(conn, req, gen)
            return await self._whole(conn, req, gen)
        except _Gone:
            return False
        finally:
            watcher.cancel()
            gen.close()
            peer.open -= 1
            self.in_flight -= 1

    def _ids(self, gen: Generation) -> tuple[str, str]:
        if gen.args.kind == "chat":
            return f"chatcmpl-{gen.request}", "chat.completion"
        return f"cmpl-{gen.request}", "text_completion"

    async def _whole(self, conn: Conn, req: Request, gen: Generation) -> bool:
        parts = []
        while (text := await gen.next()) is not None:
            parts.append(text)
        text = "".join(parts)
        rid, obj = self._ids(gen)
        if gen.args.kind == "chat":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": gen.finish,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": gen.finish}
        body = {
            "id": rid,
            "object": obj,
            "created": int(time.time()),
            "model": self.model_id,
            "choices": [choice],
            "usage": gen.usage,
        }
        await conn.send(200, protocol.dumps(body).encode(), "application/json", req.keep_alive)
        return req.keep_alive

    async def _events(self, conn: Conn, req: Request, gen: Generation) -> bool:
        keep = await conn.start_events(req)
        rid, obj = self._ids(gen)
        chat = gen.args.kind == "chat"
        base = {
            "id": rid,
            "object": f"{obj}.chunk" if chat else obj,
            "created": int(time.time()),
            "model": self.model_id,
        }
        usage_null = {"usage": None} if gen.args.include_usage else {}

        def chunk(text: str | None, finish: str | None, role: bool = False) -> str:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
                if text is not None:
                    delta["content"] = text
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            return protocol.dumps({**base, "choices": [choice], **usage_null})

        try:
            if chat:
                await conn.event(chunk(None, None, role=True))
            while (text := await gen.next()) is not None:
                await conn.event(chunk(text, None))
            await conn.event(chunk(None, gen.finish))
            if gen.args.include_usage:
                await conn.event(protocol.dumps({**base, "choices": [], "usage": gen.usage}))
        except FluxoError as exc:  # the engine failed the request after the stream began
            status, kind = STATUS.get(exc.code, (500, "server_error"))
            await conn.event(
                protocol.dumps(
                    {
                        "error": {
                            "message": exc.message,
                            "type": kind,
                            "param": None,
                            "code": exc.code,
                        }
                    }
                )
            )
        except (ConnectionError, OSError):
            raise _Gone() from None
        await conn.event("[DONE]")
        await conn.end_events()
        return keep
