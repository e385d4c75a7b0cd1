"""The live server: many websocket clients, one engine (``docs/protocol.md``).

Threads: the asyncio loop (this module) owns every socket; the engine steps on its own thread;
forwards run on the device thread. The engine never waits on a client: its callbacks (token
events, step records) are appended to one pending list and handed to the loop in a single
``call_soon_threadsafe`` per burst. Each connection has a writer task: its own replies and
streams are never dropped (a client that stops reading them is disconnected), while telemetry
goes through a small per-subscriber buffer that drops the oldest records and says how many.

Before a handshake the ``Host`` and ``Origin`` are checked (``guard.Origins``: only the lab page's
own origins); each connection is counted under its address (``guard.Peers``), whose caps
(connections, open requests, rate, a fair share of the queue) a student cannot pass.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import websockets
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from engine.core.cuda_exec import device_name
from engine.core.engine import Engine
from engine.core.errors import FluxoError, ShuttingDown
from engine.core.metrics import summarize_window
from engine.core.records import RequestRecord
from engine.core.requests import Request, RequestHandle
from engine.core.sequence import Event
from engine.core.telemetry import AnyRecord
from engine.server import guard, http_api, protocol
from engine.server.connection import (
    Client,
    Comparison,
    Connection,
    Limits,
    SocketGate,
    deliver,
    gated,
)
from engine.server.guard import Origins, Peers
from engine.server.presenter import PresenterMessages
from engine.server.protocol import dumps
from engine.server.viewer import ViewerMessages
from engine.workloads.traffic import TrafficParams

log = logging.getLogger("fluxo.server")
VERSION = "1"


# asyncio accepts up to ``backlog`` sockets per wakeup, and a refused one's fd lives ~3 loop turns
# (task, connection_made, close): at the default 100, 300 idle connects from one address reached a
# 256-fd limit about 1 run in 5-10 (EMFILE in the log). At 64 the peak stays under it, and a
# class's burst of joins still waits in the kernel's queue, not refused.
ACCEPT_BURST = 64

Handler = Callable[[Connection, dict], Awaitable[None]]  # one message of one client


class Server(ViewerMessages, PresenterMessages):
    def __init__(
        self,
        engine: Engine,
        host: str = "127.0.0.1",
        port: int = 8765,
        token: str | None = None,
        limits: Limits | None = None,
        model_name: str = "smollm2",
        http_port: int | None = None,
        comparison: Comparison | None = None,
        origins: Origins | None = None,
        model_aliases: tuple[str, ...] = (),
    ) -> None:
        self.engine = engine
        self.comparison = comparison
        self.host, self.port = host, port
        self.token = token or None  # an empty token is no token: nobody authenticates with ""
        self.limits = limits or Limits()
        self.model_name = model_name
        self.model_aliases = tuple(a for a in model_aliases if a and a != model_name)
        self.origins = origins or Origins.build(host)
        self.peers = Peers()
        self.error_log = guard.ErrorLog(log)  # a server bug's traceback once per kind a minute
        self._broadcast_handle: asyncio.TimerHandle | None = None
        self._exports: dict[str, tuple[tuple, asyncio.Future]] = {}  # format -> (key, text)
        self.launch_config = engine.config.live()
        self.config_view = dict(self.launch_config)  # as it will be once queued changes apply
        self.conns: set[Connection] = set()
        self.traffic: TrafficParams | None = None
        self.traffic_stats = {"sent": 0, "dropped": 0}
        self.traffic_capacity: float | None = None  # requests/s at 100 % busy, when it started
        self._shapes: dict[tuple, Any] = {}  # traffic shapes counted (engine/workloads/capacity.py)
        self._traffic_task: asyncio.Task | None = None
        self._compare_running = False
        self._compare_task: asyncio.Task | None = (
            None  # the comparison in progress (a reference keeps it alive)
        )
        self._ids = 0
        self._pending: list[tuple] = []
        self._pending_lock = threading.Lock()
        self._flush_scheduled = False
        self._last_flush = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_engine = threading.Event()
        self._engine_thread: threading.Thread | None = None
        self._wall_offset = time.time() - engine.now()
        self.ready = threading.Event()
        self.http_port = http_port  # the OpenAI-compatible API's port (0: any free one; None: off)
        self.http_url: str | None = None
        self.handlers = self._handler_table()

    def _handler_table(self) -> dict[str, Handler]:
        """What answers each message a client may send: the one dispatch table. Who may send
        which is the protocol's (``VIEWER_TYPES``, ``PRESENTER_TYPES``); a test holds them equal."""
        return {
            "chat": self._on_chat,
            "cancel": self._on_cancel,
            "subscribe": self._on_subscribe,
            "unsubscribe": self._on_unsubscribe,
            "auth": self._on_auth,
            "export": self._on_export,
            "control": self._on_control,
            "pause": self._on_pause,
            "resume": self._on_resume,
            "step": self._on_step,
            "traffic": self._on_traffic,
            "reset": self._on_reset,
            "compare": self._on_compare,
        }

    # -- lifecycle ------------------------------------------------------------------------------
    def engine_alive(self) -> bool:
        """The engine's thread is running (``/health`` says "stopped" otherwise)."""
        return self._engine_thread is not None and self._engine_thread.is_alive()

    @property
    def loopback(self) -> bool:
        return self.host in ("127.0.0.1", "localhost", "::1")

    async def serve(self, stop: asyncio.Future | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        guard.raise_fd_limit(log)  # a laptop's default (256 on macOS) is less than a class needs
        self._unsubscribe = self.engine.telemetry.subscribe(self._on_telemetry)
        self._engine_thread = threading.Thread(
            target=self.engine.run_forever,
            args=(self._stop_engine,),
            name="fluxo-engine",
            daemon=True,
        )
        self._engine_thread.start()
        metrics_task = asyncio.create_task(self._metrics_loop())
        queue_task = asyncio.create_task(self._queue_loop())
        # metrics listener; GET /health, /metrics, /v1/models on this port
        self.http = http_api.HttpApi(self)
        try:
            async with websockets.serve(
                self._handle,
                self.host,
                self.port,
                # a frame over 4x the message limit closes the connection (1009); up to that it is
                # answered message_too_large. At most 16 frames wait unread: 4 MiB a connection
                max_size=4 * self.limits.max_message_bytes,
                max_queue=16,
                compression=None,
                close_timeout=2,
                ping_interval=self.limits.keepalive_s,
                ping_timeout=self.limits.keepalive_s,
                process_request=self._process_request,
                backlog=ACCEPT_BURST,  # accepts per wakeup (M3)
                # idle sockets counted per address before any handshake byte (M3)
                create_connection=gated(SocketGate(2 * self.limits.max_connections_per_address)),  # type: ignore[arg-type]  # websockets types it as a class; it only calls it
            ) as server:
                self.port = server.sockets[0].getsockname()[1]
                self._announce()
                await self._start_http()
                self.ready.set()
                await (stop if stop is not None else asyncio.get_running_loop().create_future())
                await self._goodbye()
        finally:
            metrics_task.cancel()
            queue_task.cancel()
            await self.http.close()
            self._stop_traffic()
            self._unsubscribe()
            self._stop_engine.set()
            self._engine_thread.join(timeout=10)

    async def _goodbye(self, flush_s: float = 2.0) -> None:
        """Before the sockets close (SIGTERM, Ctrl-C): every request in flight ends with
        ``shutting_down``, so a websocket gets its ``error``, an SSE stream an error event and
        ``[DONE]``, a whole answer a 503; the HTTP answers get ``flush_s`` to leave. (Security
        review 2, L3: SIGTERM closed 3 sockets and 3 streams with no word.)"""
        if not (self.engine.live_requests() or self.engine.queue_len() or self.http.busy()):
            return
        stopping = ShuttingDown("the server is shutting down; send the request again later")
        await asyncio.to_thread(self.engine.fail_all, stopping)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + flush_s
        while self.http.busy() and loop.time() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # the last websocket messages are queued on their sockets

    def _announce(self) -> None:
        """Say where the server listens and who presents; warn about a short token (M1)."""
        who = (
            "presenter token required for control"
            if self.token
            else "loopback: every client presents"
        )
        log.info("fluxo server on ws://%s:%d (%s)", self.host, self.port, who)
        if self.token is not None and len(self.token) < 16:
            log.warning(
                "the presenter token has %d characters: a short or chosen one falls to "
                "a dictionary; use 16 or more random ones (the launcher generates one)",
                len(self.token),
            )

    async def _start_http(self) -> None:
        """The OpenAI-compatible API on its own port, when asked for."""
        if self.http_port is None:
            return
        try:
            self.http_url = await self.http.start(self.host, self.http_port)
            log.info("OpenAI-compatible HTTP API on %s/v1", self.http_url)
        except OSError as exc:  # e.g. the port is taken: the websocket server still serves
            log.warning("no OpenAI-compatible HTTP API: port %d: %s", self.http_port, exc)

    def run_in_thread(self) -> tuple[threading.Thread, Callable[[], None]]:
        """Serve on a background thread (tests, benchmarks); returns the thread and a stop
        function."""
        loop = asyncio.new_event_loop()
        stop: asyncio.Future = loop.create_future()
        thread = threading.Thread(
            target=loop.run_until_complete,
            args=(self.serve(stop),),
            name="fluxo-server",
            daemon=True,
        )
        thread.start()
        if not self.ready.wait(60):
            raise RuntimeError("the server did not start")

        def finish() -> None:
            if not stop.done():
                stop.set_result(None)

        def shutdown() -> None:
            loop.call_soon_threadsafe(finish)
            thread.join(timeout=20)

        return thread, shutdown

    # -- engine -> loop ---------------------------------------------------------------------------
    def _from_engine(self, item: tuple) -> None:
        """Called on the engine thread: hand ``item`` to the loop without ever blocking."""
        with self._pending_lock:
            self._pending.append(item)
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        assert self._loop is not None  # serve() set it before the engine thread began
        try:
            self._loop.call_soon_threadsafe(self._schedule_flush)
        except RuntimeError:  # the loop has closed: the server is going down
            pass

    def _schedule_flush(self) -> None:
        """On the loop: flush now, or ``limits.flush_s`` after the last flush. A q4 step takes ~4
        ms on a fast laptop: flushing every step woke every subscriber's writer 250 times a second
        (with 40 viewers the engine's step p50 went 3.6 -> 4.6 ms, the loop sharing its core); at
        most 50 flushes a second, each writer sends a few steps a wake. A quiet engine's first
        record still goes at once."""
        assert self._loop is not None  # on the loop: serve() set it
        delay = self._last_flush + self.limits.flush_s - self._loop.time()
        if delay > 0:
            self._loop.call_later(delay, self._flush)
        else:
            self._flush()

    def _on_telemetry(self, kind: str, record: AnyRecord) -> None:
        ended = kind == "request" and cast(RequestRecord, record)["finished"] is not None
        if kind == "step" or ended:
            self._from_engine((kind, record))

    def _flush(self) -> None:
        assert self._loop is not None  # on the loop: serve() set it
        self._last_flush = self._loop.time()
        with self._pending_lock:
            items, self._pending = self._pending, []
            self._flush_scheduled = False
        subscribers = [c for c in self.conns if c.subscribed]
        for item in items:
            kind = item[0]
            if kind == "event":
                deliver(*item[1:])
            elif subscribers:
                text = (
                    dumps(item[1])
                    if kind == "step"
                    else dumps({"type": "request", "record": item[1]})
                )
                for conn in subscribers:
                    conn.send_telemetry(kind, text)

    # -- connections ------------------------------------------------------------------------------
    def _process_request(self, connection, request):
        """Before the handshake: a ``Host`` of this machine and an allowed ``Origin`` (else 403
        ``forbidden_origin``); then the plain GETs of the HTTP endpoints."""
        headers = request.headers
        host, origin = headers.get("Host"), headers.get("Origin")
        if not self.origins.host_ok(host):
            return self.http.refuse(f"Host {protocol.show(host)} is not this machine")
        if not self.origins.origin_ok(origin, host):
            return self.http.refuse(
                f"a page of {protocol.show(origin)} may not use this lab; "
                f"allowed: {self.origins.describe()} (--allow-origin adds one)"
            )
        return self.http.process_request(connection, request)

    def _peer_of(self, ws: ServerConnection) -> guard.Peer:
        direct = ws.remote_address[0] if ws.remote_address else "unknown"
        forwarded = ws.request.headers.get("X-Forwarded-For") if ws.request else None
        return self.peers.get(guard.peer_key(direct, forwarded))

    def _presents(self, peer: guard.Peer, token: str) -> bool:
        """The presenter token, compared in constant time; wrong ones back off per address."""
        if self.token is None or self.peers.token_wait(peer) > 0:
            return False
        if hmac.compare_digest(token.encode(), self.token.encode()):
            peer.bad_tokens = 0
            return True
        self.peers.wrong_token(peer)
        return False

    async def _handle(self, ws: ServerConnection) -> None:
        self._ids += 1
        peer = self._peer_of(ws)
        # A loopback lab with no token presents to this machine's own clients; a client relayed
        # from elsewhere (X-Forwarded-For through the page's relay, app/relay.py) never does.
        presenter = self.token is None and self.loopback and peer.own
        query = parse_qs(urlsplit(ws.request.path).query) if ws.request else {}
        if "token" in query and self._presents(peer, query["token"][0]):
            presenter = True
        conn = Connection(f"c{self._ids}", ws, presenter, self.limits, peer=peer)
        if not conn.exempt and peer.conns >= self.limits.max_connections_per_address:
            await self._refuse_connection(ws, peer)
            return
        peer.conns += 1
        self.conns.add(conn)
        writer = asyncio.create_task(conn.writer())
        conn.send(
            {
                "type": "hello",
                "server": "fluxo",
                "version": VERSION,
                "client": conn.id,
                "role": "presenter" if presenter else "viewer",
                "model": self.model_name,
                "limits": self.limits.public(self.engine),
                "state": self.state(conn),
                "http_url": self.http_url,
                "device": self.engine.config.device,
                "device_name": device_name(self.engine.config.device),
            }
        )
        try:
            async for raw in ws:
                await self._on_message(conn, raw)
        except ConnectionClosed:
            pass
        finally:
            conn.closed = True
            self.conns.discard(conn)
            peer.conns -= 1
            peer.open -= len(conn.open)  # cancelled below: no longer this address's
            conn.open.clear()
            writer.cancel()
            cancelled = self.engine.cancel_client(conn.id)
            if cancelled:
                log.info("client %s left; cancelled %d of its requests", conn.id, cancelled)

    async def _refuse_connection(self, ws: ServerConnection, peer: guard.Peer) -> None:
        """A student's address over its connection cap: one coded error, then close (1013: try
        again later), so the page can say why."""
        limit = self.limits.max_connections_per_address
        msg = {
            "type": "error",
            "code": protocol.TooManyConnections.code,
            "message": f"this address already has {peer.conns} connections open (limit {limit}); "
            "close another tab of the lab",
        }
        try:
            await ws.send(dumps(msg))
            await ws.close(1013, "too_many_connections")
        except ConnectionClosed:
            pass

    async def _on_message(self, conn: Connection, raw: str | bytes) -> None:
        ref, kind = None, "?"
        try:
            per_s = self.limits.messages_per_s  # every kind: a subscribe copies up to 2,000 steps
            if not (conn.exempt or conn.peer is None or conn.peer.messages.take(per_s)):
                raise protocol.RateLimited(
                    f"over {per_s:g} messages a second from this address; this one was dropped"
                )
            msg = protocol.parse(raw, self.limits.max_message_bytes)
            ref = msg.get("ref") if isinstance(msg.get("ref"), str) else None
            kind = msg["type"]
            if kind in protocol.PRESENTER_TYPES and not conn.presenter:
                raise protocol.Forbidden(
                    f"{kind!r} is for the presenter; send auth with the presenter token first"
                )
            await self.handlers[kind](conn, msg)
        except FluxoError as exc:
            conn.error(exc.code, exc.message, ref=ref or getattr(exc, "ref", None))
        except Exception as exc:  # noqa: BLE001 - a server bug answers this message, not the whole class
            # logged once per kind a minute, and counted heavily against the sender's abuse line
            self.error_log.exception(exc, f"a {kind} message", conn.id)
            conn.error("internal", f"internal error: {type(exc).__name__}", ref=ref)

    # -- state ----------------------------------------------------------------------------------
    def state(self, conn: Connection | None = None) -> dict[str, Any]:
        running = self.engine.running_count()
        return {
            "type": "state",
            "config": dict(self.config_view),
            "paused": self.engine.paused,
            "comparing": self._compare_running,  # the live engine and traffic are held meanwhile
            "traffic": None
            if self.traffic is None
            else {
                **self.traffic.to_dict(),
                **self.traffic_stats,
                "capacity": self.traffic_capacity,
            },
            "role": None if conn is None else ("presenter" if conn.presenter else "viewer"),
            "queue_len": self.engine.queue_len(),
            "running": running,
            "step": self.engine.step_count,
            "kv": self.engine.kv_usage(),
            "wall_offset": self._wall_offset,
            "subscribers": sum(c.subscribed for c in self.conns),
            # Where the forward runs (the GPU's or CPU's name) and whether decode steps replay CUDA
            # graphs.
            "device": self.engine.config.device,
            "device_name": device_name(self.engine.config.device),
            # The weight format the forward really reads (engine/core/quant.py): "fp32", "q4" or
            # "q8"; "fp32" also where q4/q8 was asked for but the quantized kernels cannot run here.
            **self.engine.execution(),
        }

    def broadcast_state(self) -> None:
        for conn in list(self.conns):
            conn.send_latest("state", dumps(self.state(conn)))

    def broadcast_state_soon(self) -> None:
        """One broadcast for a burst of changes (subscribes): at most ten a second."""
        if self._broadcast_handle is None:

            def fire() -> None:
                self._broadcast_handle = None
                self.broadcast_state()

            self._broadcast_handle = asyncio.get_running_loop().call_later(0.1, fire)

    async def _metrics_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            subscribers = [c for c in self.conns if c.subscribed]
            if not subscribers:
                continue
            steps, requests = self.engine.telemetry.snapshot()
            now, by_window = self.engine.now(), {}  # one summary per window asked for
            for conn in subscribers:  # the state too: queue length and KV use move on their own
                window = conn.metrics_window_s or self.limits.metrics_window_s
                if window not in by_window:
                    summary = summarize_window(steps, requests, now - window)
                    by_window[window] = dumps(
                        {"type": "metrics", "window_s": window, "summary": summary}
                    )
                conn.send_latest("metrics", by_window[window])
                conn.send_latest("state", dumps(self.state(conn)))

    def open_request(
        self,
        client: Client,
        request: Request,
        peer: guard.Peer,
        *,
        exempt: bool,
        presenter: bool,
        own_open: int | None = None,
        own_bucket: protocol.TokenBucket | None = None,
        ref: str | None = None,
        admitted: bool = False,
    ) -> RequestHandle:
        """The one way a chat enters the engine, from a websocket or the HTTP API: the address's
        limits (``admit``), then ``Engine.submit(request)`` with ``client``'s delivery (the caller
        made ``request`` once, its ``client`` the connection's id or the HTTP peer's tag).
        ``client`` (a ``Connection`` or an HTTP ``Stream``: ``open``, ``closed``, ``send``) receives
        the protocol's token/done/error messages on the loop, one burst per hand-off. The address's
        open request is given back at once if the engine refuses the request, else when its
        answer ends (``deliver`` for a websocket, the HTTP handler's ``finally``). ``admitted``:
        the caller already ran ``admit`` (HTTP does, before tokenizing)."""
        if not admitted:
            self.admit(peer, exempt, presenter, own_open, own_bucket)
        try:
            handle = self.engine.submit(request, sink=functools.partial(self._event_for, client))
        except BaseException:
            peer.open -= 1
            raise
        client.open[handle.id] = {"ref": ref, "n": 0, "seq": handle.seq}
        return handle

    def _event_for(self, client: Client, event: Event) -> None:
        """A request's engine event (on the engine thread), handed to the loop for ``client``."""
        self._from_engine(("event", client, event))

    # -- per-address admission ------------------------------------------------------------------
    def check_queue(self) -> None:
        if self.engine.queue_len() >= self.limits.queue_limit:
            raise protocol.Busy(
                f"the queue holds {self.limits.queue_limit} requests; try again shortly"
            )

    def admit(
        self,
        peer: guard.Peer,
        exempt: bool,
        presenter: bool,
        own_open: int | None = None,
        own_bucket: protocol.TokenBucket | None = None,
    ) -> None:
        """A new request from ``peer``'s address, or the coded reason it is refused.

        A student's address: its open requests and its rate. An exempt client (a presenter, this
        machine's loopback): only its own connection's (``own_open``, ``own_bucket``; an HTTP
        client has none). Everyone but a presenter: the address's fair share of the queue. Then
        the queue itself. On success the address has one more open request (the caller's
        delivery or ``finally`` takes it back)."""
        lim = self.limits
        if exempt:
            if own_open is not None and own_open >= lim.max_open_requests:
                raise protocol.TooManyRequests(
                    f"this connection already has {own_open} open requests (limit "
                    f"{lim.max_open_requests})"
                )
            bucket = own_bucket
        else:
            if peer.open >= lim.max_open_requests:
                raise protocol.TooManyRequests(
                    f"this address already has {peer.open} open requests (limit "
                    f"{lim.max_open_requests})"
                )
            bucket = peer.bucket
        if bucket is not None and not bucket.take(lim.max_requests_per_s):
            raise protocol.RateLimited(f"over {lim.max_requests_per_s:g} requests/s; slow down")
        if not presenter:
            share = self.peers.fair_share(peer, lim.queue_limit, lim.max_open_requests)
            if peer.open >= share:
                raise protocol.FairShare(
                    f"this address holds {peer.open} open requests, its fair share of the "
                    f"queue's {lim.queue_limit} places while others wait; try again when some end"
                )
        self.check_queue()
        peer.open += 1
