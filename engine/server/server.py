"""The live server: many websocket clients, one engine (``docs/protocol.md``).

Threads: the asyncio loop (this module) owns every socket; the engine steps on its own thread;
forwards run on the device thread. The engine never waits on a client: its callbacks (token
events, step records) are appended to one pending list and handed to the loop in a single
``call_soon_threadsafe`` per burst. Each connection has a writer task: its own replies and
streams are never dropped (a client that stops reading them is disconnected), while telemetry
goes through a small per-subscriber buffer that drops the oldest records and says how many.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

import websockets
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from engine.server import http_api
from engine.server import protocol
from engine.core.engine import Engine
from engine.core.cuda_exec import device_name
from engine.core.errors import FluxoError, UnknownRequest
from engine.core.metrics import inter_token_latencies, median, summarize_window
from engine.server.protocol import dumps
from engine.core.sequence import Event, Sequence
from engine.workloads.traffic import CLIENT as TRAFFIC_CLIENT, TrafficParams, TrafficSource

log = logging.getLogger("fluxo.server")
VERSION = "1"


@dataclass(frozen=True)
class Comparison:
    """How the server replays a comparison for the page. The command that starts the server hands
    it in (``engine.serve`` passes the lessons' scenario replay), so the server never imports the
    lab; without one, ``compare`` answers ``compare_unavailable``."""

    run: Callable[..., dict]  # (model, tokenizer, workload, a, b, scale) -> the compare answer
    workloads: tuple[str, ...]  # the workload names ``run`` accepts


@dataclass(slots=True)
class Limits:
    """Per-client and server-wide limits. The defaults hold a class of 60: every browser session
    is a client of its own (4 open requests each), and the queue has room for all of them."""

    max_message_bytes: int = 64 * 1024
    max_open_requests: int = 4  # per client
    max_requests_per_s: float = 10.0  # per client: a token bucket with a burst of twice that (at least 1)
    queue_limit: int = 256  # requests waiting for a slot, all clients together (60 x 4 = 240)
    subscriber_buffer: int = 64  # step records a slow subscriber may lag before the oldest drop
    max_outbox: int = 20_000  # unread replies/stream messages before a client is disconnected
    abuse_errors: int = 2_000  # errors in 10 s before a client is disconnected
    history: int = 300  # default steps sent on subscribe
    metrics_window_s: float = 30.0
    queue_report_s: float = 0.5  # how often a waiting request's place in the queue is re-sent
    keepalive_s: float = 20.0  # ping interval; a client that answers no ping for as long is dropped

    def public(self, engine: Engine) -> dict[str, Any]:
        return {"max_message_bytes": self.max_message_bytes, "max_open_requests": self.max_open_requests,
                "max_requests_per_s": self.max_requests_per_s, "queue_limit": self.queue_limit,
                "max_tokens": engine.config.max_new_tokens_limit, "max_prompt_tokens": engine.config.max_model_len - 1}


@dataclass(slots=True, eq=False)
class Connection:
    id: str
    ws: ServerConnection
    presenter: bool
    limits: Limits
    open: dict[int, dict] = field(default_factory=dict)  # request id -> {"ref", "n", "pos"}
    subscribed: bool = False
    out: deque[str] = field(default_factory=deque)
    latest: dict[str, str] = field(default_factory=dict)  # state / metrics: only the newest matters
    tele: deque[tuple[str, str]] = field(default_factory=deque)
    skipped: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    bucket: protocol.TokenBucket = field(default_factory=protocol.TokenBucket)
    errors: deque[float] = field(default_factory=deque)
    closed: bool = False

    def send(self, msg: dict[str, Any]) -> None:
        if self.closed:
            return
        self.out.append(dumps(msg))
        self.wake.set()
        if len(self.out) > self.limits.max_outbox:
            log.warning("client %s does not read its stream (%d unread); disconnecting", self.id, len(self.out))
            self.closed = True
            self.ws.transport.abort()

    def send_latest(self, kind: str, text: str) -> None:
        self.latest[kind] = text
        self.wake.set()

    def send_telemetry(self, kind: str, text: str) -> None:
        """Step records (``text`` is the record) and ended-request records (the whole message): a
        lagging subscriber loses the oldest and is told how many in its next ``step``."""
        if len(self.tele) >= self.limits.subscriber_buffer:
            self.tele.popleft()
            self.skipped += 1
        self.tele.append((kind, text))
        self.wake.set()

    def take_request_token(self) -> bool:
        return self.bucket.take(self.limits.max_requests_per_s)

    def count_error(self) -> bool:
        """Record an error; True when the client has crossed the abuse line."""
        now = time.monotonic()
        self.errors.append(now)
        while self.errors and now - self.errors[0] > 10:
            self.errors.popleft()
        return len(self.errors) > self.limits.abuse_errors

    async def writer(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.out or self.latest or self.tele:
                if self.out:
                    text = self.out.popleft()
                elif self.latest:
                    text = self.latest.pop(next(iter(self.latest)))
                else:
                    kind, text = self.tele.popleft()
                    if kind == "step":
                        text, self.skipped = f'{{"type":"step","skipped":{self.skipped},"record":{text}}}', 0
                await self.ws.send(text)


class Server:
    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
                 limits: Limits | None = None, model_name: str = "smollm2", http_port: int | None = None,
                 comparison: Comparison | None = None) -> None:
        self.engine = engine
        self.comparison = comparison
        self.host, self.port = host, port
        self.token = token
        self.limits = limits or Limits()
        self.model_name = model_name
        self.launch_config = engine.config.live()
        self.config_view = dict(self.launch_config)  # as it will be once queued changes apply
        self.conns: set[Connection] = set()
        self.traffic: TrafficParams | None = None
        self.traffic_stats = {"sent": 0, "dropped": 0}
        self._traffic_task: asyncio.Task | None = None
        self._compare_running = False
        self._compare_task: asyncio.Task | None = None  # the comparison in progress (a reference keeps it alive)
        self._ids = 0
        self._pending: list[tuple] = []
        self._pending_lock = threading.Lock()
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_engine = threading.Event()
        self._engine_thread: threading.Thread | None = None
        self._wall_offset = time.time() - engine.now()
        self.ready = threading.Event()
        self.http_port = http_port  # the OpenAI-compatible API's port (0: any free one; None: off)
        self.http_url: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def loopback(self) -> bool:
        return self.host in ("127.0.0.1", "localhost", "::1")

    async def serve(self, stop: asyncio.Future | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._unsubscribe = self.engine.telemetry.subscribe(self._on_telemetry)
        self._engine_thread = threading.Thread(target=self.engine.run_forever, args=(self._stop_engine,),
                                               name="fluxo-engine", daemon=True)
        self._engine_thread.start()
        metrics_task = asyncio.create_task(self._metrics_loop())
        queue_task = asyncio.create_task(self._queue_loop())
        self.http = http_api.HttpApi(self)  # metrics listener; GET /health, /metrics, /v1/models on this port
        try:
            async with websockets.serve(self._handle, self.host, self.port, max_size=16 * self.limits.max_message_bytes,
                                        max_queue=64, compression=None, close_timeout=2,
                                        ping_interval=self.limits.keepalive_s, ping_timeout=self.limits.keepalive_s,
                                        process_request=self.http.process_request) as server:
                self.port = server.sockets[0].getsockname()[1]
                log.info("fluxo server on ws://%s:%d (%s)", self.host, self.port,
                         "presenter token required for control" if self.token else "loopback: every client presents")
                if self.http_port is not None:
                    try:
                        self.http_url = await self.http.start(self.host, self.http_port)
                        log.info("OpenAI-compatible HTTP API on %s/v1", self.http_url)
                    except OSError as exc:  # e.g. the port is taken: the websocket server still serves
                        log.warning("no OpenAI-compatible HTTP API: port %d: %s", self.http_port, exc)
                self.ready.set()
                await (stop if stop is not None else asyncio.get_running_loop().create_future())
        finally:
            metrics_task.cancel()
            queue_task.cancel()
            await self.http.close()
            self._stop_traffic()
            self._unsubscribe()
            self._stop_engine.set()
            self._engine_thread.join(timeout=10)

    def run_in_thread(self) -> tuple[threading.Thread, callable]:
        """Serve on a background thread (tests, benchmarks); returns the thread and a stop function."""
        loop = asyncio.new_event_loop()
        stop: asyncio.Future = loop.create_future()
        thread = threading.Thread(target=loop.run_until_complete, args=(self.serve(stop),), name="fluxo-server", daemon=True)
        thread.start()
        if not self.ready.wait(60):
            raise RuntimeError("the server did not start")

        def shutdown() -> None:
            loop.call_soon_threadsafe(lambda: stop.done() or stop.set_result(None))
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
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop has closed: the server is going down
            pass

    def _on_telemetry(self, kind: str, record: dict) -> None:
        if kind == "step" or record["finished"] is not None:
            self._from_engine((kind, record))

    def _flush(self) -> None:
        with self._pending_lock:
            items, self._pending = self._pending, []
            self._flush_scheduled = False
        subscribers = [c for c in self.conns if c.subscribed]
        for item in items:
            kind = item[0]
            if kind == "event":
                self._deliver(*item[1:])
            elif subscribers:
                text = dumps(item[1]) if kind == "step" else dumps({"type": "request", "record": item[1]})
                for conn in subscribers:
                    conn.send_telemetry(kind, text)

    def _deliver(self, conn: Connection, seq: Sequence, event: Event) -> None:
        entry = conn.open.get(seq.id)
        if entry is None or conn.closed:
            return
        ref = entry["ref"]
        if event.kind == "token":
            conn.send({"type": "token", "request": seq.id, "ref": ref, "text": event.text, "token_id": event.token_id,
                       "index": entry["n"]})
            entry["n"] += 1
            return
        del conn.open[seq.id]
        if event.kind == "error":
            conn.send({"type": "error", "code": event.error_code, "message": event.error, "request": seq.id, "ref": ref})
        else:
            conn.send({"type": "done", "request": seq.id, "ref": ref, "status": event.status, "stats": _stats(seq)})

    # -- connections ------------------------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        self._ids += 1
        presenter = self.token is None and self.loopback
        query = parse_qs(urlsplit(ws.request.path).query) if ws.request else {}
        if self.token and hmac.compare_digest(query.get("token", [""])[0].encode(), self.token.encode()):
            presenter = True
        conn = Connection(f"c{self._ids}", ws, presenter, self.limits)
        self.conns.add(conn)
        writer = asyncio.create_task(conn.writer())
        conn.send({"type": "hello", "server": "fluxo", "version": VERSION, "client": conn.id,
                   "role": "presenter" if presenter else "viewer", "model": self.model_name,
                   "limits": self.limits.public(self.engine), "state": self.state(conn), "http_url": self.http_url,
                   "device": self.engine.config.device, "device_name": device_name(self.engine.config.device)})
        try:
            async for raw in ws:
                await self._on_message(conn, raw)
        except ConnectionClosed:
            pass
        finally:
            conn.closed = True
            self.conns.discard(conn)
            writer.cancel()
            cancelled = self.engine.cancel_client(conn.id)
            if cancelled:
                log.info("client %s left; cancelled %d of its requests", conn.id, cancelled)

    async def _on_message(self, conn: Connection, raw: str | bytes) -> None:
        ref = None
        try:
            msg = protocol.parse(raw, self.limits.max_message_bytes)
            ref = msg.get("ref") if isinstance(msg.get("ref"), str) else None
            kind = msg["type"]
            if kind in protocol.PRESENTER_TYPES and not conn.presenter:
                raise protocol.Forbidden(f"{kind!r} is for the presenter; send auth with the presenter token first")
            await getattr(self, f"_on_{kind}")(conn, msg)
        except FluxoError as exc:
            self._error(conn, exc.code, exc.message, ref=ref)
        except Exception as exc:  # noqa: BLE001 - a server bug answers this message, not the whole class
            log.exception("error handling a message from %s", conn.id)
            self._error(conn, "internal", f"internal error: {type(exc).__name__}", ref=ref)

    def _error(self, conn: Connection, code: str, message: str, request: int | None = None, ref: str | None = None) -> None:
        msg: dict[str, Any] = {"type": "error", "code": code, "message": message}
        if request is not None:
            msg["request"] = request
        if ref is not None:
            msg["ref"] = ref
        conn.send(msg)
        if conn.count_error():
            log.warning("client %s sent over %d bad messages in 10 s; disconnecting", conn.id, self.limits.abuse_errors)
            conn.closed = True
            asyncio.ensure_future(conn.ws.close(1008, "too many bad messages"))

    # -- state ----------------------------------------------------------------------------------
    def state(self, conn: Connection | None = None) -> dict[str, Any]:
        running = len(self.engine.scheduler.running)
        return {"type": "state", "config": dict(self.config_view), "paused": self.engine.paused,
                "comparing": self._compare_running,  # the live engine and traffic are held meanwhile
                "traffic": None if self.traffic is None else {**self.traffic.to_dict(), **self.traffic_stats},
                "role": None if conn is None else ("presenter" if conn.presenter else "viewer"),
                "queue_len": self.engine.queue_len(), "running": running, "step": self.engine.step_count,
                "kv": {"blocks_total": self.engine.blocks.budget, "blocks_used": self.engine.blocks.num_used},
                "wall_offset": self._wall_offset, "subscribers": sum(c.subscribed for c in self.conns),
                # Where the forward runs (the GPU's or CPU's name) and whether decode steps replay CUDA graphs.
                "device": self.engine.config.device, "device_name": device_name(self.engine.config.device),
                "cuda_graphs": bool(getattr(self.engine, "cuda", None) and self.engine.cuda.graphs_on),
                # The weight format the forward really reads (engine/core/quant.py): "fp32", "q4" or "q8";
                # "fp32" also where q4/q8 was asked for but the quantized kernels cannot run here.
                "weights": getattr(getattr(self.engine.runner, "forward_impl", None), "weights", "fp32")}

    def broadcast_state(self) -> None:
        for conn in list(self.conns):
            conn.send_latest("state", dumps(self.state(conn)))

    async def _metrics_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            subscribers = [c for c in self.conns if c.subscribed]
            if not subscribers:
                continue
            steps, requests = self.engine.telemetry.snapshot()
            since = self.engine.now() - self.limits.metrics_window_s
            summary = summarize_window(steps, requests, since)
            metrics = dumps({"type": "metrics", "window_s": self.limits.metrics_window_s, "summary": summary})
            for conn in subscribers:  # the state too: queue length and KV use move without any control
                conn.send_latest("metrics", metrics)
                conn.send_latest("state", dumps(self.state(conn)))

    def submit_for(self, client: Any, client_id: str, **submit: Any):
        """Submit a request for a client that is not a websocket (the HTTP API): the queue limit, the
        engine and the per-burst hand-off are the chat's; ``client`` (``open``, ``closed``, ``send``)
        receives the protocol's token/done/error messages on the loop."""
        if self.engine.queue_len() >= self.limits.queue_limit:
            raise protocol.Busy(f"the queue holds {self.limits.queue_limit} requests; try again shortly")
        holder: list[Sequence] = []
        handle = self.engine.submit(client=client_id, sink=lambda ev: self._from_engine(("event", client, holder[0], ev)),
                                    **submit)
        holder.append(handle.seq)
        client.open[handle.id] = {"ref": None, "n": 0}
        return handle

    # -- viewer messages ----------------------------------------------------------------------------
    async def _on_chat(self, conn: Connection, msg: dict) -> None:
        args = protocol.chat_args(msg, self.engine.config.max_new_tokens_limit)
        if len(conn.open) >= self.limits.max_open_requests:
            raise protocol.TooManyRequests(f"this client already has {len(conn.open)} open requests (limit {self.limits.max_open_requests})")
        if not conn.take_request_token():
            raise protocol.RateLimited(f"over {self.limits.max_requests_per_s:g} requests/s; slow down")
        if self.engine.queue_len() >= self.limits.queue_limit:
            raise protocol.Busy(f"the queue holds {self.limits.queue_limit} requests; try again shortly")
        holder: list[Sequence] = []
        handle = self.engine.submit(messages=args.messages, prompt=args.prompt, max_new_tokens=args.max_tokens,
                                    temperature=args.temperature, top_p=args.top_p, seed=args.seed, client=conn.id,
                                    ignore_eos=args.ignore_eos,
                                    sink=lambda ev: self._from_engine(("event", conn, holder[0], ev)))
        holder.append(handle.seq)
        pos = self.engine.queue_positions().get(handle.id)
        conn.open[handle.id] = {"ref": args.ref, "n": 0, "pos": pos}
        conn.send({"type": "accepted", "ref": args.ref, "request": handle.id, "prompt_tokens": len(handle.seq.prompt_ids),
                   "queue_position": pos})

    async def _queue_loop(self) -> None:
        """Tell each client where its waiting requests stand: a ``queued`` message whenever a
        request's place changes (``position`` 1 = admitted next; 0 = admitted, running)."""
        while True:
            await asyncio.sleep(self.limits.queue_report_s)
            waiting = [c for c in self.conns if c.open and not c.closed]
            if not waiting:
                continue
            positions = self.engine.queue_positions()
            for conn in waiting:
                for rid, entry in list(conn.open.items()):
                    pos = positions.get(rid, 0)
                    if pos != entry.get("pos") and (pos or entry.get("pos")):
                        entry["pos"] = pos
                        conn.send({"type": "queued", "request": rid, "ref": entry["ref"], "position": pos})

    async def _on_cancel(self, conn: Connection, msg: dict) -> None:
        rid = protocol.get_int(msg, "request", None, 0, 2**63)
        if rid is None:
            raise protocol.BadField("cancel needs request (an integer id)")
        live = rid in conn.open or (conn.presenter and any(s.id == rid for s in self.engine.live_requests()))
        if not live:
            raise UnknownRequest(f"no open request {rid} of yours")
        self.engine.cancel(rid)

    async def _on_subscribe(self, conn: Connection, msg: dict) -> None:
        n = protocol.get_int(msg, "history", self.limits.history, 0, 100_000)
        steps, requests = self.engine.telemetry.snapshot()
        conn.send(self.state(conn))
        conn.send({"type": "history", "steps": steps[-n:] if n else [], "requests": requests[-n:] if n else []})
        conn.subscribed = True
        self.broadcast_state()

    async def _on_unsubscribe(self, conn: Connection, msg: dict) -> None:
        conn.subscribed = False
        conn.tele.clear()
        conn.send({"type": "ok", "of": "unsubscribe"})

    async def _on_auth(self, conn: Connection, msg: dict) -> None:
        token = protocol.get_str(msg, "token", "", 1024)
        if self.token is None:
            conn.presenter = conn.presenter or self.loopback
        elif hmac.compare_digest(token.encode(), self.token.encode()):
            conn.presenter = True
        else:
            raise protocol.BadToken("wrong presenter token")
        conn.send(self.state(conn))

    async def _on_export(self, conn: Connection, msg: dict) -> None:
        fmt = msg.get("format", "jsonl")
        telemetry = self.engine.telemetry
        if fmt == "jsonl":
            data: Any = await asyncio.to_thread(telemetry.jsonl)
        elif fmt == "chrome":
            data = await asyncio.to_thread(telemetry.chrome_trace)
        else:
            raise protocol.BadField(f"format must be jsonl or chrome, got {protocol._show(fmt)}")
        conn.send({"type": "export", "format": fmt, "data": data})

    # -- presenter messages -------------------------------------------------------------------------
    async def _on_control(self, conn: Connection, msg: dict) -> None:
        changes = {k: v for k, v in msg.items() if k not in ("type", "ref")}
        if not changes:
            raise protocol.BadField("control needs at least one of: " + ", ".join(self.launch_config))
        new = self.engine.reconfigure(**changes)
        self.config_view = new.live()
        self.broadcast_state()

    async def _on_pause(self, conn: Connection, msg: dict) -> None:
        self._refuse_while_comparing("pause")
        await asyncio.to_thread(self.engine.pause)
        self.broadcast_state()

    def _refuse_while_comparing(self, what: str) -> None:
        if self._compare_running:
            raise protocol.CompareRunning(f"the live engine is held while a comparison runs; {what} when it ends")

    async def _on_resume(self, conn: Connection, msg: dict) -> None:
        self._refuse_while_comparing("resume")
        self.engine.resume()
        self.broadcast_state()

    async def _on_step(self, conn: Connection, msg: dict) -> None:
        self._refuse_while_comparing("step")
        if not self.engine.paused:
            raise protocol.NotPaused("step works while the engine is paused; send pause first")
        record = await asyncio.to_thread(self.engine.single_step)
        self.broadcast_state()
        if record is None:
            raise protocol.NothingToRun("nothing is queued or running (or a static batch is still filling): the step did nothing")

    async def _on_traffic(self, conn: Connection, msg: dict) -> None:
        action = msg.get("action")
        if action not in ("start", "stop"):
            raise protocol.BadField(f"traffic action must be start or stop, got {protocol._show(action)}")
        self._stop_traffic()
        if action == "start":
            params = TrafficParams.from_message({k: v for k, v in msg.items() if k not in ("type", "action", "ref")})
            self.traffic, self.traffic_stats = params, {"sent": 0, "dropped": 0}
            self._traffic_task = asyncio.create_task(self._traffic_loop(params))
        self.broadcast_state()

    def _stop_traffic(self) -> None:
        if self._traffic_task is not None:
            self._traffic_task.cancel()
            self._traffic_task = None
        self.traffic = None

    async def _traffic_loop(self, params: TrafficParams) -> None:
        source = TrafficSource(params)
        while True:
            arrival = source.next()
            await asyncio.sleep(arrival.delay_s)
            while self._compare_running:  # held: a comparison measures only itself
                await asyncio.sleep(0.1)
            # Arrivals go on while the engine is paused (the queue visibly grows, and stepping has work);
            # beyond the queue limit they are dropped and counted, as a real server would refuse them.
            if self.engine.queue_len() >= self.limits.queue_limit:
                self.traffic_stats["dropped"] += 1
                continue
            try:
                self.engine.submit(prompt=arrival.prompt, max_new_tokens=arrival.max_new_tokens,
                                   ignore_eos=arrival.ignore_eos, client=TRAFFIC_CLIENT,
                                   temperature=0.0)
                self.traffic_stats["sent"] += 1
            except FluxoError as exc:  # e.g. a KV budget shrunk below a long prompt: skip it, say so
                self.traffic_stats["dropped"] += 1
                log.info("traffic request refused: %s", exc.message)

    async def _on_reset(self, conn: Connection, msg: dict) -> None:
        self._stop_traffic()
        self.engine.resume()
        self.engine.cancel_all()
        new = self.engine.reconfigure(**self.launch_config)
        self.config_view = new.live()
        deadline = time.monotonic() + 30
        while (self.engine.live_requests() or self.engine.has_work()) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.engine.telemetry.clear()
        for c in self.conns:
            if c.subscribed:
                c.tele.clear()
                c.send({"type": "history", "steps": [], "requests": []})
        self.broadcast_state()

    async def _on_compare(self, conn: Connection, msg: dict) -> None:
        if self.comparison is None:
            raise protocol.CompareUnavailable("this server was started without a comparison runner")
        if self._compare_running:
            raise protocol.CompareRunning("a comparison is already running; wait for its result")
        workload = msg.get("workload")
        if workload not in self.comparison.workloads:
            raise protocol.BadField(f"workload must be one of {', '.join(self.comparison.workloads)}, got {protocol._show(workload)}")
        a, b = msg.get("a", {}), msg.get("b", {})
        if not isinstance(a, dict) or not isinstance(b, dict):
            raise protocol.BadField("a and b must be objects of live config fields")
        for side in (a, b):
            self.engine.config.updated(**side).validate()
        scale = protocol.get_float(msg, "scale", 1.0, 0.05, 1.0)
        # A comparison never shares the device with live work: the live engine is paused (its
        # step in progress ends first) and the traffic generator holds its arrivals until the
        # replays are done; people's chats are queued meanwhile (state.comparing says why).
        # It runs as a task of its own, so this connection's other messages are answered meanwhile.
        self._compare_running = True
        self.broadcast_state()
        ref = msg.get("ref") if isinstance(msg.get("ref"), str) else None
        self._compare_task = asyncio.create_task(self._compare(conn, self.comparison.run, workload, a, b, scale, ref))

    async def _compare(self, conn: Connection, compare, workload: str, a: dict, b: dict, scale: float,
                       ref: str | None) -> None:
        was_paused = self.engine.paused
        try:
            if not was_paused:
                await asyncio.to_thread(self.engine.pause)
            result = await asyncio.to_thread(compare, self.engine.model, self.engine.tokenizer, workload, a, b, scale)
        except FluxoError as exc:
            self._error(conn, exc.code, exc.message, ref=ref)
            return
        except Exception as exc:  # noqa: BLE001 - a failed replay answers its presenter, the server goes on
            log.exception("comparison failed")
            self._error(conn, "internal", f"the comparison failed: {type(exc).__name__}", ref=ref)
            return
        finally:
            self._compare_running = False
            if not was_paused:
                self.engine.resume()
            self.broadcast_state()
        result["held"] = {"live_engine_paused": True, "traffic_held": self.traffic is not None}
        conn.send({"type": "compare", **({"ref": ref} if ref else {}), **result})


def _stats(seq: Sequence) -> dict[str, Any]:
    itl = inter_token_latencies([{"token_times": seq.token_times}])
    start = seq.admitted if seq.admitted is not None else seq.arrival
    return {"prompt_tokens": len(seq.prompt_ids), "output_tokens": len(seq.token_times),
            "queue_s": start - seq.arrival,
            "ttft_s": None if seq.first_token is None else seq.first_token - seq.arrival,
            "itl_p50_s": median(itl) if itl else None, "itl_max_s": max(itl) if itl else None,
            "duration_s": (seq.finished or seq.arrival) - seq.arrival}
