"""Start the real engine server (``python -m engine.serve``) and the real Streamlit page as
subprocesses (for the page's tests, tests/app, and the browser tests, tests/e2e)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(
        f"nothing listened on port {port} within {timeout:.0f} s:\n{log.read_text()[-3000:]}"
    )


def start_engine(tmp: Path, *args: str, model: str = "tiny") -> tuple[subprocess.Popen, str]:
    """``python -m engine.serve --model tiny`` on a free port; returns (process, ws url)."""
    port = free_port()
    log = tmp / f"engine-{port}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("FLUXO_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.serve", "--model", model, "--port", str(port), *args],
        cwd=ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    _wait_port(port, proc, 120, log)
    return proc, f"ws://127.0.0.1:{port}"


def start_streamlit(
    tmp: Path, engine_url: str, address: str = "127.0.0.1", env_extra: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """``streamlit run app/asgi.py`` (the pages and the engine relay) headless on a free port,
    listening on ``address``
    (loopback by default; ``0.0.0.0`` is a classroom); waits on /_stcore/health."""
    port = free_port()
    log = tmp / f"streamlit-{port}.log"
    env = {**os.environ, "FLUXO_ENGINE_URL": engine_url, "PYTHONUNBUFFERED": "1"}
    env.pop("FLUXO_TOKEN", None)
    env.update(env_extra or {})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            "app/asgi.py",  # as make lab starts it: the pages and the relay
            "--server.headless",
            "true",
            "--server.address",
            address,
            "--server.port",
            str(port),
        ],  # theme, toolbar, upload size, usage stats: app/.streamlit/config.toml
        cwd=ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    end = time.time() + 60
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(
                f"streamlit exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"streamlit not healthy within 60 s:\n{log.read_text()[-3000:]}")


@contextmanager
def engine_and_page(tmp: Path, *engine_args: str) -> Iterator[tuple[str, str]]:
    """``start_engine`` (tiny) and the page in front of it; yields (engine ws url, page http url)
    and stops both after, the engine too when the page fails to start."""
    engine, ws_url = start_engine(tmp, *engine_args)
    try:
        page, http_url = start_streamlit(tmp, ws_url)
    except Exception:
        stop(engine)
        raise
    try:
        yield ws_url, http_url
    finally:
        stop(page)
        stop(engine)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def settled_step(probe, quiet_s: float = 1.5) -> int:
    """The engine's step count once it has not moved for ``quiet_s`` (a paused engine: a step in
    flight when Pause came still lands)."""
    last, since = probe.state["step"], time.time()
    while time.time() - since < quiet_s:
        time.sleep(0.1)
        if probe.state["step"] != last:
            last, since = probe.state["step"], time.time()
    return last
