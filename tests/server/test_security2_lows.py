"""Security review 2's lows (../shared/reviews/security-2.md), each against a real server.

L2: a ``Content-Length`` of 5,000 digits (past ``int()``'s 4,300-digit limit) dropped the
connection with a traceback: it is a 413 now. L5: a bare LF inside a header value was kept, and an
Origin holding one was echoed into ``Access-Control-Allow-Origin``: a header line holding CR, LF or
NUL is a 400. L3: SIGTERM closed websockets and cut SSE streams with no word: every request in
flight now ends with ``shutting_down`` (an ``error`` message; an SSE error event and ``[DONE]``; a
whole answer's 503)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading

from server_client import url
from servers import free_port, start_engine, stop
from student_client import STUDENT, post_from, student

from engine.server import guard


def _raw(port: int, data: bytes, wait_s: float = 10.0) -> bytes:
    """``data`` sent as it is from a student's address; every byte answered until the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return answer


def test_a_huge_content_length_and_a_bare_lf_in_a_header_get_codes(serve, caplog):
    server = serve("tiny", http_port=0)
    port = int(server.http_url.rsplit(":", 1)[1])
    huge = "9" * 5000
    head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {huge}\r\n\r\n"
    answer = _raw(port, head.encode())
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"5000 digits" in answer, answer[-300:]
    for line in ("X-Note: a\nInjected: yes", "Origin: http://127.0.0.1\nSet-Cookie: x=1"):
        head = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n{line}\r\nConnection: close\r\n\r\n"
        answer = _raw(port, head.encode())
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
        assert b"CR, LF or NUL" in answer and b"Set-Cookie: x" not in answer.split(b"\r\n\r\n")[0]
    assert "Traceback" not in caplog.text
    ok = _raw(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200"), ok[:200]


def _sse(http_url: str, out: dict) -> None:
    host, port = http_url.removeprefix("http://").split(":")
    body = json.dumps(
        {"prompt": "Hello", "max_tokens": 200, "ignore_eos": True, "stream": True}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    s = socket.create_connection((host, int(port)), timeout=30, source_address=(STUDENT, 0))
    s.sendall(head + body)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
        out["started"] = b'"text"' in data
    s.close()
    out["sse"] = data


def test_sigterm_tells_every_request_in_flight(tmp_path):
    http_port = free_port()
    # 40 ms of simulated host work a step: 200 tokens take 8 s, so all three are still running
    proc, ws_url = start_engine(tmp_path, "--http-port", str(http_port), "--host-work-ms", "40")
    http_url = f"http://127.0.0.1:{http_port}"
    out: dict = {}
    whole = {}
    sse = threading.Thread(target=_sse, args=(http_url, out))
    body = b'{"prompt":"Hello","max_tokens":200,"ignore_eos":true}'
    answer = threading.Thread(
        target=lambda: whole.update(r=post_from(http_url, "/v1/completions", body))
    )

    async def main():
        c = await student(ws_url)
        await c.send(json.dumps({"type": "chat", "prompt": "Hi", "max_tokens": 200,
                                 "ignore_eos": True, "ref": "ws"}))  # fmt: skip
        await c.until(lambda m: m["type"] == "token", 60)
        sse.start()
        answer.start()
        for _ in range(600):  # all three running
            if out.get("started"):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        return await c.until(lambda m: m["type"] in ("error", "done"), 30)

    try:
        ended = asyncio.run(main())
        sse.join(30)
        answer.join(30)
        code = proc.wait(30)
    finally:
        stop(proc)
    assert ended["type"] == "error" and ended["code"] == "shutting_down", ended
    assert b'"code":"shutting_down"' in out["sse"].replace(b" ", b""), out["sse"][-400:]
    said = out["sse"].replace(b" ", b"")
    assert said.index(b"shutting_down") < said.index(b"data:[DONE]"), out["sse"][-300:]
    status, error = whole["r"]
    assert status == 503 and error["error"]["code"] == "shutting_down", whole
    assert code == 0
    log = (tmp_path / f"engine-{ws_url.rsplit(':', 1)[1]}.log").read_text()
    assert "Traceback" not in log, log[-2000:]


def test_every_message_of_a_student_is_budgeted_per_address(serve):
    """L7: unsubscribe (and subscribe with history 0) were unbudgeted; now 20 messages a second
    per address, across its sockets (a burst of 40), then ``rate_limited``, and the student is
    answered again a moment later."""
    server = serve("tiny")

    async def flood() -> tuple[int, int, dict]:
        a, b = await student(url(server)), await student(url(server))
        for c in (a, b):
            for _ in range(40):
                await c.send({"type": "unsubscribe"})
        answers = [m for c in (a, b) for m in await c.drain(0.5)]
        ok = sum(m["type"] == "ok" for m in answers)
        limited = sum(m.get("code") == "rate_limited" for m in answers)
        await asyncio.sleep(1.0)
        await a.send({"type": "unsubscribe"})
        return ok, limited, await a.recv(10)

    ok, limited, later = asyncio.run(flood())
    assert 40 <= ok <= 50 and ok + limited == 80, (ok, limited)  # one bucket for both sockets
    assert later == {"type": "ok", "of": "unsubscribe"}


def test_ipv6_addresses_count_by_their_64():
    """L9: a student's /64 holds 2**64 addresses; each was a new student with fresh caps."""
    one = guard.peer_key("2001:db8:1:2::5", None)
    assert one == guard.peer_key("2001:db8:1:2:ffff:1:2:3", None) == "2001:db8:1:2::/64"
    assert guard.peer_key("2001:db8:1:3::5", None) != one
    assert guard.peer_key("::1", "2001:db8:1:2::77") == one  # forwarded by a local proxy
    assert guard.peer_key("::1", None) == "::1" and guard.is_own("::1")
    assert guard.peer_key("::ffff:10.0.0.7", None) == "10.0.0.7"
