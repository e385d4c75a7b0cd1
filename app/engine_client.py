"""The page's one connection to the engine server (``docs/protocol.md``).

A background thread runs its own asyncio loop and owns the websocket: it subscribes to
telemetry, fills bounded buffers (recent step records, ended request records, the latest
``state`` and ``metrics``), keeps the token streams of the chats sent through it, and reconnects
by itself with backoff. Pages never touch the socket: they read :meth:`EngineClient.snapshot`
(copies taken under a lock) and call :meth:`request` / :meth:`chat`, which hand a message to the
loop and wait for the server's answer (or raise :class:`EngineError` with the server's code).

The messages and records it hands back (:class:`EngineError`, :class:`ChatStream`,
:class:`Snapshot`) are in ``app/engine_client_types.py``. One client per Streamlit server process
(``app/ui.py`` caches it with ``st.cache_resource``), so a classroom of browsers costs the engine
one telemetry subscriber.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
import time
from collections import OrderedDict, deque
from typing import Any

from websockets.asyncio.client import connect

from app.engine_client_types import ANSWERS, ChatStream, EngineError, Snapshot

DEFAULT_URL = "ws://127.0.0.1:8765"


class EngineClient:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        history: int = 2000,
        max_steps: int = 2000,
        max_requests: int = 2000,
    ) -> None:
        self.url = url or os.environ.get("FLUXO_ENGINE_URL", DEFAULT_URL)
        self.token = token
        self.history = history
        self._lock = threading.Lock()
        self._steps: deque[dict] = deque(maxlen=max_steps)
        self._requests: OrderedDict[int, dict] = OrderedDict()
        self._max_requests = max_requests
        self._chats: OrderedDict[str, ChatStream] = OrderedDict()
        self._people: set[int] = set()
        self._lag_ms: deque[float] = deque(maxlen=200)
        self.status = "connecting"
        self.error: str | None = None
        self.hello: dict = {}
        self.state: dict = {}
        self.metrics: dict = {}
        self.received_steps = 0
        self.skipped_steps = 0
        self._refs = itertools.count(1)
        self._waiters: list[tuple[str, set[str], asyncio.Future]] = []
        self._ws = None
        self._stop = threading.Event()
        self._ready = threading.Event()  # connected, and the subscription's history has arrived
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="fluxo-ws", daemon=True)
        self._thread.start()

    # -- the client thread ---------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        delay = 0.25
        while not self._stop.is_set():
            url = self.url + (f"/?token={self.token}" if self.token else "")
            try:
                async with connect(url, max_size=2**28, open_timeout=5, ping_interval=20) as ws:
                    self._ws = ws
                    await ws.send(json.dumps({"type": "subscribe", "history": self.history}))
                    delay = 0.25
                    async for raw in ws:
                        self._on_message(json.loads(raw))
            except Exception as exc:  # noqa: BLE001 - any failure means: reconnect
                if not self._stop.is_set():
                    with self._lock:
                        self.status, self.error = (
                            "disconnected",
                            f"{type(exc).__name__}: {exc}"[:300],
                        )
            finally:
                self._ws = None
                self._ready.clear()
                self._fail_waiters(
                    EngineError("disconnected", "the connection to the engine closed")
                )
            if self._stop.is_set():
                break
            with self._lock:
                if self.status != "disconnected":
                    self.status, self.error = "disconnected", "the engine closed the connection"
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)
            with self._lock:
                self.status = "connecting"

    def _fail_waiters(self, exc: Exception) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_exception(exc)

    def _resolve(self, msg: dict) -> None:
        kind, ref = msg["type"], msg.get("ref")
        match = next((w for w in self._waiters if ref is not None and w[0] == ref), None)
        if match is None and kind == "error" and ref is None and not msg.get("request"):
            match = self._waiters[0] if self._waiters else None
        if match is None and kind != "error":
            match = next((w for w in self._waiters if kind in w[1]), None)
        if match is None:
            return
        self._waiters.remove(match)
        fut = match[2]
        if fut.done():
            return
        if kind == "error":
            fut.set_exception(EngineError(msg.get("code", "error"), msg.get("message", "")))
        else:
            fut.set_result(msg)

    def _on_message(self, msg: dict) -> None:
        kind = msg.get("type")
        now = time.time()
        with self._lock:
            if kind == "hello":
                self.hello, self.state = msg, msg.get("state", {})
                self.status, self.error = "connected", None
            elif kind == "state":
                self.state = msg
            elif kind == "history":
                self._steps.clear()
                self._steps.extend(msg.get("steps", []))
                self._ready.set()
                for r in msg.get("requests", []):
                    self._add_request(r)
            elif kind == "step":
                rec = msg["record"]
                if self._steps and rec["step"] <= self._steps[-1]["step"]:
                    self._steps.clear()  # the engine was reset: a new run starts
                self._steps.append(rec)
                self.received_steps += 1
                self.skipped_steps += msg.get("skipped", 0)
                offset = self.state.get("wall_offset")
                if offset is not None:
                    self._lag_ms.append(1000 * (now - (rec["t_end"] + offset)))
            elif kind == "request":
                self._add_request(msg["record"])
            elif kind == "metrics":
                self.metrics = msg
            elif kind in ("accepted", "token", "done") or (
                kind == "error" and msg.get("ref") in self._chats
            ):
                self._on_chat(kind, msg, now)
        if kind in ("error", "state", "export", "compare", "ok"):
            self._resolve(msg)

    def _add_request(self, r: dict) -> None:
        self._requests[r["id"]] = r
        self._requests.move_to_end(r["id"])
        if r.get("client") not in (None, "traffic"):
            self._people.add(r["id"])
        while len(self._requests) > self._max_requests:
            self._requests.popitem(last=False)

    def _on_chat(self, kind: str, msg: dict, now: float) -> None:
        chat = self._chats.get(msg.get("ref"))
        if chat is None:
            return
        if kind == "accepted":
            chat.request, chat.status = msg["request"], "accepted"
            self._people.add(msg["request"])
        elif kind == "token":
            chat.text += msg.get("text", "")
            chat.tokens += 1
            chat.status = "streaming"
            chat.first_token_at = chat.first_token_at or now
        elif kind == "done":
            chat.status, chat.stats = msg.get("status", "finished"), msg.get("stats", {})
        else:
            chat.status, chat.error = "error", f"{msg.get('code')}: {msg.get('message')}"

    # -- the page's side -----------------------------------------------------------------------
    def _submit(self, msg: dict, expect: set[str] | None, timeout: float) -> dict | None:
        if self._ws is None:
            raise EngineError(
                "disconnected",
                f"not connected to the engine at {self.url} ({self.error or 'connecting'})",
            )

        async def go() -> dict | None:
            fut = None
            if expect is not None:
                fut = self._loop.create_future()
                self._waiters.append((msg["ref"], expect, fut))
            ws = self._ws
            if ws is None:
                raise EngineError("disconnected", "not connected to the engine")
            await ws.send(json.dumps(msg))
            return await asyncio.wait_for(fut, timeout) if fut is not None else None

        try:
            return asyncio.run_coroutine_threadsafe(go(), self._loop).result(timeout + 1)
        except TimeoutError:
            self._loop.call_soon_threadsafe(self._drop_waiter, msg["ref"])
            raise EngineError(
                "timeout", f"no answer to {msg['type']} within {timeout:.0f} s"
            ) from None

    def _drop_waiter(self, ref: str) -> None:
        self._waiters = [w for w in self._waiters if w[0] != ref]

    def request(self, type_: str, timeout: float = 10.0, **fields: Any) -> dict | None:
        """Send one message and return the server's answer (``state``, ``export``, ``compare``...);
        raises :class:`EngineError` with the server's code when it answers ``error``."""
        msg = {"type": type_, "ref": f"p{next(self._refs)}", **fields}
        return self._submit(msg, ANSWERS.get(type_), timeout)

    def chat(
        self,
        prompt: str | None = None,
        messages: list[dict] | None = None,
        max_tokens: int = 128,
        temperature: float = 0.0,
    ) -> ChatStream:
        ref = f"chat{next(self._refs)}"
        stream = ChatStream(ref=ref, prompt=prompt or (messages[-1]["content"] if messages else ""))
        with self._lock:
            self._chats[ref] = stream
            while len(self._chats) > 500:
                self._chats.popitem(last=False)
        msg: dict[str, Any] = {
            "type": "chat",
            "ref": ref,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        msg["messages" if messages is not None else "prompt"] = (
            messages if messages is not None else prompt
        )
        try:
            self._submit(msg, None, 5.0)
        except EngineError as exc:
            stream.status, stream.error = "error", str(exc)
        return stream

    def cancel(self, request: int) -> None:
        self._submit(
            {"type": "cancel", "ref": f"p{next(self._refs)}", "request": request}, None, 5.0
        )

    def chat_view(self, stream: ChatStream) -> ChatStream:
        with self._lock:
            return ChatStream(**stream.__dict__)

    def snapshot(self, steps: int | None = None) -> Snapshot:
        with self._lock:
            recs = list(self._steps) if steps is None else list(self._steps)[-steps:]
            return Snapshot(
                self.status,
                self.error,
                dict(self.hello),
                dict(self.state),
                dict(self.metrics),
                recs,
                list(self._requests.values()),
                set(self._people),
                list(self._lag_ms),
                self.received_steps,
                self.skipped_steps,
            )

    @property
    def role(self) -> str:
        with self._lock:
            return self.state.get("role") or self.hello.get("role") or "viewer"

    def wait_connected(self, timeout: float = 10.0) -> bool:
        """Wait until connected and the first telemetry (history) is in the buffers."""
        return self._ready.wait(timeout) and self._ws is not None

    def close(self) -> None:
        self._stop.set()
        ws = self._ws
        if ws is not None:
            asyncio.run_coroutine_threadsafe(ws.close(), self._loop)
        self._thread.join(timeout=5)


def local_exports(steps: list[dict], requests: list[dict]) -> tuple[str, dict]:
    """JSON lines and a Chrome trace of the page's own buffer, through engine.telemetry's exporter
    (used when the server's ``export`` is not available)."""
    from engine.core.telemetry import Telemetry

    tel = Telemetry()
    tel.steps.extend(steps)
    tel.requests.update({r["id"]: r for r in requests})
    lines = [json.dumps({"type": "step", **r}) for r in steps] + [
        json.dumps({"type": "request", **r}) for r in requests
    ]
    return "\n".join(lines) + "\n", tel.chrome_trace()
