"""One websocket client's side of the server: its limits, its outbox and writer task.

Its own replies and streams are never dropped (a client that stops reading them is disconnected
once its unread messages pass a count or a byte budget); ``state``/``metrics`` keep only the
newest; telemetry goes through a small buffer that drops the oldest records and says how many
(``skipped`` in the next ``step`` message). Per-address limits live in ``guard.Peers``; each
connection holds its address's ``Peer``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from websockets.asyncio.server import ServerConnection

from engine.core.engine import Engine
from engine.core.metrics import inter_token_latencies, median
from engine.core.sequence import Event, Sequence
from engine.server import protocol
from engine.server.guard import Peer, counted, ip_of, is_own, over_line
from engine.server.protocol import dumps

log = logging.getLogger("fluxo.server")


@dataclass(frozen=True)
class Comparison:
    """How the server replays a comparison for the page. The command that starts the server hands
    it in (``engine.serve`` passes the lessons' scenario replay), so the server never imports the
    lab; without one, ``compare`` answers ``compare_unavailable``."""

    run: Callable[..., dict]  # (model, tokenizer, workload, a, b, scale) -> the compare answer
    workloads: tuple[str, ...]  # the workload names ``run`` accepts


@dataclass(slots=True)
class Limits:
    """Per-address and server-wide limits. The defaults hold a class of 60: every student's
    address gets 4 open requests, and the queue has room for all of them. This machine's own
    loopback (the page, the teacher's browser, load tools) and presenters are exempt from the
    per-address caps (``engine/server/guard.py``)."""

    max_message_bytes: int = 64 * 1024
    max_open_requests: int = 4  # per address (websocket chats and HTTP completions together)
    max_requests_per_s: float = (
        10.0  # per address: a token bucket with a burst of twice that (at least 1)
    )
    queue_limit: int = 256  # requests waiting for a slot, all clients together (60 x 4 = 240)
    subscriber_buffer: int = 64  # step records a slow subscriber may lag before the oldest drop
    max_outbox: int = 20_000  # unread replies/stream messages before a client is disconnected
    max_outbox_bytes: int = 32 << 20  # unread bytes before a viewer is disconnected (8x presenter)
    abuse_errors: int = 2_000  # errors in 10 s before a client is disconnected
    abuse_internal: int = 20  # internal errors in 10 s, per address (and connection): then closed
    history: int = 300  # default steps sent on subscribe
    max_history: int = 2_000  # most steps a viewer's subscribe sends (a presenter: all kept)
    history_per_s: float = 1.0  # a viewer's subscribes with history a second (burst of 2)
    messages_per_s: float = 20.0  # a student's address, every message (burst of 40; L7)
    export_interval_s: float = 10.0  # one export per address this often (presenters: no limit)
    max_connections_per_address: int = 16  # websockets of one student's address
    max_http_connections_per_address: int = 32  # HTTP connections of one student's address
    http_request_s: float = 30.0  # one deadline for an HTTP request's head and body
    metrics_window_s: float = 30.0
    queue_report_s: float = 0.5  # how often a waiting request's place in the queue is re-sent
    keepalive_s: float = 20.0  # ping interval; a client that answers no ping for as long is dropped
    flush_s: float = 0.02  # the engine's records reach the clients at most this often (below)

    def public(self, engine: Engine) -> dict[str, Any]:
        return {
            "max_message_bytes": self.max_message_bytes,
            "max_open_requests": self.max_open_requests,
            "max_requests_per_s": self.max_requests_per_s,
            "queue_limit": self.queue_limit,
            "max_tokens": engine.config.max_new_tokens_limit,
            "max_prompt_tokens": engine.config.max_model_len - 1,
        }


EXPORT = '{"type":"export"'  # never in the unread bytes: 5 min of a class made one past 32 MB


@dataclass(slots=True, eq=False)
class Connection:
    id: str
    ws: ServerConnection
    presenter: bool
    limits: Limits
    peer: Peer  # its address's counters (guard.Peers)
    open: dict[int, dict] = field(default_factory=dict)  # request id -> {"ref", "n", "pos"}
    subscribed: bool = False
    out: deque[str] = field(default_factory=deque)
    latest: dict[str, str] = field(default_factory=dict)  # state / metrics: only the newest matters
    tele: deque[tuple[str, str]] = field(default_factory=deque)
    skipped: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    bucket: protocol.TokenBucket = field(default_factory=protocol.TokenBucket)
    history_bucket: protocol.TokenBucket = field(default_factory=protocol.TokenBucket)
    errors: deque[float] = field(default_factory=deque)
    internal: deque[float] = field(default_factory=deque)  # its internal errors, last 10 s
    closed: bool = False
    out_bytes: int = 0  # unread bytes in ``out``
    export_pending: bool = False  # an export answer is queued and not written yet
    abusive: bool = False  # said once: over the abuse line
    metrics_window_s: float | None = None  # its subscribe's window_s; None: Limits'

    @property
    def exempt(self) -> bool:
        """Not held to a student's per-address caps: a presenter, or this machine's loopback."""
        return self.presenter or (self.peer is not None and self.peer.own)

    def send(self, msg: dict[str, Any]) -> None:
        if not self.closed:
            self.send_text(dumps(msg))

    def send_text(self, text: str) -> None:
        """A reply already serialised (large ones are, off the event loop)."""
        if self.closed:
            return
        self.out.append(text)
        if not text.startswith(EXPORT):  # an export is one shared copy, one unread at a time
            self.out_bytes += len(text)
        self.wake.set()
        budget = self.limits.max_outbox_bytes * (8 if self.presenter else 1)
        if len(self.out) > self.limits.max_outbox or self.out_bytes > budget:
            log.warning(
                "client %s does not read its stream (%d unread, %d bytes); disconnecting",
                self.id,
                len(self.out),
                self.out_bytes,
            )
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

    def count_error(self, internal: bool = False) -> bool:
        """Record an error; True when the client has crossed the abuse line: ``abuse_errors`` in
        10 s, or ``abuse_internal`` internal errors (a message that made the server raise) in 10 s
        from this connection or, for a student, from its address (all its sockets together)."""
        over = over_line(self.errors, self.limits.abuse_errors)
        if internal:
            line = self.limits.abuse_internal
            over = over_line(self.internal, line) or over
            if self.peer is not None and not self.peer.own:
                over = over_line(self.peer.internal, line) or over
        return over

    async def writer(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.out or self.latest or self.tele:
                if self.out:
                    text = self.out.popleft()
                    if text.startswith(EXPORT):
                        self.export_pending = False
                    else:
                        self.out_bytes -= len(text)
                elif self.latest:
                    text = self.latest.pop(next(iter(self.latest)))
                else:
                    kind, text = self.tele.popleft()
                    if kind == "step":
                        text, self.skipped = (
                            f'{{"type":"step","skipped":{self.skipped},"record":{text}}}',
                            0,
                        )
                await self.ws.send(text)

    def error(
        self,
        code: str,
        message: str,
        request: int | None = None,
        ref: str | None = None,
    ) -> None:
        """A coded error to this client, counted against its abuse line (``count_error``; an
        ``internal`` one weighs as a server bug's cost)."""
        msg: dict[str, Any] = {"type": "error", "code": code, "message": message}
        if request is not None:
            msg["request"] = request
        if ref is not None:
            msg["ref"] = ref
        self.send(msg)
        if self.count_error(code == "internal") and not self.abusive:
            self.abusive = True  # one warning and one close per connection, however many follow
            log.warning(
                "client %s sent over %d bad messages (or %d that made the server fail) in 10 s; "
                "disconnecting",
                self.id,
                self.limits.abuse_errors,
                self.limits.abuse_internal,
            )
            self.closed = True
            asyncio.ensure_future(self.ws.close(1008, "too many bad messages"))


class Client(Protocol):
    """What a request's answer is delivered to: a websocket ``Connection`` or an HTTP
    ``completions.Stream``. ``open``: request id -> ``{"ref", "n", "seq"}`` while it runs."""

    open: dict[int, dict[str, Any]]
    closed: bool

    def send(self, msg: dict) -> None: ...


def deliver(conn: Client, event: Event) -> None:
    """An engine event to its client, as the protocol's token/done/error message."""
    entry = conn.open.get(event.request)
    if entry is None or conn.closed:
        return
    ref, seq = entry["ref"], entry["seq"]
    if event.kind == "token":
        if entry.get("pos"):  # told it was waiting: say it was admitted before its first token
            entry["pos"] = 0  # (the periodic queue report can miss a request that runs quickly)
            conn.send({"type": "queued", "request": seq.id, "ref": ref, "position": 0})
        conn.send(
            {
                "type": "token",
                "request": seq.id,
                "ref": ref,
                "text": event.text,
                "token_id": event.token_id,
                "index": entry["n"],
            }
        )
        entry["n"] += 1
        return
    del conn.open[seq.id]
    peer = getattr(conn, "peer", None)  # a websocket's address: one open request fewer
    if peer is not None:
        peer.open -= 1
    if event.kind == "error":
        conn.send(
            {
                "type": "error",
                "code": event.error_code,
                "message": event.error,
                "request": seq.id,
                "ref": ref,
            }
        )
    else:
        conn.send(
            {
                "type": "done",
                "request": seq.id,
                "ref": ref,
                "status": event.status,
                "stats": stats(seq),
            }
        )


def stats(seq: Sequence) -> dict[str, Any]:
    itl = inter_token_latencies([{"token_times": seq.token_times}])
    start = seq.admitted if seq.admitted is not None else seq.arrival
    return {
        "prompt_tokens": len(seq.prompt_ids),
        "output_tokens": len(seq.token_times),
        "queue_s": start - seq.arrival,
        "ttft_s": None if seq.first_token is None else seq.first_token - seq.arrival,
        "itl_p50_s": median(itl) if itl else None,
        "itl_max_s": max(itl) if itl else None,
        "duration_s": (seq.finished or seq.arrival) - seq.arrival,
    }


class SocketGate:
    """TCP connections to the websocket port per direct address, counted from accept on, before
    any byte of a handshake: past ``cap`` a student's address has each new one closed at once,
    so idle sockets from one address cannot hold the process's file descriptors and lock the
    class out (security review 2, M3). This machine's loopback (the page's relay, which carries
    every relayed student, and load tools) is not capped; the handshake's own per-address cap
    (``max_connections_per_address``, a coded 1013) still applies after it."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.by_ip: dict[str, int] = {}
        self.refused = 0

    def enter(self, ip: str) -> bool:
        n = self.by_ip.get(ip, 0)
        if n >= self.cap and not is_own(ip):
            if not self.refused:
                log.warning("%s holds %d sockets to the websocket port; closing new ones", ip, n)
            self.refused += 1
            return False
        self.by_ip[ip] = n + 1
        return True

    def leave(self, ip: str) -> None:
        n = self.by_ip.get(ip, 0) - 1
        if n > 0:
            self.by_ip[ip] = n
        else:
            self.by_ip.pop(ip, None)
            if not self.by_ip:
                self.refused = 0


class GatedConnection(ServerConnection):
    """The websockets server's connection, counted by a ``SocketGate`` (``gate``, set by the
    factory ``gated``) from ``connection_made`` to ``connection_lost``."""

    gate: SocketGate
    gate_ip: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        addr = ip_of(peer[0]) if peer else None
        ip = counted(addr) if addr else (str(peer[0]) if peer else "unknown")
        super().connection_made(transport)
        if self.gate.enter(ip):
            self.gate_ip = ip
        else:  # a socket's transport: asyncio types the parameter as its base class
            cast(asyncio.Transport, transport).abort()  # its fd is given back before any read

    def connection_lost(self, exc: Exception | None) -> None:
        if self.gate_ip is not None:
            self.gate.leave(self.gate_ip)
            self.gate_ip = None
        super().connection_lost(exc)


def gated(gate: SocketGate) -> Callable[..., GatedConnection]:
    """A ``create_connection`` for ``websockets.serve`` whose connections ``gate`` counts."""

    def make(*args: Any, **kwargs: Any) -> GatedConnection:
        conn = GatedConnection(*args, **kwargs)
        conn.gate = gate
        return conn

    return make
