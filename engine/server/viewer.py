"""The viewer's messages (``docs/protocol.md``): chat, cancel, subscribe, unsubscribe, auth,
export, and the ``queued`` reports of each client's waiting requests. A mixin of ``Server``."""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from engine.core.errors import UnknownRequest
from engine.core.sequence import Sequence
from engine.server import protocol
from engine.server.connection import Connection


class ViewerMessages:
    # -- viewer messages ---------------------------------------------------------------------------
    async def _on_chat(self, conn: Connection, msg: dict) -> None:
        args = protocol.chat_args(msg, self.engine.config.max_new_tokens_limit)
        if len(conn.open) >= self.limits.max_open_requests:
            raise protocol.TooManyRequests(
                f"this client already has {len(conn.open)} open requests (limit "
                f"{self.limits.max_open_requests})"
            )
        if not conn.take_request_token():
            raise protocol.RateLimited(
                f"over {self.limits.max_requests_per_s:g} requests/s; slow down"
            )
        if self.engine.queue_len() >= self.limits.queue_limit:
            raise protocol.Busy(
                f"the queue holds {self.limits.queue_limit} requests; try again shortly"
            )
        holder: list[Sequence] = []
        handle = self.engine.submit(
            messages=args.messages,
            prompt=args.prompt,
            max_new_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            client=conn.id,
            ignore_eos=args.ignore_eos,
            sink=lambda ev: self._from_engine(("event", conn, holder[0], ev)),
        )
        holder.append(handle.seq)
        pos = self.engine.queue_positions().get(handle.id)
        conn.open[handle.id] = {"ref": args.ref, "n": 0, "pos": pos}
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
        steps, requests = self.engine.telemetry.snapshot()
        conn.send(self.state(conn))
        conn.send(
            {
                "type": "history",
                "steps": steps[-n:] if n else [],
                "requests": requests[-n:] if n else [],
            }
        )
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
