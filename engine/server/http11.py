"""A small asyncio HTTP/1.1 connection: request heads and bodies read with limits (head size,
Content-Length, ``Expect: 100-continue``, one deadline for a request's head and body together, so
a trickled request cannot hold a connection), plain and chunked server-sent-event responses
(CORS only for an allowed origin; ``Retry-After`` on every 429 and 503), and a watch for a client
that closes while its request runs.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from engine.core.errors import FluxoError
from engine.server import protocol
from engine.server.openai_shapes import BadRequest, LengthRequired, RequestTimeout, error_body

MAX_HEAD_BYTES = 16 * 1024  # request line + headers
REQUEST_S = 30.0  # time to send a request's head and body, from its first byte
IDLE_S = 75.0  # a keep-alive connection with no request for this long is closed
RETRY_AFTER_S = {"too_many_connections": 5}  # Retry-After of a 429/503 answer (default 1 s)
STALL_S = 60.0  # a stream whose client reads nothing this long is dropped (its request cancelled)


class Gone(Exception):
    """The client closed its connection."""


class TooLargeClose(FluxoError):
    """A body too large to read: answered, then the connection closes."""

    code = "message_too_large"


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
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_body: int,
        request_s: float = REQUEST_S,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.max_body = max_body
        self.request_s = request_s
        self.deadline = float("inf")  # when the request being read must have arrived whole
        self.buf = bytearray()
        peer = writer.get_extra_info("peername")
        self.ip = peer[0] if isinstance(peer, tuple) and peer else "unknown"
        self.chunked = False  # the response in progress uses chunked transfer coding
        self.cors: str | None = None  # Access-Control-Allow-Origin of this request's answer

    async def _fill(self) -> bool:
        data = await self.reader.read(65536)
        self.buf += data
        return bool(data)

    async def _fill_by_deadline(self) -> bool:
        left = self.deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            return await asyncio.wait_for(self._fill(), left)
        except TimeoutError:
            raise RequestTimeout(
                f"the request did not arrive whole within {self.request_s:g} s"
            ) from None

    async def read_request(self, idle_s: float = IDLE_S) -> Request | None:
        """The next request, or None when the client closed between requests. The first byte
        may take ``idle_s`` (keep-alive); from then on the head and the body share one deadline."""
        self.deadline = float("inf")
        if not self.buf:
            if not await asyncio.wait_for(self._fill(), idle_s):
                return None
        self.deadline = time.monotonic() + self.request_s
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                raise protocol.MessageTooLarge(f"the request head is over {MAX_HEAD_BYTES} bytes")
            if not await self._fill_by_deadline():
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
            raise BadRequest(f"not an HTTP/1.x request line: {protocol.show(lines[0])}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line.isprintable() and any(c in line for c in "\r\n\0"):
                # a bare LF or CR kept in a value would split a header we echo (Origin)
                raise BadRequest(f"a header line holds CR, LF or NUL: {protocol.show(line)}")
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise BadRequest(f"malformed header line: {protocol.show(line)}")
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
        if not (raw.isascii() and raw.isdigit()):  # '²'.isdigit() is True, int('²') fails
            raise BadRequest(f"Content-Length must be a number of bytes, got {protocol.show(raw)}")
        # past 18 digits no body fits anywhere, and int() refuses 4,300 digits (ValueError):
        # a 5,000-digit length dropped the connection with a traceback
        length = int(raw) if len(raw) <= 18 else 1 << 62
        expect = req.headers.get("expect", "").lower() == "100-continue" and length > len(self.buf)
        if length > self.max_body:
            said = raw if len(raw) <= 18 else f"{raw[:6]}...({len(raw)} digits)"
            message = f"the body has {said} bytes; the limit is {self.max_body}"
            if expect or length > 16 * self.max_body:
                # A client waiting for 100 sends no body; a huge one is not worth reading: answer,
                # then close (after a short linger so the client sees the answer, not a reset).
                self.buf.clear()
                raise TooLargeClose(message)
            # a modest excess is read and dropped: the connection stays
            while len(self.buf) < length:
                if not await self._fill_by_deadline():
                    raise Gone()
            del self.buf[:length]
            raise protocol.MessageTooLarge(message)
        if expect:
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        while len(self.buf) < length:
            if not await self._fill_by_deadline():
                raise Gone()
        req.body = bytes(self.buf[:length])
        del self.buf[:length]

    async def watch(self, stream: Any) -> None:
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
            f"Connection: {'keep-alive' if keep else 'close'}",
        ]
        if self.cors:
            lines += [f"Access-Control-Allow-Origin: {self.cors}", "Vary: Origin"]
        if status in (429, 503) and not any(k == "Retry-After" for k, _ in headers):
            lines.append("Retry-After: 1")
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
        extra = [("Allow", "GET, POST, OPTIONS")] if status == 405 else []
        if status in (429, 503):
            extra.append(("Retry-After", str(RETRY_AFTER_S.get(exc.code, 1))))
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
            raise Gone()
        payload = f"data: {data}\n\n".encode()
        self.writer.write(b"%x\r\n%s\r\n" % (len(payload), payload) if self.chunked else payload)
        if self.writer.transport.get_write_buffer_size() > 65536:  # a client that stopped reading
            try:
                await asyncio.wait_for(self.writer.drain(), STALL_S)
            except TimeoutError:
                raise Gone() from None

    async def end_events(self) -> None:
        if self.chunked:
            self.writer.write(b"0\r\n\r\n")
            await self.writer.drain()

    async def linger(self) -> None:
        """Before closing on an error: stop writing, then read and drop what the client still sends
        (until it has been quiet for 0.2 s, at most 2 s), so it sees the answer, not a reset."""
        try:
            self.writer.write_eof()
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                if not await asyncio.wait_for(self.reader.read(1 << 20), 0.2):
                    break
        except (TimeoutError, ConnectionError, OSError):
            pass
