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
import json
import logging
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from server_client import Client, url
from servers import free_port, start_engine, stop
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from engine.server import guard

STUDENT, OTHER = "127.0.0.2", "127.0.0.3"
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


async def student(ws_url: str, source: str = STUDENT, **kw) -> Client:
    ws = await connect(ws_url, max_size=None, local_addr=(source, 0), **kw)
    c = Client(ws)
    assert (await c.recv(30))["type"] == "hello"
    return c


def _post(
    base: str, path: str, body: bytes, source: str = STUDENT, bearer: str | None = None
) -> tuple[int, dict]:
    """A POST from ``source`` (a student's address): (status, JSON body)."""
    auth = f"Authorization: Bearer {bearer}\r\n" if bearer else ""
    host, port = base.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0))
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{auth}Connection: close\r\n\r\n"
        ).encode()
        conn.sendall(head + body)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    finally:
        conn.close()
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1] or b"{}")


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
        assert msg["type"] == "error" and msg["code"] == "bad_field", (name, msg)
        assert msg.get("ref") == name, msg
    assert "surrogate" in first["auth"]["message"] and "token" in first["auth"]["message"]
    assert "temperature" in first["temperature"]["message"]
    assert {(m["type"], m.get("code")) for m in answers} == {("error", "bad_field")}
    assert grown < 2_000, f"the log grew {grown} bytes for 300 bad messages"
    assert end["type"] == "done" and len(tokens) == 4, end

    statuses = [
        _post(http_url, "/v1/chat/completions", body.encode())
        for body in (
            '{"messages":[{"role":"user","content":"hi \\ud800"}],"max_tokens":4}',
            f'{{"messages":[{{"role":"user","content":"hi"}}],"max_tokens":4,'
            f'"temperature":{HUGE}}}',
            f'{{"messages":[{{"role":"user","content":"hi"}}],"max_tokens":4,"top_p":{HUGE}}}',
        )
    ] + [_post(http_url, "/v1/completions", b'{"prompt":"\\udc00 hi","max_tokens":4}')]
    for status, body in statuses:
        assert status == 400 and body["error"]["code"] == "bad_field", (status, body)
    assert statuses[0][1]["error"]["param"] == "messages"
    assert statuses[1][1]["error"]["param"] == "temperature"
    ok, body = _post(http_url, "/v1/completions", b'{"prompt":"Hello","max_tokens":4}', OTHER)
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

    server._on_unsubscribe = bug  # the instance's handler: getattr(self, "_on_unsubscribe")

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


def test_distinct_wrong_http_bearers_back_off_and_then_even_the_right_one_waits(serve):
    """M1: wrong ``Authorization: Bearer`` tokens were never counted (453 guesses/s). After 5
    distinct wrong ones from an address every bearer from it is ``rate_limited``, the right one
    too (no oracle), while a client that repeats one bearer (the ``openai`` client) is never
    held."""
    token = "m1-presenter-token-0123456789"
    server = serve("tiny", token=token, http_port=0)
    base = server.http_url
    body = b'{"prompt":"ab","max_tokens":1}'

    def post(bearer: str, source: str) -> tuple[int, str]:
        status, answer = _post(base, "/v1/completions", body, source, bearer=bearer)
        return status, answer.get("error", {}).get("code", "ok")

    repeated = [post("EMPTY", OTHER) for _ in range(8)]
    guesses = [post(f"guess{i}", STUDENT) for i in range(6)]
    right = post(token, STUDENT)
    assert repeated == [(200, "ok")] * 8, repeated
    assert guesses[:5] == [(200, "ok")] * 5, guesses
    assert guesses[5] == (429, "rate_limited"), guesses
    assert right == (429, "rate_limited"), right
    assert post(token, OTHER) == (200, "ok")  # another address is not held


def _engine_with_fd_limit(tmp_path, soft: int, hard: int):
    """``engine.serve --model tiny`` started under ``ulimit -n`` (soft, hard); (process, port)."""
    import resource
    import subprocess

    port = free_port()
    log = tmp_path / "engine.log"
    env = {k: v for k, v in os.environ.items() if k != "FLUXO_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.serve", "--model", "tiny", "--no-calibrate"]
        + ["--port", str(port), "--http-port", str(free_port())],
        cwd=Path(__file__).resolve().parents[2],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**env, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
    )
    deadline = time.monotonic() + 120
    while "fluxo server on" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.1)
    return proc, port, log


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX rlimits")
def test_300_idle_sockets_from_one_address_leave_the_class_able_to_connect(tmp_path):
    """M3: under ``ulimit -n 256`` (the macOS default; hard 256 too, so raising the soft limit
    cannot help), 300 TCP connections from one address that never handshake used to take every
    file descriptor (EMFILE): another student's handshake timed out and the log filled with
    accept tracebacks. Now the address's sockets past its cap are closed at accept."""
    proc, port, log = _engine_with_fd_limit(tmp_path, 256, 256)
    idle = []
    try:
        for _ in range(300):
            s = socket.socket()
            s.bind(("127.0.7.1", 0))
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            idle.append(s)
        time.sleep(0.5)
        import psutil

        fds = psutil.Process(proc.pid).num_fds()

        async def classmate():
            c = await asyncio.wait_for(student(f"ws://127.0.0.1:{port}/", OTHER), 5)
            _, _, end, tokens = await c.chat("Hello", max_tokens=4)
            await c.ws.close()
            return end, tokens

        end, tokens = asyncio.run(classmate())
    finally:
        for s in idle:
            s.close()
        stop(proc)
    assert fds < 200, f"the engine holds {fds} file descriptors"
    assert end["type"] == "done" and len(tokens) == 4, end
    text = log.read_text()
    assert "Traceback" not in text and "Too many open files" not in text, text[-3000:]


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="reads /proc (Linux)")
def test_the_engine_raises_its_soft_open_files_limit_to_the_hard_one(tmp_path):
    proc, _, log = _engine_with_fd_limit(tmp_path, 256, 4096)
    try:
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
    finally:
        stop(proc)
    row = next(line for line in limits.splitlines() if line.startswith("Max open files"))
    assert row.split()[3:5] == ["4096", "4096"], row


def test_long_prompts_are_refused_untokenized_and_admission_comes_before_the_tokenizer(
    serve, monkeypatch
):
    """M2: HTTP tokenized every prompt on the event loop before the address's limits (20-36 ms
    per 60 KB on SmolLM2): one student pushed /health to 0.7 s. Now a prompt longer than the
    context could hold is ``prompt_too_long`` untokenized (websocket too), a student over its
    open requests is refused before its prompt is tokenized, and tokenizing runs off the loop."""
    from engine.server import http_api

    server = serve("tiny", http_port=0)
    calls: list[str] = []
    original = http_api.prompt_and_max

    def counted(engine, args):
        calls.append(threading.current_thread().name)
        return original(engine, args)

    monkeypatch.setattr(http_api, "prompt_and_max", counted)
    huge = json.dumps({"prompt": "x" * 60_000, "max_tokens": 1}).encode()
    small = b'{"prompt":"ab","max_tokens":2,"ignore_eos":true}'
    status, body = _post(server.http_url, "/v1/completions", huge)
    assert (status, body["error"]["code"]) == (400, "prompt_too_long"), body
    assert calls == [], "a 60 KB prompt was tokenized"

    limit = server.limits.max_open_requests
    server.engine.pause()
    try:
        with ThreadPoolExecutor(limit) as pool:
            held = [
                pool.submit(_post, server.http_url, "/v1/completions", small) for _ in range(limit)
            ]
            deadline = time.monotonic() + 20
            while server.engine.queue_len() < limit and time.monotonic() < deadline:
                time.sleep(0.01)
            assert server.engine.queue_len() == limit
            status, body = _post(server.http_url, "/v1/completions", small)
            assert (status, body["error"]["code"]) == (429, "too_many_requests"), body
            assert len(calls) == limit, "the refused request was tokenized first"
            server.engine.resume()
            assert [f.result(60)[0] for f in held] == [200] * limit
    finally:
        server.engine.resume()
    assert calls and all(name.startswith("fluxo-tokenize") for name in calls), calls

    submitted: list[int] = []
    submit = server.engine.submit
    monkeypatch.setattr(server.engine, "submit", lambda **kw: submitted.append(1) or submit(**kw))

    async def websocket():
        c = await student(url(server))
        await c.send({"type": "chat", "prompt": "y" * 40_000, "max_tokens": 1, "ref": "long"})
        answer = await c.until(lambda m: m.get("ref") == "long", 30)
        await c.ws.close()
        return answer

    answer = asyncio.run(websocket())
    assert answer["code"] == "prompt_too_long" and submitted == [], answer
