"""The lab launcher as a teacher runs it: on an address beyond loopback it requires a presenter
token (generated and printed), students connecting to the engine are viewers, the engine and the
page get cores of their own, and stopping the launcher stops both."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from websockets.asyncio.client import connect

from engine.core import cpu

pytestmark = pytest.mark.slow  # make test-fast leaves it out (lesson replays, whole labs)

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _role_and_pause(url: str) -> tuple[str, dict]:
    async with connect(url) as ws:
        hello = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "pause", "ref": "p"}))
        while True:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if msg.get("ref") == "p" or msg["type"] == "state":
                return hello["role"], msg


async def _origin_ok(url: str, origin: str) -> bool:
    from websockets.exceptions import InvalidStatus

    try:
        async with connect(url, origin=origin) as ws:
            return json.loads(await ws.recv())["type"] == "hello"
    except InvalidStatus:
        return False


def test_exposed_lab_requires_a_token_and_gives_the_engine_its_own_cores():
    eport, pport = _port(), _port()
    proc = _start_lab("0.0.0.0", eport, pport)
    try:
        token = _printed_token(proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{pport}/_stcore/health", timeout=10) as r:
            assert r.status == 200
        role, answer = asyncio.run(_role_and_pause(f"ws://127.0.0.1:{eport}/"))
        assert role == "viewer" and answer["type"] == "error" and answer["code"] == "forbidden"
        role, answer = asyncio.run(_role_and_pause(f"ws://127.0.0.1:{eport}/?token={token}"))
        assert role == "presenter" and answer["type"] == "state" and answer["paused"]
        # a student's browser on the page's own port is let in; one on another port is not
        name = socket.gethostname()
        assert asyncio.run(_origin_ok(f"ws://127.0.0.1:{eport}/", f"http://{name}:{pport}"))
        assert not asyncio.run(_origin_ok(f"ws://127.0.0.1:{eport}/", f"http://{name}:{pport + 1}"))
        engine, page = _engine_and_page_on_their_cores(proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("the launcher did not stop on SIGTERM")
    gone, alive = psutil.wait_procs([engine, page], timeout=20)
    assert not alive, "stopping the launcher must stop the engine and the page"


def _start_lab(host: str, eport: int, pport: int) -> subprocess.Popen:
    """``python -m engine.lab`` on the tiny model, with no FLUXO_TOKEN in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "FLUXO_TOKEN"}
    cmd = [sys.executable, "-m", "engine.lab", "--model", "tiny", "--host", host]
    cmd += ["--engine-port", str(eport), "--page-port", str(pport)]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _printed_token(proc: subprocess.Popen) -> str:
    """The presenter token the launcher prints (it generates one for an exposed address)."""
    token, lines, deadline = None, [], time.time() + 300
    while token is None and time.time() < deadline and proc.poll() is None:
        line = proc.stdout.readline()
        lines.append(line)
        m = re.search(r"presenter token is\s+(\S+)", line)
        token = m.group(1) if m else None
    assert token, "".join(lines)
    return token


def _engine_and_page_on_their_cores(proc: subprocess.Popen) -> tuple:
    """The launcher's two children, checked to sit on the cores the lab's split gives them."""
    children = psutil.Process(proc.pid).children()
    engine = next(c for c in children if "engine.serve" in " ".join(c.cmdline()))
    page = next(c for c in children if "streamlit" in " ".join(c.cmdline()))
    split = cpu.lab_split()
    if split.pinned and split.page_cpus:
        assert sorted(engine.cpu_affinity()) == list(split.engine_cpus)
        assert sorted(page.cpu_affinity()) == list(split.page_cpus)
        assert f"--threads {split.engine_threads}" in " ".join(engine.cmdline())
    return engine, page
