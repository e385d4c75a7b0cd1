"""Security review 2 (docs: ../shared/reviews/security-2.md), the server side.

H2: a lone surrogate (``"\\ud800"``, a JSON escape that is no text) in ``auth`` or a prompt, and an
integer past a float's range in ``temperature``/``top_p``, were answered ``internal`` with a full
traceback each, unmetered. Each must get its own code (``bad_field``), no traceback, and the
server must go on serving; an unexpected error that remains is logged once per kind a minute and
counts against its sender's abuse line. L1: a client forwarded through a loopback proxy never
presents on a loopback server without a token. Real servers on loopback; 127.0.0.2 and up are
students' laptops."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import pytest
from server_client import Client, url
from servers import free_port, start_engine, stop
from student_client import OTHER, post_from, student
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from engine.server import guard

HUGE = "1" + "0" * 400  # an integer JSON allows and no float holds

# Raw frames: the escapes must reach the server as written (json.dumps would refuse nothing here,
# but a raw string keeps the exact bytes a hostile client sends).
HOSTILE = {
    "auth": '{"type":"auth","token":"\\ud800","ref":"auth"}',
    "prompt": '{"type":"chat","prompt":"hi \\ud800","max_tokens":4,"ref":"prompt"}',
    "content": (
        '{"type":"chat","messages":[{"role":"user","content":"x\\udfff"}],"max_tokens":4,'
        '"ref":"content"}'
    ),
    "temperature": f'{{"type":"chat","prompt":"hi","max_tokens":4,"temperature":{HUGE},'
    '"ref":"temperature"}',
    "top_p": f'{{"type":"chat","prompt":"hi","max_tokens":4,"top_p":{HUGE},"ref":"top_p"}}',
}


@pytest.fixture(scope="module")
def engine_serve(tmp_path_factory):
    """``python -m engine.serve --model tiny`` with a presenter token (``auth`` compares it) and its
    HTTP API; yields (ws url, http url, log)."""
    tmp = tmp_path_factory.mktemp("sec2")
    http_port = free_port()
    proc, ws_url = start_engine(
        tmp, "--no-calibrate", "--http-port", str(http_port), "--token", "sec2-presenter"
    )
    log = tmp / f"engine-{ws_url.rsplit(':', 1)[1]}.log"
    for _ in range(300):  # the HTTP port opens just after the websocket's
        if "OpenAI-compatible HTTP API on" in log.read_text():
            break
        time.sleep(0.1)
    yield ws_url, f"http://127.0.0.1:{http_port}", log
    stop(proc)


def test_surrogates_and_huge_numbers_get_codes_no_traceback_and_the_class_goes_on(engine_serve):
    ws_url, http_url, log = engine_serve

    async def main():
        c = await student(ws_url)
        first = {}
        for name, raw in HOSTILE.items():  # each once: its answer
            await c.send(raw)
            first[name] = await c.until(lambda m: m["type"] in ("error", "accepted", "state"), 30)
        size = log.stat().st_size
        answers = []
        for _ in range(60):  # then 300 more from one student: the log must not grow per message
            for raw in HOSTILE.values():
                await c.send(raw)
        for _ in range(300):
            answers.append(await c.until(lambda m: m["type"] in ("error", "accepted"), 30))
        grown = log.stat().st_size - size
        await c.ws.close()
        other = await student(ws_url, OTHER)  # a classmate's chat is answered afterwards
        _, text, end, tokens = await other.chat("Hello", max_tokens=4)
        await other.ws.close()
        return first, answers, grown, (text, end, tokens)

    first, answers, grown, (text, end, tokens) = asyncio.run(main())
    for name, msg in first.items():
        assert (msg["type"], msg["code"], msg.get("ref")) == ("error", "bad_field", name), msg
    assert "surrogate" in first["auth"]["message"] and "token" in first["auth"]["message"]
    assert "temperature" in first["temperature"]["message"]
    codes = Counter(m.get("code") for m in answers)  # bad_field until the budget (L7) is spent
    assert set(codes) <= {"bad_field", "rate_limited"} and codes["bad_field"] >= 20, codes
    assert grown < 2_000, f"the log grew {grown} bytes for 300 bad messages"
    assert end["type"] == "done" and len(tokens) == 4, end

    statuses = [
        post_from(http_url, "/v1/chat/completions", body.encode())
        for body in (
            '{"messages":[{"role":"user","content":"hi \\ud800"}],"max_tokens":4}',
            f'{{"messages":[{{"role":"user","content":"hi"}}],"max_tokens":4,'
            f'"temperature":{HUGE}}}',
            f'{{"messages":[{{"role":"user","content":"hi"}}],"max_tokens":4,"top_p":{HUGE}}}',
        )
    ] + [post_from(http_url, "/v1/completions", b'{"prompt":"\\udc00 hi","max_tokens":4}')]
    for status, body in statuses:
        assert status == 400 and body["error"]["code"] == "bad_field", (status, body)
    assert statuses[0][1]["error"]["param"] == "messages"
    assert statuses[1][1]["error"]["param"] == "temperature"
    ok, body = post_from(http_url, "/v1/completions", b'{"prompt":"Hello","max_tokens":4}', OTHER)
    assert ok == 200 and body["usage"]["completion_tokens"] == 4, body
    text_log = log.read_text()
    assert "Traceback" not in text_log and "error handling" not in text_log, text_log[-3000:]


def test_an_unexpected_error_is_logged_once_and_counts_against_its_sender(serve, caplog):
    """A server bug a message can trigger (here a handler made to raise): one traceback however
    many times it fires, ``internal`` to the sender, whose address is closed past its line; a
    classmate's chat is answered."""
    server = serve("tiny")
    line = server.limits.abuse_internal

    async def bug(conn, msg):
        raise RuntimeError("a bug a message can reach")

    server.handlers["unsubscribe"] = bug  # the dispatch table's entry (Server._handler_table)

    async def main():
        c = await student(url(server))
        for _ in range(3 * line):
            await c.send({"type": "unsubscribe"})
        codes = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                msg = await c.recv(10)
                if msg["type"] == "error":
                    codes.append(msg["code"])
        await asyncio.sleep(2.5)  # the address's message budget (20/s) refills meanwhile
        again = await student(url(server))  # the same address on a new socket: closed at once
        await again.send({"type": "unsubscribe"})
        second = await again.recv(10)
        with pytest.raises(ConnectionClosed):
            await again.recv(10)
        other = await student(url(server), OTHER)
        _, _, end, tokens = await other.chat("Hello", max_tokens=4)
        await other.ws.close()
        return codes, closed.value.rcvd, second, end, tokens

    with caplog.at_level(logging.INFO, logger="fluxo.server"):
        codes, close, second, end, tokens = asyncio.run(main())
    assert set(codes) == {"internal"} and line < len(codes) <= line + 1, codes
    assert close is not None and close.code == 1008, close
    assert second["code"] == "internal"
    assert end["type"] == "done" and len(tokens) == 4
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1, [r.getMessage() for r in tracebacks]
    assert "RuntimeError" in tracebacks[0].getMessage()


def test_error_log_says_how_many_it_did_not_log(caplog):
    log = logging.getLogger("fluxo.test.errorlog")
    errors = guard.ErrorLog(log, every_s=0.3)

    def fail(n: int) -> list[bool]:
        out = []
        for _ in range(n):
            try:
                raise ValueError("the same bug")
            except ValueError as exc:
                out.append(errors.exception(exc, "a test", "c1"))
        return out

    with caplog.at_level(logging.ERROR, logger="fluxo.test.errorlog"):
        assert fail(500) == [True] + [False] * 499
        asyncio.run(asyncio.sleep(0.35))
        assert fail(1) == [True]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "499 more like it" in said[1], said


def test_a_forwarded_client_does_not_present_through_auth(serve):
    """L1: on a loopback server without a token only this machine's own clients present; one
    relayed from elsewhere (X-Forwarded-For from a loopback proxy) stays a viewer."""
    server = serve("tiny")

    async def main():
        ws = await connect(url(server), additional_headers={"X-Forwarded-For": "10.1.2.3"})
        c = Client(ws)
        hello = await c.recv(30)
        await c.send({"type": "auth", "token": "anything"})
        auth = await c.recv(10)
        await c.send({"type": "pause"})
        pause = await c.recv(10)
        await ws.close()
        return hello, auth, pause

    hello, auth, pause = asyncio.run(main())
    assert hello["role"] == "viewer"
    assert auth["code"] == "bad_token", auth
    assert pause["code"] == "forbidden", pause
    assert not server.engine.paused


def test_an_integer_past_a_float_is_not_finite():
    from engine.server import protocol

    assert not protocol.finite(10**400) and protocol.finite(10**300) and not protocol.finite(True)
    with pytest.raises(protocol.BadField):
        protocol.get_float({"t": 10**400}, "t", 0.0, 0.0, 10.0)
