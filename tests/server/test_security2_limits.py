"""Security review 2 (../shared/reviews/security-2.md), the per-address limits: M1 (HTTP bearer
guesses back off), M2 (long prompts cost their sender, not the event loop) and M3 (idle sockets
from one address cannot take the engine's file descriptors). Real servers on loopback; 127.0.0.2
and up are students' laptops."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from server_client import url
from servers import free_port, stop
from student_client import OTHER, STUDENT, post_from, student

from engine.server import http_api


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
        status, answer = post_from(base, "/v1/completions", body, source, bearer=bearer)
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
    import resource  # POSIX only

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
    server = serve("tiny", http_port=0)
    calls: list[str] = []
    original = http_api.prompt_and_max

    def counted(engine, args):
        calls.append(threading.current_thread().name)
        return original(engine, args)

    monkeypatch.setattr(http_api, "prompt_and_max", counted)
    huge = json.dumps({"prompt": "x" * 60_000, "max_tokens": 1}).encode()
    small = b'{"prompt":"ab","max_tokens":2,"ignore_eos":true}'
    status, body = post_from(server.http_url, "/v1/completions", huge)
    assert (status, body["error"]["code"]) == (400, "prompt_too_long"), body
    assert calls == [], "a 60 KB prompt was tokenized"

    limit = server.limits.max_open_requests
    server.engine.pause()
    try:
        with ThreadPoolExecutor(limit) as pool:
            held = [
                pool.submit(post_from, server.http_url, "/v1/completions", small)
                for _ in range(limit)
            ]
            deadline = time.monotonic() + 20
            while server.engine.queue_len() < limit and time.monotonic() < deadline:
                time.sleep(0.01)
            assert server.engine.queue_len() == limit
            status, body = post_from(server.http_url, "/v1/completions", small)
            assert (status, body["error"]["code"]) == (429, "too_many_requests"), body
            assert len(calls) == limit, "the refused request was tokenized first"
            server.engine.resume()
            assert [f.result(60)[0] for f in held] == [200] * limit
    finally:
        server.engine.resume()
    assert calls and all(name.startswith("fluxo-tokenize") for name in calls), calls


def test_a_websocket_prompt_longer_than_the_context_never_reaches_the_engine(serve, monkeypatch):
    """M2 on the websocket: the same size check, before ``Engine.submit`` tokenizes."""
    server = serve("tiny")
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
