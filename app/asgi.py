"""The page as an ASGI app: Streamlit's own server for ``streamlit_app.py`` plus the engine's
websocket relayed on the page's origin (``app/relay.py``). ``make lab`` runs this file
(``streamlit run app/asgi.py``, which finds ``app`` below); the pages are the same.

Every route of the page, Streamlit's own socket (``/_stcore/stream``) included, first checks the
``Host`` it was sent to by the engine ports' rule (``TrustedHost``, ``relay.host_ok``): a page that
DNS rebinding put on this machine's address is refused with 403 before Streamlit sees it."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run` puts app/ on the path, not the project
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.routing import WebSocketRoute  # noqa: E402

from app.relay import PATH, host_ok, relay  # noqa: E402

os.environ["FLUXO_RELAY_PATH"] = PATH  # the browser view offers the route (app/browser_view.py)


class TrustedHost:
    """ASGI middleware: an HTTP request or websocket handshake whose ``Host`` is not a name of this
    machine gets 403 (a websocket is closed before it is accepted, which the server answers 403)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        hosts = [v for k, v in scope.get("headers", ()) if k == b"host"]
        host = hosts[0].decode("latin-1") if len(hosts) == 1 else None
        if host_ok(host):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008, "reason": "forbidden_origin"})
            return
        body = b"forbidden_origin: this page answers only this machine's names (DNS rebinding)\n"
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


app = st.App(
    Path(__file__).with_name("streamlit_app.py"),
    routes=[WebSocketRoute(PATH, relay)],
    middleware=[Middleware(TrustedHost)],
)
