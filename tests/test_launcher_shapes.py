"""`make lab` in every shape a teacher's machine gives it: unpinned (``--no-pin``), one core
(``taskset -c 0``), and the platform paths of macOS and Windows forced on Linux (no CPU-affinity
API; event loops without signal handlers, so Ctrl-C/SIGTERM go through ``signal.signal``). Each
shape must bring the engine and the page up, answer a completion, and stop both on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.servers import free_port

pytestmark = pytest.mark.slow  # make test-fast leaves it out (lesson replays, whole labs)

ROOT = Path(__file__).resolve().parents[1]

# Loaded by every Python process of the lab (launcher, engine, page) through PYTHONPATH: it takes
# away what macOS and Windows do not have, before anything imports it.
FOREIGN_PLATFORM = """
import asyncio, os
for name in ("sched_setaffinity", "sched_getaffinity"):
    if hasattr(os, name):
        delattr(os, name)
try:
    import psutil
    if hasattr(psutil.Process, "cpu_affinity"):
        del psutil.Process.cpu_affinity
except ImportError:
    pass
def _no_handlers(self, *args, **kwargs):
    raise NotImplementedError("no loop signal handlers (as on Windows)")
asyncio.AbstractEventLoop.add_signal_handler = _no_handlers
asyncio.SelectorEventLoop.add_signal_handler = _no_handlers
"""


def _foreign_env(tmp: Path) -> dict[str, str]:
    (tmp / "sitecustomize.py").write_text(FOREIGN_PLATFORM)
    return {"PYTHONPATH": os.pathsep.join([str(tmp), str(ROOT)])}


def _launch(prefix: list[str], extra: list[str], env_extra: dict[str, str], log: Path):
    eport, pport = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "FLUXO_TOKEN"}
    env.update(env_extra, PYTHONUNBUFFERED="1")
    cmd = [*prefix, sys.executable, "-m", "engine.lab", "--model", "tiny", *extra]
    cmd += ["--engine-port", str(eport), "--page-port", str(pport)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    return proc, eport, pport


def _wait_up(proc: subprocess.Popen, log: Path, timeout: float = 240) -> str:
    end = time.time() + timeout
    while time.time() < end:
        text = log.read_text()
        if "Fluxo lab is up" in text:
            return text
        if proc.poll() is not None:
            pytest.fail(f"the launcher exited with {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.3)
    proc.kill()
    pytest.fail(f"the lab did not come up within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _completion(http_port: int) -> dict:
    body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 4}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _stop_and_check(proc: subprocess.Popen, log: Path) -> str:
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the launcher did not stop on SIGTERM:\n{log.read_text()[-3000:]}")
    _, alive = psutil.wait_procs(children, timeout=20)
    for p in alive:
        p.kill()
    assert not alive, "stopping the launcher must stop the engine and the page"
    return log.read_text()


def _serves(prefix: list[str], extra: list[str], env_extra: dict[str, str], tmp: Path) -> str:
    log = tmp / "lab.log"
    proc, eport, _ = _launch(prefix, extra, env_extra, log)
    try:
        _wait_up(proc, log)
        answer = _completion(eport + 1)
        assert answer["usage"]["completion_tokens"] >= 1, answer
    finally:
        text = _stop_and_check(proc, log) if proc.poll() is None else log.read_text()
    assert "Traceback" not in text, text[-3000:]
    return text


def test_unpinned_launcher_serves(tmp_path):
    text = _serves([], ["--no-pin"], {}, tmp_path)
    assert "all cores shared" in text


@pytest.mark.skipif(
    not shutil.which("taskset") or not hasattr(os, "sched_setaffinity"),
    reason="taskset and a CPU-affinity API are needed to make a one-core machine",
)
def test_one_core_launcher_serves(tmp_path):
    text = _serves(["taskset", "-c", "0"], [], {}, tmp_path)
    assert re.search(r"engine: 1 torch thread\(s\), all cores shared", text), text[-2000:]


def test_macos_and_windows_paths_serve(tmp_path):
    """No affinity API and no loop signal handlers, in the launcher and both children."""
    text = _serves([], [], _foreign_env(tmp_path), tmp_path)
    assert "no CPU affinity" in text, text[-2000:]


def test_engine_without_loop_signal_handlers_stops_cleanly_on_sigterm(tmp_path):
    """``engine.serve`` alone on the Windows path: SIGTERM ends it with status 0 through
    ``signal.signal`` (on the real loop API path the same stop future resolves)."""
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, **_foreign_env(tmp_path), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "engine.serve", "--model", "tiny", "--port", str(port)]
    cmd += ["--threads", "1", "--no-calibrate"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        end = time.time() + 120
        while "torch thread" not in log.read_text() or not _listening(port):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.time() < end, log.read_text()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def _listening(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), 0.5):
            return True
    except OSError:
        return False
