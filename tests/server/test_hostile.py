"""A hostile classroom (docs/protocol.md, "Origins and fairness"): a page of another origin, a
student who floods, one who never reads, one who trickles a body, one who guesses tokens; every
probe against a real server on loopback, each bounded in time. 127.0.0.1 is this machine (the
page, the teacher's browser, load tools); 127.0.0.2 and up stand for students' laptops."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from server_client import Client, url
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from engine.server import guard
from engine.server.connection import Limits

ROOT = Path(__file__).resolve().parents[2]
STUDENT, OTHER = "127.0.0.2", "127.0.0.3"
TOKEN = "t0k-classroom"
PAUSED_CHAT = {"type": "chat", "prompt": "hi", "max_tokens": 64, "ignore_eos": True}


async def student(server, source: str = STUDENT, query: str = "", **kw) -> Client:
    """A websocket client from ``source`` (a loopback address of its own)."""
    ws = await connect(url(server, query), max_size=None, local_addr=(source, 0), **kw)
    c = Client(ws)
    assert (await c.recv(30))["type"] == "hello"
    return c


def handshake(port: int, headers: dict[str, str]) -> tuple[int, dict]:
    """A raw websocket handshake with exactly these headers: (status, JSON body or {})."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        "GET / HTTP/1.1",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        length = int(re.search(rb"Content-Length: (\d+)", head).group(1)) if status != 101 else 0
        while len(body) < length:
            body += s.recv(65536)
    return status, json.loads(body) if length else {}


def http(server, method: str, path: str, body: dict | None = None, headers=None, source=None):
    """One HTTP request on the API port: (status, headers, JSON body)."""
    port = int(server.http_url.rsplit(":", 1)[1])
    data = json.dumps(body).encode() if body is not None else b""
    head = [f"{method} {path} HTTP/1.1", "Connection: close", f"Content-Length: {len(data)}"]
    head += [f"{k}: {v}" for k, v in (headers or {"Host": "127.0.0.1"}).items()]
    with socket.create_connection(
        ("127.0.0.1", port), timeout=30, source_address=(source or "127.0.0.1", 0)
    ) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head_text, _, payload = raw.partition(b"\r\n\r\n")
    lines = head_text.decode("latin-1").split("\r\n")
    hdrs = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), hdrs, json.loads(payload) if payload else {}


# -- H1: origins and Host ------------------------------------------------------------------------
def test_a_page_of_another_origin_or_host_is_refused_and_the_lab_page_presents(serve):
    server = serve("tiny", http_port=0)  # loopback, no token: the single-laptop default
    port = server.port
    for headers in (
        {"Host": f"127.0.0.1:{port}", "Origin": "https://evil.example"},
        {"Host": f"evil.example:{port}"},  # DNS rebinding: no Origin, a name not this machine's
        {"Host": f"127.0.0.1:{port}", "Origin": "null"},
        {"Host": f"127.0.0.1:{port}", "Origin": "http://192.0.2.7:8501"},  # not this machine
    ):
        status, body = handshake(port, headers)
        assert status == 403 and body["error"]["code"] == "forbidden_origin", (headers, body)
    for headers in (
        {"Host": f"127.0.0.1:{port}"},  # the page's own Python client: no Origin
        {"Host": f"localhost:{port}", "Origin": "http://localhost:8501"},
        {"Host": f"127.0.0.1:{port}", "Origin": "http://127.0.0.1:43117"},  # a loopback page
    ):
        assert handshake(port, headers)[0] == 101, headers

    async def main():
        async with connect(url(server), origin="https://evil.example") as ws:
            await ws.recv()

    with pytest.raises(InvalidStatus) as refused:
        asyncio.run(main())
    assert refused.value.response.status_code == 403

    async def page():  # the browser component of a page served on this machine
        ws = await connect(url(server), origin="http://localhost:8501")
        hello = json.loads(await ws.recv())
        await ws.close()
        return hello["role"]

    assert asyncio.run(page()) == "presenter"
    # The HTTP port: no wildcard CORS; a forged Origin or Host is refused before any work.
    status, hdrs, body = http(
        server,
        "POST",
        "/v1/completions",
        {"prompt": "hi", "max_tokens": 2},
        {"Host": "127.0.0.1", "Origin": "https://evil.example", "Content-Type": "text/plain"},
    )
    assert status == 403 and body["error"]["code"] == "forbidden_origin"
    assert "access-control-allow-origin" not in hdrs
    status, hdrs, _ = http(server, "GET", "/metrics", headers={"Host": "attacker.example"})
    assert status == 403
    status, hdrs, body = http(
        server, "GET", "/health", headers={"Host": "127.0.0.1", "Origin": "http://localhost:8501"}
    )
    assert status == 200 and hdrs["access-control-allow-origin"] == "http://localhost:8501"
    status, hdrs, _ = http(server, "GET", "/health")
    assert status == 200 and "access-control-allow-origin" not in hdrs
    assert server.engine.step_count == 0 and not server.engine.paused  # nothing was obeyed


def test_origin_rules():
    o = guard.Origins.build("0.0.0.0", [8501], ["https://lab.school.example"])
    assert o.origin_ok(None, "192.168.1.10:8765")  # not a browser
    assert o.origin_ok("https://lab.school.example", "lab.school.example")
    assert o.origin_ok("http://192.168.1.10:8501", "192.168.1.10:8765")  # the page on that host
    assert not o.origin_ok("http://192.168.1.10:9999", "192.168.1.10:8765")  # another service
    assert not o.origin_ok("http://6.6.6.6:8501", "192.168.1.10:8765")
    assert not o.origin_ok("https://evil.example", "192.168.1.10:8765")
    assert o.host_ok("192.168.1.10:8765") and o.host_ok("localhost") and o.host_ok(None)
    assert o.host_ok("lab.school.example") and not o.host_ok("evil.example:8765")
    # X-Forwarded-For is believed from a proxy on this machine only
    assert guard.peer_key("127.0.0.1", "10.0.0.9, 10.1.2.3") == "10.1.2.3"
    assert guard.peer_key("192.168.1.5", "127.0.0.1") == "192.168.1.5"
    assert guard.is_own("127.0.0.1") and guard.is_own("::1") and not guard.is_own(STUDENT)


# -- H2: fairness per address --------------------------------------------------------------------
def test_a_66_socket_flood_cannot_take_the_queue_from_another_student(serve):
    server = serve("tiny", token=TOKEN, limits=Limits(queue_limit=256))

    async def main():
        ctl = await student(server, "127.0.0.1", f"?token={TOKEN}")
        await ctl.send({"type": "pause"})
        await ctl.until(lambda m: m["type"] == "state" and m["paused"], 30)
        # this machine's loopback, as viewers: 66 sockets x 4 chats
        flood = await asyncio.gather(*(student(server, "127.0.0.1") for _ in range(66)))
        t0 = time.monotonic()
        for c in flood:
            for k in range(4):
                await c.send({**PAUSED_CHAT, "ref": f"f{k}"})
        answers = [
            await c.until(lambda m: m.get("ref", "").startswith("f"), 30)
            for c in flood
            for _ in range(4)
        ]
        kinds = [a.get("code", a["type"]) for a in answers]
        # a student floods too: 16 connections at most, 4 open requests at most
        mine = [await student(server, OTHER) for _ in range(16)]
        extra = Client(await connect(url(server), local_addr=(OTHER, 0)))
        refused = await extra.recv(10)  # the 17th: told why, then closed
        with pytest.raises(ConnectionClosed) as cut:
            await extra.recv(10)
        assert refused["type"] == "error" and refused["code"] == "too_many_connections"
        for k in range(6):
            await mine[k % 2].send({**PAUSED_CHAT, "ref": f"o{k}"})
        theirs = [
            await mine[k % 2].until(lambda m, ref=f"o{k}": m.get("ref") == ref, 30)
            for k in range(6)
        ]
        # the other student is still served
        other = await student(server, STUDENT)
        await other.send({**PAUSED_CHAT, "ref": "mine"})
        served = await other.until(lambda m: m.get("ref") == "mine", 30)
        took = time.monotonic() - t0
        await ctl.send({"type": "reset"})
        await ctl.until(lambda m: m["type"] == "state" and not m["paused"], 60)
        return kinds, cut.value, theirs, served, took

    kinds, cut, theirs, served, took = asyncio.run(main())
    assert kinds.count("accepted") == 128 and set(kinds) == {"accepted", "fair_share"}, kinds
    assert cut.rcvd is not None and cut.rcvd.code == 1013
    theirs = sorted(t.get("code", t["type"]) for t in theirs)  # two sockets: any order
    assert theirs == ["accepted"] * 4 + ["too_many_requests"] * 2
    assert served["type"] == "accepted", served
    assert took < 60


def test_a_bearer_token_is_exempt_and_refusals_say_retry_after(serve):
    server = serve(
        "tiny",
        token=TOKEN,
        http_port=0,
        max_slots=2,
        limits=Limits(max_open_requests=1, max_requests_per_s=100),
    )
    body = {"prompt": "ab", "max_tokens": 2, "ignore_eos": True}
    auth = {"Host": "127.0.0.1", "Authorization": f"Bearer {TOKEN}"}
    results: list = []

    def one(headers=None):
        results.append(http(server, "POST", "/v1/completions", body, headers, source=STUDENT))

    server.engine.pause()
    try:
        first = threading.Thread(target=one)  # the student keeps one request open
        first.start()
        deadline = time.monotonic() + 10
        while server.engine.queue_len() < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        status, hdrs, err = http(server, "POST", "/v1/completions", body, source=STUDENT)
        assert status == 429 and err["error"]["code"] == "too_many_requests"
        assert hdrs["retry-after"] == "1"
        # with the presenter's bearer token the same address is not held to a student's caps
        workers = [threading.Thread(target=one, args=(auth,)) for _ in range(3)]
        for w in workers:
            w.start()
        deadline = time.monotonic() + 10
        while server.engine.queue_len() < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.engine.queue_len() == 4
    finally:
        server.engine.resume()
    for w in [first, *workers]:
        w.join(60)
    assert [r[0] for r in results] == [200] * 4


def test_32_concurrent_openai_streams_from_this_machine_all_answered(serve):
    """A load generator on the teacher's machine is not a student: default limits, 32 streams."""
    import openai

    server = serve("tiny", http_port=0, max_slots=16, kv_blocks=512)

    async def main():
        api = openai.AsyncOpenAI(
            base_url=server.http_url + "/v1", api_key="x", max_retries=0, timeout=120
        )

        async def one(i):
            stream = await api.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": f"Count to {i}."}],
                max_tokens=8,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            n = 0
            async for chunk in stream:
                n += bool(chunk.choices and chunk.choices[0].delta.content is not None)
            return n

        return await asyncio.wait_for(
            asyncio.gather(*(one(i) for i in range(32)), return_exceptions=True), 240
        )

    results = asyncio.run(main())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors and len(results) == 32, errors[:3]


def test_served_model_name_and_the_hugging_face_id(serve):
    server = serve("tiny", http_port=0)
    server.http.model_ids.add("HuggingFaceTB/SmolLM2-135M-Instruct")  # as engine.serve adds it
    ok = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for model, want in (("tiny", 200), ("HuggingFaceTB/SmolLM2-135M-Instruct", 200), ("gpt", 404)):
        assert http(server, "POST", "/v1/chat/completions", {**ok, "model": model})[0] == want


# -- H3: budgets in bytes and time -------------------------------------------------------------
def test_a_viewer_that_never_reads_exports_and_subscribes_is_bounded(serve):
    server = serve("tiny", token=TOKEN, limits=Limits(max_outbox_bytes=4 << 20))
    for k in range(40):  # some telemetry worth exporting
        server.engine.submit(prompt=f"Count to {k}.", max_new_tokens=8, ignore_eos=True)
    deadline = time.monotonic() + 60
    while (
        server.engine.has_work() or server.engine.live_requests()
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc = psutil.Process()

    async def main():
        ws = await connect(url(server), max_size=None, local_addr=(STUDENT, 0), max_queue=1)
        ws.transport.pause_reading()  # never reads again
        rss0 = proc.memory_info().rss
        for _ in range(400):
            await ws.send(json.dumps({"type": "export"}))
            await ws.send(json.dumps({"type": "subscribe", "history": 100000}))
        await asyncio.sleep(2)
        conn = next(c for c in server.conns if c.peer and c.peer.key == STUDENT)
        unread = sum(t.startswith('{"type":"export"') for t in conn.out)
        grew = proc.memory_info().rss - rss0
        health = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10) as r:
            assert r.status == 200
        health = time.monotonic() - health
        ws.transport.abort()
        return unread, conn.out_bytes, grew, health

    unread, out_bytes, grew, health = asyncio.run(main())
    assert unread <= 1 and out_bytes <= 4 << 20
    assert grew < 40 << 20, grew  # 400 unread exports grew the server 106 MB before
    assert health < 1.0


def test_a_trickled_request_is_dropped_within_its_deadline(serve):
    server = serve("tiny", http_port=0, limits=Limits(http_request_s=2.0))
    port = int(server.http_url.rsplit(":", 1)[1])
    for head in (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 40\r\n\r\n",
        b"",  # the head itself trickled
    ):
        s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(STUDENT, 0))
        t0 = time.monotonic()
        s.sendall(head or b"P")
        answer = b""
        try:
            while time.monotonic() - t0 < 8:
                s.sendall(b"x")
                s.settimeout(0.5)
                try:
                    chunk = s.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                answer += chunk
        except (BrokenPipeError, ConnectionResetError):
            pass
        took = time.monotonic() - t0
        s.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"request_timeout"' in answer and took < 6, took
    assert http(server, "GET", "/health")[0] == 200


def test_one_address_cannot_hold_every_http_connection(serve):
    server = serve("tiny", http_port=0, limits=Limits(max_http_connections_per_address=8))
    port = int(server.http_url.rsplit(":", 1)[1])
    idle = [
        socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(STUDENT, 0))
        for _ in range(8)
    ]
    time.sleep(0.3)
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(STUDENT, 0))
    answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 429") and b"too_many_connections" in answer
    assert b"Retry-After: 5" in answer
    assert http(server, "GET", "/health")[0] == 200  # everyone else is served
    assert http(server, "GET", "/health", source=OTHER)[0] == 200
    for c in idle + [s]:
        c.close()


def test_content_length_that_is_not_ascii_digits_is_a_coded_400(serve):
    server = serve("tiny", http_port=0)
    port = int(server.http_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: ²\r\n\r\n".encode()
        )
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 400") and b'"bad_request"' in answer
    assert http(server, "GET", "/health")[0] == 200


# -- M2, L2, L4, L5, L7, L8 ------------------------------------------------------------------------
def test_an_empty_token_is_no_token(serve):
    server = serve("tiny", host="127.0.0.2", token="")  # beyond "127.0.0.1": nobody presents

    async def main():
        ws = await connect(f"ws://127.0.0.2:{server.port}/", max_size=None)
        c = Client(ws)
        hello = await c.recv(30)
        await c.send({"type": "auth"})
        await c.send({"type": "auth", "token": ""})
        await c.send({"type": "pause", "ref": "p"})
        answers = [await c.until(lambda m: m["type"] in ("error", "state"), 30) for _ in range(3)]
        await ws.close()
        return hello, answers

    hello, answers = asyncio.run(main())
    assert server.token is None and hello["role"] == "viewer"
    assert [a.get("code") for a in answers] == ["bad_token", "bad_token", "forbidden"]
    assert not server.engine.paused


def test_engine_serve_with_an_empty_token_beyond_loopback_generates_one(tmp_path):
    env = {**os.environ, "FLUXO_TOKEN": "", "PYTHONUNBUFFERED": "1"}
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "engine.serve",
            "--model",
            "tiny",
            "--no-calibrate",
            "--host",
            "127.0.0.2",
            "--port",
            str(port),
            "--http-port",
            "0",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        token, deadline = None, time.time() + 120
        while token is None and time.time() < deadline and proc.poll() is None:
            m = re.search(
                r"presenter token \(bound to 127\.0\.0\.2.*\): (\S+)", proc.stdout.readline()
            )
            token = m.group(1) if m else None
        assert token and len(token) >= 16
    finally:
        proc.terminate()
        proc.wait(20)


def test_wrong_tokens_back_off_and_the_abuse_warning_is_logged_once(serve, caplog):
    server = serve("tiny", token=TOKEN, limits=Limits(abuse_errors=20))

    async def main():
        c = await student(server)
        for _ in range(8):
            await c.send({"type": "auth", "token": "guess"})
        codes = [(await c.until(lambda m: m["type"] == "error", 10))["code"] for _ in range(8)]
        await c.send({"type": "auth", "token": TOKEN})  # even the right one waits its turn
        waited = (await c.until(lambda m: m["type"] in ("error", "state"), 10)).get("code")
        bad = await student(server, OTHER)
        for _ in range(200):
            await bad.send("not json")
        with pytest.raises(ConnectionClosed):
            while True:
                await bad.recv(10)
        return codes, waited

    with caplog.at_level("WARNING", logger="fluxo.server"):
        codes, waited = asyncio.run(main())
    assert codes[:5] == ["bad_token"] * 5 and set(codes[5:]) == {"rate_limited"}, codes
    assert waited == "rate_limited"
    assert sum("bad messages" in r.getMessage() for r in caplog.records) == 1


def test_students_are_aliases_in_the_records_and_the_model_path_stays_home(serve):
    server = serve("tiny", http_port=0)
    body = {"prompt": "ab", "max_tokens": 2}
    assert http(server, "POST", "/v1/completions", body, source=STUDENT)[0] == 200
    assert http(server, "POST", "/v1/completions", body)[0] == 200
    clients = [r["client"] for r in server.engine.telemetry.snapshot()[1]]
    assert "http:local" in clients and len(clients) == 2
    alias = next(c for c in clients if c != "http:local")
    assert re.fullmatch(r"http:[0-9a-f]{6}", alias) and STUDENT not in " ".join(clients)


@pytest.mark.model  # SmolLM2
def test_kv_blocks_beyond_memory_are_refused_and_the_engine_goes_on(serve):
    server = serve()  # SmolLM2: ~0.7 MB of fp32 K and V a 16-token block
    cache = server.engine.model_runner.cache
    k = cache.k
    per_block = 2 * k.element_size() * k.shape[0] * cache.block_size * k.shape[2] * k.shape[3]
    too_many = 1 << 20  # the config's own upper bound: ~740 GiB
    assert too_many * per_block > psutil.virtual_memory().available

    async def main():
        c = await student(server, "127.0.0.1")  # loopback, no token: the presenter
        await c.send({"type": "control", "kv_blocks": too_many, "ref": "k"})
        refused = await c.until(lambda m: m.get("ref") == "k", 30)
        await c.send({"type": "control", "kv_blocks": 300, "ref": "ok"})
        grown = await c.until(lambda m: m["type"] == "state" and m["config"]["kv_blocks"] == 300)
        return refused, grown, await c.chat("Hi", 4)

    refused, grown, (_, _, done, _) = asyncio.run(main())
    assert refused["type"] == "error" and refused["code"] == "kv_over_memory", refused
    assert "GiB" in refused["message"] and done["type"] == "done"


def test_token_ids_beyond_the_vocabulary_have_their_own_code(serve):
    server = serve("tiny", http_port=0)
    status, _, err = http(
        server, "POST", "/v1/completions", {"prompt": [1, 10**6], "max_tokens": 2}
    )
    assert status == 400 and err["error"]["code"] == "invalid_token_ids"
    vocab = server.engine.model.config.vocab_size  # the first id out of range, and the last in
    status, _, err = http(server, "POST", "/v1/completions", {"prompt": [vocab], "max_tokens": 2})
    assert status == 400 and err["error"]["code"] == "invalid_token_ids"
    last = {"prompt": [vocab - 1], "max_tokens": 2}
    assert http(server, "POST", "/v1/completions", last)[0] == 200
    assert http(server, "POST", "/v1/completions", {"prompt": "ab", "max_tokens": 2})[0] == 200


def test_frames_far_over_the_limit_close_and_those_near_it_are_answered(serve):
    """What one socket may make the server buffer: frames up to 4x the message limit are read and
    answered ``message_too_large``; beyond, the connection closes (1009) before more is kept."""
    server = serve("tiny", limits=Limits(max_message_bytes=4096))

    async def main():
        c = await student(server)
        await c.send(json.dumps({"type": "chat", "prompt": "x" * 3 * 4096}))
        near = await c.until(lambda m: m["type"] == "error", 10)
        await c.send(json.dumps({"type": "chat", "prompt": "x" * 5 * 4096}))
        with pytest.raises(ConnectionClosed) as closed:
            await c.recv(10)
        return near, closed.value.rcvd

    near, rcvd = asyncio.run(main())
    assert near["code"] == "message_too_large"
    assert rcvd is not None and rcvd.code == 1009
