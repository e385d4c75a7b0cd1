"""HTTP helpers of the OpenAI-compatible API tests (test_http*.py): the ``openai`` client, plain
POSTs, curl, a raw socket request, the ``/metrics`` page parsed by ``prometheus_client``, and a
wait for the engine to be idle with its KV free."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request

import openai
from prometheus_client.parser import text_string_to_metric_families
from server_client import wait_idle

from engine.server.server import Server

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.http_url + "/v1", api_key="not-checked", max_retries=0, timeout=120
    )


def post(server: Server, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        server.http_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def idle_and_free(server: Server) -> None:
    asyncio.run(wait_idle(server))
    deadline = time.monotonic() + 10
    while server.engine.blocks.num_used and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.engine.blocks.num_used == 0


def http_records(server: Server) -> list[dict]:
    return [r for r in server.engine.telemetry.snapshot()[1] if r["client"].startswith("http:")]


def curl(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run(
        ["curl", "-sS", "-N", "--max-time", "60", *args], capture_output=True, timeout=90
    )
    out.stdout, out.stderr = out.stdout.decode(), out.stderr.decode()  # bytes as sent: \r\n kept
    return out


def raw_request(port: int, body: dict, path: str = "/v1/chat/completions") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    data = json.dumps(body).encode()
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def metrics(port: int) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    return {
        f.name: {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
    }


def value(fams: dict, family: str, sample: str | None = None, **labels) -> float:
    want = tuple(sorted({"model_name": "tiny", **labels}.items()))
    return fams[family][(sample or family, want)]
