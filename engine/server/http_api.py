"""The HTTP conventions of serving engines: an OpenAI-compatible API, a health check and Prometheus
metrics, in front of the same engine as the websocket server (``docs/protocol.md``, section HTTP).

Two ports, one set of answers:

- the websocket port answers plain ``GET /health``, ``/metrics`` and ``/v1/models`` through the
  websockets ``process_request`` hook (a handshake hook cannot stream, and cannot read a body);
- a sibling port (``--http-port``, default websocket port + 1) runs a small asyncio HTTP/1.1 server
  of this module: everything above plus ``POST /v1/chat/completions`` and ``POST /v1/completions``,
  JSON or server-sent events, keep-alive, ``Expect: 100-continue``, CORS for browser front ends.

A completion goes through ``Server.open_request``: the same engine, the same queue limit, the same
per-burst hand-off of token events and the same telemetry as a websocket chat; its requests are
tagged ``http:<alias>`` in the records (a short stable alias of the peer address, never the
address), and the per-address limits of ``Server.admit`` apply (open requests, requests/s, the
fair share of the queue, connections); this machine's loopback and a client presenting the
presenter token as ``Authorization: Bearer`` are exempt from a student's caps. Every request's
``Host`` and ``Origin`` are checked first (``guard.Origins``), and CORS answers name the allowed
origin (``*`` only with ``--cors-any-origin``). A closed connection cancels its request, which
frees its KV blocks at the next step boundary. Every error is ``{"error": {"message", "type",
"param", "code"}}`` with Fluxo's stable code and an HTTP status from ``STATUS``; 429 and 503
answers carry ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Sized
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Response

from engine.core.engine import Engine
from engine.core.errors import FluxoError
from engine.core.requests import Request as EngineRequest
from engine.core.requests import RequestHandle
from engine.server import guard, prom, protocol, tokenize_api
from engine.server.completions import (
    Coded,
    Generation,
    Stream,
    event_stream,
    prompt_and_max,
    whole_answer,
)
from engine.server.connection import Limits
from engine.server.http11 import MAX_HEAD_BYTES, Conn, Gone, Request, TooLargeClose
from engine.server.openai_shapes import (
    CompletionArgs,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    error_body,
    parse_body,
)

# One thread tokenizes every HTTP prompt, in arrival order (the engine thread only decodes).
TOKENIZER = ThreadPoolExecutor(1, thread_name_prefix="fluxo-tokenize")


class Host(Protocol):
    """What the HTTP API asks of the websocket server it runs beside (``Server`` satisfies it):
    the engine and the limits they share, who is connected, and the one way a request enters
    (``admit``, then ``open_request``). Named here, so this module never imports the server."""

    engine: Engine
    limits: Limits
    model_name: str
    model_aliases: tuple[str, ...]
    peers: guard.Peers
    origins: guard.Origins
    error_log: guard.ErrorLog
    token: str | None
    ready: threading.Event

    @property
    def conns(self) -> Sized: ...  # the open websocket connections (read: counted)

    def engine_alive(self) -> bool: ...
    def admit(self, peer: guard.Peer, exempt: bool, presenter: bool) -> None: ...
    def open_request(
        self,
        client: Any,
        request: EngineRequest,
        peer: guard.Peer,
        *,
        exempt: bool,
        presenter: bool,
        admitted: bool = False,
    ) -> RequestHandle: ...


log = logging.getLogger("fluxo.http")

MAX_CONNECTIONS = 1024


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes
    ctype: str = "application/json"


# -- the API ---------------------------------------------------------------------------------------
class HttpApi:
    """Created by ``Server.serve``; owns the metrics listener, the sibling HTTP server and the
    answers the websocket port gives to plain GETs."""

    def __init__(self, server: Host) -> None:
        self.server = server
        self.engine = server.engine
        self.limits = server.limits
        self.model_id = server.model_name
        self.model_ids = {server.model_name, *server.model_aliases}
        self.created = int(time.time())
        self.metrics = prom.Metrics(self.engine, self.model_id, extra=self._gauges)
        self.peers: guard.Peers = server.peers
        self._named: set[str] = set()  # addresses whose alias the log has given
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

    def busy(self) -> bool:
        """Whether an HTTP request is being answered."""
        return self.in_flight > 0

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
        if not self.server.ready.is_set():
            status = "loading"
        elif not self.server.engine_alive():
            status = "stopped"
        else:
            status = "ok"
        body = {
            "status": status,
            "step": self.engine.step_count,
            "paused": self.engine.paused,
            "running": self.engine.running_count(),
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
            if path[len("/v1/models/") :] in self.model_ids:
                return Reply(200, protocol.dumps(self._model()).encode())
            return Reply(
                *error_body(
                    "model_not_found",
                    f"no model {protocol.show(path[11:])}; this server serves {self.model_id!r}",
                    "model",
                )
            )
        if path in ("/v1/chat/completions", "/v1/completions", *tokenize_api.PATHS):
            return Reply(
                *error_body("method_not_allowed", f"{path} takes POST" + self._post_hint())
            )
        if path.startswith("/v1/"):
            return Reply(*error_body("not_found", f"no endpoint {protocol.show(path)}"))
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
        return self._response(reply, self.cors_for(request.headers.get("Origin")))

    def _response(self, reply: Reply, cors: str | None = None) -> Response:
        headers = Headers(
            [
                ("Date", email.utils.formatdate(usegmt=True)),
                ("Connection", "close"),
                ("Content-Length", str(len(reply.body))),
                ("Content-Type", reply.ctype),
            ]
        )
        if cors:
            headers["Access-Control-Allow-Origin"] = cors
            headers["Vary"] = "Origin"
        if reply.status in (429, 503):
            headers["Retry-After"] = "1"
        return Response(reply.status, HTTPStatus(reply.status).phrase, headers, reply.body)

    def refuse(self, message: str) -> Response:
        """403 ``forbidden_origin`` before a handshake (the websocket port)."""
        return self._response(Reply(*error_body(protocol.ForbiddenOrigin.code, message)))

    def cors_for(self, origin: str | None) -> str | None:
        """What ``Access-Control-Allow-Origin`` names: the allowed origin that asked, ``*`` only
        with ``--cors-any-origin``, else nothing (a page elsewhere cannot read the answer)."""
        if self.server.origins.cors_any:
            return "*"
        return (
            origin if origin is not None and self.server.origins.origin_ok(origin, None) else None
        )

    # -- the sibling port -----------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio.start_server runs each connection as a task
        self._tasks.add(task)
        conn = Conn(reader, writer, self.limits.max_message_bytes, self.limits.http_request_s)
        peer = self.peers.get(guard.peer_key(conn.ip, None))
        peer.http_conns += 1
        try:
            cap = self.limits.max_http_connections_per_address
            if not peer.own and peer.http_conns > cap:
                await conn.send_error(
                    protocol.TooManyConnections(
                        f"this address has {peer.http_conns - 1} HTTP connections open (limit "
                        f"{cap}); reuse one (keep-alive) or close some"
                    ),
                    False,
                )
                return
            if len(self._tasks) > MAX_CONNECTIONS:
                await conn.send_error(
                    protocol.Busy(f"over {MAX_CONNECTIONS} HTTP connections"), False
                )
                return
            while True:
                keep = False
                try:
                    req = await conn.read_request()
                    if req is None:
                        return
                    keep = req.keep_alive
                    await conn.read_body(req)
                    keep = await self._dispatch(conn, req)
                except TooLargeClose as exc:
                    await conn.send_error(exc, False)
                    await conn.linger()
                    return
                except FluxoError as exc:  # framing errors: the body may be unread, so close after
                    # that body was read and dropped
                    keep = keep and exc.code == "message_too_large"
                    await conn.send_error(exc, keep)
                    if not keep:
                        await conn.linger()
                if not keep:
                    return
        except (TimeoutError, Gone, ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # the server is closing: end quietly (streams' done callback
            pass  # reports a cancelled connection task as an unhandled error)
        except Exception as exc:  # noqa: BLE001 - one broken connection, never the server
            self.server.error_log.exception(exc, "an HTTP connection", self.peers.alias(peer.key))
            if not peer.own:
                guard.over_line(peer.internal, self.limits.abuse_internal)
        finally:
            peer.http_conns -= 1
            self._tasks.discard(task)
            writer.close()

    async def _dispatch(self, conn: Conn, req: Request) -> bool:
        """Answer one request; returns whether the connection stays open."""
        keep = req.keep_alive
        path = urlsplit(req.path).path
        try:
            host, origin = req.headers.get("host"), req.headers.get("origin")
            conn.cors = self.cors_for(origin)
            if not self.server.origins.host_ok(host):
                raise protocol.ForbiddenOrigin(f"Host {protocol.show(host)} is not this machine")
            if not (self.server.origins.cors_any or self.server.origins.origin_ok(origin, host)):
                raise protocol.ForbiddenOrigin(
                    f"a page of {protocol.show(origin)} may not use this lab's API "
                    "(--allow-origin adds one)"
                )
            if req.method == "OPTIONS":  # a browser's CORS preflight (allowed origins only)
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
                self._check_failures(conn, req)
                return await self._completion(
                    conn, req, "chat" if path == "/v1/chat/completions" else "text"
                )
            if req.method == "POST" and path in tokenize_api.PATHS:
                return await self._tokenize(conn, req, path)
            known = path in (
                "/health",
                "/metrics",
                "/v1/models",
                "/v1/chat/completions",
                "/v1/completions",
                *tokenize_api.PATHS,
            )
            if not known and not path.startswith("/v1/models/"):
                raise NotFound(f"no endpoint {protocol.show(path)}")
            if req.method != "GET":
                raise MethodNotAllowed(f"{path} does not take {protocol.show(req.method)}")
            reply = self.get(path)
            assert reply is not None  # every known path, and /v1/models/*, has a GET answer
            await conn.send(reply.status, reply.body, reply.ctype, keep)
            return keep
        except FluxoError as exc:
            await conn.send_error(exc, keep)
            return keep
        except Exception as exc:  # noqa: BLE001 - a server bug answers this request, not the class
            # logged once per kind a minute; a student's address counts it towards a pause
            key = guard.peer_key(conn.ip, req.headers.get("x-forwarded-for"))
            peer = self.peers.get(key)
            where = f"HTTP {protocol.show(req.method)} {protocol.show(path)}"
            self.server.error_log.exception(exc, where, self.peers.alias(key))
            if not peer.own:
                guard.over_line(peer.internal, self.limits.abuse_internal)
            await conn.send_error(Coded("internal", f"internal error: {type(exc).__name__}"), False)
            return False

    async def _tokenize(self, conn: Conn, req: Request, path: str) -> bool:
        """vLLM's ``/tokenize`` and ``/detokenize`` (``tokenize_api``): one of a student's
        requests/s, on the tokenizer thread."""
        peer = self.peers.get(guard.peer_key(conn.ip, req.headers.get("x-forwarded-for")))
        exempt = self._bearer_presents(req, peer) or peer.own
        if not exempt and not peer.bucket.take(self.limits.max_requests_per_s):
            raise protocol.RateLimited(
                f"over {self.limits.max_requests_per_s:g} requests a second from this address"
            )
        fn = tokenize_api.tokenize if path == "/tokenize" else tokenize_api.detokenize
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(TOKENIZER, fn, self.engine, req.body)
        await conn.send(200, protocol.dumps(body).encode(), "application/json", req.keep_alive)
        return req.keep_alive

    def _check_failures(self, conn: Conn, req: Request) -> None:
        """A student's address whose requests made the server fail ``abuse_internal`` times in the
        last 10 s waits (``rate_limited``) before the next completion is even parsed."""
        peer = self.peers.get(guard.peer_key(conn.ip, req.headers.get("x-forwarded-for")))
        if not peer.own and guard.recent(peer.internal) > self.limits.abuse_internal:
            raise protocol.RateLimited(
                f"requests from this address made the server fail over "
                f"{self.limits.abuse_internal} times in 10 s; try again shortly"
            )

    async def _completion(self, conn: Conn, req: Request, kind: str) -> bool:
        key = guard.peer_key(conn.ip, req.headers.get("x-forwarded-for"))
        peer = self.peers.get(key)
        presenter = self._bearer_presents(req, peer)  # first: a guesser waits before any work
        args = parse_body(req.body, kind)
        if args.model is not None and args.model not in self.model_ids:
            exc = ModelNotFound(
                f"no model {args.model!r} here; this server serves {self.model_id!r}"
            )
            exc.param = "model"
            raise exc
        token_ids, max_tokens = await self._admit_and_tokenize(peer, presenter, args)
        tag = f"http:{self.peers.alias(key)}"
        stream = Stream()
        request = EngineRequest(
            token_ids=token_ids,
            max_new_tokens=max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            ignore_eos=args.ignore_eos,
            client=tag,
        )
        handle = self.server.open_request(
            stream, request, peer, admitted=True, exempt=presenter or peer.own, presenter=presenter
        )
        if key not in self._named and not peer.own:
            self._named.add(key)  # the presenter's terminal alone learns who an alias is
            log.info("HTTP client %s is %s in the records", key, tag)
        gen = Generation(self.engine, stream, handle.id, args, len(token_ids))
        self.in_flight += 1
        watcher = asyncio.create_task(conn.watch(stream))
        try:
            if args.stream:
                return await event_stream(conn, req, gen, self.model_id)
            return await whole_answer(conn, req, gen, self.model_id)
        except Gone:
            return False
        finally:
            watcher.cancel()
            gen.close()
            peer.open -= 1
            self.in_flight -= 1

    async def _admit_and_tokenize(
        self, peer: guard.Peer, presenter: bool, args: CompletionArgs
    ) -> tuple[list[int], int]:
        """The address's limits before any tokenizing, and the tokenizer off the event loop: a
        student's long prompts cost that student's wait, not the class's (review 2, M2). On
        success the address holds one more open request (``open_request(admitted=True)``)."""
        protocol.check_text_size(self.engine.config.max_model_len, args.messages, args.prompt)
        self.server.admit(peer, presenter or peer.own, presenter)
        try:
            return await asyncio.get_running_loop().run_in_executor(
                TOKENIZER, prompt_and_max, self.engine, args
            )
        except BaseException:
            peer.open -= 1  # admitted above; no request took it
            raise

    def _bearer_presents(self, req: Request, peer: guard.Peer) -> bool:
        """``Authorization: Bearer <presenter token>``: a teacher's load tool, exempt from a
        student's caps. Any other bearer (the ``openai`` client always sends one, the same each
        time) is ignored, but *distinct* wrong ones back off per address as websocket ``auth``
        does (``Peers.wrong_token``: 5 free, then 0.5 s doubling): meanwhile every request with
        a bearer, the right one too, is ``rate_limited`` before any work, so guessing over HTTP
        is no faster than over the websocket and the answer tells nothing."""
        token = self.server.token
        auth = req.headers.get("authorization", "")
        if token is None or not auth.lower().startswith("bearer "):
            return False
        if wait := self.peers.token_wait(peer):
            raise protocol.RateLimited(
                f"too many wrong presenter tokens from this address; try again in {wait:.1f} s"
            )
        given = auth[7:].strip().encode("utf-8", "replace")
        if hmac.compare_digest(given, token.encode()):
            peer.bad_tokens = 0
            peer.wrong_bearers.clear()
            return True
        digest = hashlib.blake2s(given, digest_size=8).digest()
        if digest not in peer.wrong_bearers:
            if len(peer.wrong_bearers) < 64:  # past that every bearer counts, repeated or not
                peer.wrong_bearers.add(digest)
            self.peers.wrong_token(peer)
        return False
