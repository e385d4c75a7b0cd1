"""The engine's websocket relayed through the page's own origin (``/fluxo/engine``).

The browser view dials the engine's port directly (``ws://<page host>:8765``) where it can. Where
it cannot -- Codespaces or Colab (one forwarded port per host name), behind an HTTPS proxy, a
``docker run -p 8501`` with no other port, a firewall -- the page's own server relays it: the
browser opens a websocket to the page's origin, and this route opens one to the engine on
loopback and copies frames both ways until either side closes.

The relay changes nothing about who a student is. It accepts only a browser of the page's own
origin (the ``Origin`` of the request must name the ``Host`` it was sent to) sent to a ``Host``
the engine's own ports would answer (``guard.Origins.host_ok``: an address, a loopback name, a
name of this machine or of an ``FLUXO_ALLOW_ORIGINS`` origin; ``page_hosts``), so a page that
DNS rebinding put on 127.0.0.1 is refused with 403 before anything reaches the engine (a relayed
connection comes from loopback, where the browser's own address may be the teacher's). Behind a
proxy or a forwarded port under another name (Codespaces, Colab), name it in
``FLUXO_ALLOW_ORIGINS``, as the engine's ports require. It passes the browser's own address on as
``X-Forwarded-For`` (the engine believes it from a loopback proxy only, and counts limits and fair
shares under it, so two relayed students keep separate limits) and the query string (a token) as
it came; it sends no ``Origin`` of its own (in Docker the page's address on the host is not the
container's, so the engine could not judge it), and the engine makes a relayed student a viewer:
only this machine's own address may present without a token.
Measured cost: one more hop on the page's core for every frame (a step record, ~1-4 KB).
"""

from __future__ import annotations

import asyncio
import functools
import os

from starlette.websockets import WebSocket, WebSocketDisconnect

from engine.server.guard import Origins, normalize_origin

PATH = "/fluxo/engine"
DEFAULT_ENGINE_URL = "ws://127.0.0.1:8765"


@functools.cache
def page_hosts() -> Origins:
    """The names this page is served as, by the engine's own rule (``guard.Origins``): loopback
    names, Streamlit's ``server.address``, this machine's host name and interface addresses, and
    the host names of ``FLUXO_ALLOW_ORIGINS`` (a reverse proxy's or a forwarded port's name:
    Codespaces, Colab). Built once, on the first request (Streamlit's options are set by then)."""
    address, port = "", 8501
    try:
        from streamlit import config

        address = config.get_option("server.address") or ""
        port = int(config.get_option("server.port") or 8501)
    except Exception:  # noqa: BLE001 - outside Streamlit (tests): this machine's names only
        pass
    allow = os.environ.get("FLUXO_ALLOW_ORIGINS", "").split(",")
    return Origins.build(address, (port,), allow)


def host_ok(host: str | None) -> bool:
    """A browser's ``Host`` names this machine (the engine ports' own check). A browser always
    sends one: none is refused here."""
    return host is not None and page_hosts().host_ok(host)


def same_origin(origin: str | None, host: str | None) -> bool:
    """A browser's ``Origin`` names the host (and port) its request was sent to (the engine's own
    origin normalization: lower case, default ports left out)."""
    if not origin or not host:
        return False
    mine = normalize_origin(origin)
    scheme = mine.split("://", 1)[0] if mine else ""
    return mine is not None and mine == normalize_origin(f"{scheme}://{host}")


def upstream_url(query: str) -> str:
    base = os.environ.get("FLUXO_ENGINE_URL", DEFAULT_ENGINE_URL).rstrip("/")
    return f"{base}/?{query}" if query else f"{base}/"


async def relay(ws: WebSocket) -> None:
    """One browser's connection to the engine, frame for frame."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    host = ws.headers.get("host")
    if not host_ok(host) or not same_origin(ws.headers.get("origin"), host):
        await ws.close(code=1008, reason="forbidden_origin")  # before accept: a 403
        return
    client = ws.client.host if ws.client else "unknown"
    forwarded = ", ".join(x for x in (ws.headers.get("x-forwarded-for"), client) if x)
    try:
        upstream = await connect(
            upstream_url(ws.url.query),
            additional_headers={"X-Forwarded-For": forwarded},
            max_size=None,
            open_timeout=10,
        )
    except (OSError, TimeoutError, ConnectionClosed) as exc:
        await ws.close(code=1011, reason=f"engine unreachable: {type(exc).__name__}"[:120])
        return
    await ws.accept()

    async def down() -> None:  # engine -> browser
        async for frame in upstream:
            await (ws.send_text(frame) if isinstance(frame, str) else ws.send_bytes(frame))

    async def up() -> None:  # browser -> engine
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            await upstream.send(msg["text"] if msg.get("text") is not None else msg["bytes"])

    tasks = [asyncio.create_task(down()), asyncio.create_task(up())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except (ConnectionClosed, WebSocketDisconnect):
        pass
    finally:
        for t in tasks:
            t.cancel()
        await upstream.close()
        try:
            await ws.close()
        except RuntimeError:  # already closed by the browser
            pass
