"""The page refuses DNS rebinding (security review 2, H1): a script on ``evil.example:<page>``,
once evil.example resolves to 127.0.0.1, sends ``Host: evil.example:<page>`` and a matching
``Origin``. The relay (``/fluxo/engine``), Streamlit's own socket and the page's HTTP routes must
answer 403, as the engine's ports do, while this machine's own names keep working. Real processes:
``engine.serve --model tiny`` and ``streamlit run app/asgi.py``; the rebinding is emulated by
dialing 127.0.0.1 with the rebound name in the URL (what the browser would send)."""

from __future__ import annotations

import asyncio
import http.client
import json

import pytest
from servers import engine_and_page
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from app.relay import PATH


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A loopback engine with no token (its own clients present) and the page in front of it;
    yields the page's port."""
    with engine_and_page(tmp_path_factory.mktemp("relay")) as (_, http_url):
        yield int(http_url.rsplit(":", 1)[1])


async def _handshake(port: int, path: str, name: str) -> tuple[str, dict | None]:
    """A websocket handshake to 127.0.0.1:``port`` as a browser on ``http://name:port`` sends it;
    ("refused", status) or ("open", first message)."""
    url = f"ws://{name}:{port}{path}"
    try:
        async with connect(
            url, host="127.0.0.1", port=port, origin=f"http://{name}:{port}", proxy=None
        ) as ws:
            first = await asyncio.wait_for(ws.recv(), 30)
            try:
                return "open", json.loads(first)
            except (TypeError, ValueError):
                return "open", {"raw": repr(first)[:80]}
    except InvalidStatus as exc:
        return "refused", {"status": exc.response.status_code}


def _get(port: int, host: str, path: str = "/") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_rebound_host_is_refused_by_the_relay(page):
    got = asyncio.run(_handshake(page, PATH, "evil.example"))
    assert got == ("refused", {"status": 403}), got


def test_the_relay_still_serves_this_machines_own_names(page):
    for name in ("127.0.0.1", "localhost"):
        kind, hello = asyncio.run(_handshake(page, PATH, name))
        assert kind == "open" and hello["type"] == "hello", (name, hello)
        assert hello["role"] == "presenter", (name, hello)  # the teacher's own browser


def test_streamlits_own_socket_refuses_a_rebound_host(page):
    got = asyncio.run(_handshake(page, "/_stcore/stream", "evil.example"))
    assert got == ("refused", {"status": 403}), got


def test_the_pages_http_routes_refuse_a_rebound_host(page):
    assert _get(page, f"evil.example:{page}") == 403
    assert _get(page, f"evil.example:{page}", "/_stcore/health") == 403
    assert _get(page, f"127.0.0.1:{page}") == 200
    assert _get(page, f"localhost:{page}", "/_stcore/health") == 200
