"""The charts connect wherever the page loads: a browser that can reach only the page's port gets
the engine through the page's own origin (app/relay.py), and a relayed student is the same
student as a direct one: a viewer, with limits of its own address (127.0.0.2 and 127.0.0.3 play
two students on this machine)."""

from __future__ import annotations

import asyncio
import json
import re
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from servers import engine_and_page
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from app.relay import PATH, same_origin

from .browsing import ARTIFACTS, VIEW, view


@pytest.fixture(scope="module")
def relayed(tmp_path_factory):
    """An engine on loopback without a token (every own client presents) that allows one open
    request per student, and the page in front of it."""
    tmp = tmp_path_factory.mktemp("relay")
    with engine_and_page(tmp, "--max-open", "1", "--slots", "2") as urls:
        yield urls


def test_a_browser_that_reaches_only_the_page_gets_charts_and_an_answer(relayed, browser):
    from playwright.sync_api import expect

    ws_url, http_url = relayed
    engine_port = urlsplit(ws_url).port
    ctx = browser.new_context()
    blocked: list[str] = []

    def refuse(ws):  # the engine's own port is closed to this browser, as on Codespaces
        blocked.append(ws.url)
        ws.close()

    ctx.route_web_socket(re.compile(rf":{engine_port}(/|$)"), refuse)
    page = ctx.new_page()
    try:
        page.goto(http_url, wait_until="domcontentloaded")
        frame = view(page)
        box = page.frame_locator(VIEW)
        expect(box.locator("#fluxo-status-text")).to_contain_text(
            "connected to the engine as c", timeout=90_000
        )
        assert blocked, "the direct route was tried first (the page is on loopback)"
        assert frame.evaluate("() => fluxo.via") == "relay"
        # this browser is on the engine's own machine: relayed or direct, the same role (a
        # student elsewhere is a viewer: the next test)
        assert frame.evaluate("() => fluxo.role") == "presenter"
        # the sidebar says what this browser sees, not what the page process sees
        expect(
            page.get_by_text("your browser: connected through this page's address")
        ).to_be_visible(timeout=60_000)
        box.locator("#fluxo-chat-input").fill("Hello through the relay")
        box.locator("#fluxo-chat-input").press("Enter")
        expect(box.locator(".turn .meta")).to_contain_text("finished ·", timeout=90_000)
        assert frame.evaluate("() => fluxo.chats[0].tokens") > 0
        steps = frame.evaluate("() => fluxo.buffer.length")
        assert steps > 0, "step records reach the charts through the relay"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "relay-live.png"))
    finally:
        ctx.close()


async def _student(relay_url: str, origin: str, address: str):
    ws = await connect(relay_url, origin=origin, local_addr=(address, 0), max_size=None)
    hello = json.loads(await ws.recv())
    return ws, hello


async def _answer(ws, ref: str) -> dict:
    while True:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if msg.get("ref") == ref and msg["type"] in ("accepted", "error", "queued"):
            return msg


async def _two_students(http_url: str) -> tuple:
    base = http_url.replace("http://", "ws://")
    a, hello_a = await _student(base + PATH, http_url, "127.0.0.2")
    b, hello_b = await _student(base + PATH, http_url, "127.0.0.3")
    chat = {"type": "chat", "prompt": "hi", "max_tokens": 400, "ignore_eos": True}
    try:
        await a.send(json.dumps({**chat, "ref": "a1"}))
        first = await _answer(a, "a1")
        await a.send(json.dumps({**chat, "ref": "a2"}))
        second = await _answer(a, "a2")
        await b.send(json.dumps({**chat, "ref": "b1"}))
        other = await _answer(b, "b1")
    finally:
        await a.close()
        await b.close()
    return hello_a, hello_b, first, second, other


def _run(coro):
    """``asyncio.run`` in a thread of its own: the package's Playwright holds this thread's loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result(timeout=120)


def test_two_relayed_students_are_viewers_with_limits_of_their_own(relayed):
    _, http_url = relayed
    hello_a, hello_b, first, second, other = _run(_two_students(http_url))
    # the engine is on loopback with no token: its own clients present, relayed students do not
    assert hello_a["role"] == hello_b["role"] == "viewer"
    assert first["type"] in ("accepted", "queued"), first
    assert second["type"] == "error" and second["code"] == "too_many_requests", second
    assert other["type"] in ("accepted", "queued"), other  # B is not held to A's open request


def test_a_page_of_another_origin_cannot_use_the_relay(relayed):
    _, http_url = relayed
    url = http_url.replace("http://", "ws://") + PATH

    async def attempt() -> str:
        try:
            async with connect(url, origin="https://evil.example") as ws:
                await asyncio.wait_for(ws.recv(), 10)
                return "answered"
        except InvalidStatus as exc:
            return f"refused {exc.response.status_code}"
        except Exception as exc:  # noqa: BLE001 - a close before or after the handshake
            return f"closed {type(exc).__name__}"

    assert _run(attempt()) != "answered"


@pytest.mark.parametrize(
    ("origin", "host", "ok"),
    [
        ("http://127.0.0.1:8501", "127.0.0.1:8501", True),
        ("https://lab-8501.app.github.dev", "lab-8501.app.github.dev", True),
        ("https://lab-8501.app.github.dev", "lab-8501.app.github.dev:443", True),
        ("http://evil.example", "127.0.0.1:8501", False),
        ("http://127.0.0.1:9999", "127.0.0.1:8501", False),
        (None, "127.0.0.1:8501", False),
        ("null", "127.0.0.1:8501", False),
    ],
)
def test_same_origin(origin, host, ok):
    assert same_origin(origin, host) is ok
