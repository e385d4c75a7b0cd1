"""The viewer's messages (``docs/protocol.md``): chat, cancel, subscribe, unsubscribe, auth,
export, and the ``queued`` reports of each client's waiting requests. A mixin of ``Server``.

A student's chats pass its address's limits (``Server.admit``); subscribes with history, exports
and wrong tokens have budgets per address, and long answers are serialised off the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.core.errors import UnknownRequest
from engine.server import protocol
from engine.server.connection import Connection, Limits

if TYPE_CHECKING:  # types only
    from engine.core.engine import Engine
    from engine.core.requests import RequestHandle
    from engine.server.guard import Peer, Peers


class ViewerMessages:
    # What this mixin reads of ``Server`` (engine/server/server.py sets them all in __init__).
    engine: Engine
    limits: Limits
    peers: Peers
    conns: set[Connection]
    token: str | None
    _exports: dict[str, tuple[tuple, asyncio.Future]]
    if TYPE_CHECKING:  # and the Server methods it calls

        @property
        def loopback(self) -> bool: ...

        open_request: Callable[..., RequestHandle]
        state: Callable[..., dict[str, Any]]
        broadcast_state_soon: Callable[[], None]
        _presents: Callable[[Peer, str], bool]

    # -- viewer messages ---------------------------------------------------------------------------
    async def _on_chat(self, conn: Connection, msg: dict) -> None:
        args = protocol.chat_args(msg, self.engine.config.max_new_tokens_limit)
        protocol.check_text_size(self.engine.config.max_model_len, args.messages, args.prompt)
        # an exempt client is held to its connection's own limits; a student to its address's
        handle = self.open_request(
            conn,
            args.request(conn.id),
            conn.peer,
            exempt=conn.exempt,
            presenter=conn.presenter,
            own_open=len(conn.open),
            own_bucket=conn.bucket,
            ref=args.ref,
        )
        pos = self.engine.queue_positions().get(handle.id)
        conn.open[handle.id]["pos"] = pos
        conn.send(
            {
                "type": "accepted",
                "ref": args.ref,
                "request": handle.id,
                "prompt_tokens": len(handle.seq.prompt_ids),
                "queue_position": pos,
            }
        )

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
                        conn.send(
                            {"type": "queued", "request": rid, "ref": entry["ref"], "position": pos}
                        )

    async def _on_cancel(self, conn: Connection, msg: dict) -> None:
        rid = protocol.get_int(msg, "request", None, 0, 2**63)
        if rid is None:
            raise protocol.BadField("cancel needs request (an integer id)")
        live = rid in conn.open or (
            conn.presenter and any(s.id == rid for s in self.engine.live_requests())
        )
        if not live:
            raise UnknownRequest(f"no open request {rid} of yours")
        self.engine.cancel(rid)

    async def _on_subscribe(self, conn: Connection, msg: dict) -> None:
        n = protocol.get_int(msg, "history", self.limits.history, 0, 100_000)
        if not conn.presenter:
            n = min(n, self.limits.max_history)  # a viewer's history is capped, not refused
            rate = self.limits.history_per_s
            bucket = conn.history_bucket if conn.exempt else conn.peer.history_bucket
            if n and not bucket.take(rate):
                raise protocol.RateLimited(
                    f"over {rate:g} subscribes with history a second; subscribe again shortly"
                )
        if "window_s" in msg:  # the headline's window for this connection alone (engine.lab)
            if not conn.exempt:  # each window is a summary a second: a student's costs the class
                raise protocol.Forbidden("window_s is for presenters and this machine's clients")
            conn.metrics_window_s = protocol.get_float(msg, "window_s", 30.0, 1.0, 600.0)
        steps, requests = self.engine.telemetry.snapshot()
        conn.send(self.state(conn))
        history = {
            "type": "history",
            "steps": steps[-n:] if n else [],
            "requests": requests[-n:] if n else [],
        }
        # a long history is serialised off the event loop: every other client's stream goes on
        text = await asyncio.to_thread(protocol.dumps, history) if n > 200 else None
        conn.send_text(text) if text is not None else conn.send(history)
        conn.subscribed = True
        self.broadcast_state_soon()

    async def _on_unsubscribe(self, conn: Connection, msg: dict) -> None:
        conn.subscribed = False
        conn.tele.clear()
        conn.send({"type": "ok", "of": "unsubscribe"})

    async def _on_auth(self, conn: Connection, msg: dict) -> None:
        token = protocol.get_str(msg, "token", "", 1024)
        if self.token is None and self.loopback and conn.peer.own:
            conn.presenter = True  # the single-laptop default: this machine's own clients present
        elif self.token is None:
            # a client relayed from elsewhere (X-Forwarded-For from a loopback proxy) is a student
            raise protocol.BadToken(
                "this server has no presenter token: only this machine's own clients present"
            )
        elif wait := self.peers.token_wait(conn.peer):
            raise protocol.RateLimited(
                f"too many wrong tokens from this address; try again in {wait:.1f} s"
            )
        elif token and self._presents(conn.peer, token):
            conn.presenter = True
        else:
            if not token:
                self.peers.wrong_token(conn.peer)
            raise protocol.BadToken("wrong presenter token")
        conn.send(self.state(conn))

    async def _on_export(self, conn: Connection, msg: dict) -> None:
        """The whole telemetry, once per address every ``export_interval_s`` for a student, one
        unread at a time per connection, built once per recorded state and format off the event
        loop and shared by every client that asks for the same (one copy in memory)."""
        fmt = msg.get("format", "jsonl")
        if fmt not in ("jsonl", "chrome"):
            raise protocol.BadField(f"format must be jsonl or chrome, got {protocol.show(fmt)}")
        if conn.export_pending:
            raise protocol.RateLimited("an export is still on its way to you; read it first")
        now = time.monotonic()
        if not conn.exempt:
            wait = conn.peer.export_at + self.limits.export_interval_s - now
            if wait > 0:
                raise protocol.RateLimited(
                    f"one export per address every "
                    f"{self.limits.export_interval_s:g} s; "
                    f"try again in {wait:.0f} s"
                )
            conn.peer.export_at = now
        conn.export_pending = True
        try:
            text = await self._export_text(fmt)
        except BaseException:
            conn.export_pending = False
            raise
        conn.send_text(text)

    async def _export_text(self, fmt: str) -> str:
        telemetry = self.engine.telemetry
        steps, requests = telemetry.snapshot()
        key = (
            id(steps[0]) if steps else None,
            len(steps),
            steps[-1]["step"] if steps else None,
            len(requests),
        )
        cached = self._exports.get(fmt)
        if cached is not None and cached[0] == key:
            return await asyncio.shield(cached[1])

        def build() -> str:
            data = telemetry.jsonl() if fmt == "jsonl" else telemetry.chrome_trace()
            return protocol.dumps({"type": "export", "format": fmt, "data": data})

        future = asyncio.ensure_future(asyncio.to_thread(build))
        self._exports[fmt] = (key, future)
        try:
            return await asyncio.shield(future)
        except BaseException:
            if self._exports.get(fmt, (None, None))[1] is future:
                del self._exports[fmt]
            raise
