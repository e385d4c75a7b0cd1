"""``python -m engine.lab``: start the engine server and the lab page together, on any OS.

What it decides for a classroom:

- **Cores.** When the engine, the page and a local browser share one machine, the engine gets its
  own cores and as many torch threads (``engine/core/cpu.py``: one core of 2-7 -- two from 8 up --
  is left to the page and the browser). Measured on the project's 2-core machine: one open Live page
  made engine steps ~4x slower when all three shared both cores. ``--no-pin`` shares everything;
  ``engine.serve`` alone always keeps every core.
- **Safety.** The engine listens on the same address as the page, because every browser talks
  to it directly (each browser session is a client of its own). Whenever that address is beyond
  loopback, a presenter token is required: the one given (``--token`` / ``FLUXO_TOKEN``) or one
  generated and printed here. Students are viewers; the presenter types the token in the page.

Environment (for Docker and scripts): ``FLUXO_MODEL``, ``FLUXO_HOST``, ``FLUXO_ENGINE_PORT``,
``FLUXO_PAGE_PORT``, ``FLUXO_TOKEN``, ``FLUXO_DEVICE``, ``FLUXO_MAX_OPEN``, ``FLUXO_RATE_LIMIT``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from engine.core import cpu

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    ap = argparse.ArgumentParser(prog="python -m engine.lab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=env("FLUXO_MODEL", "smollm2"))
    ap.add_argument(
        "--host",
        default=env("FLUXO_HOST", "127.0.0.1"),
        help="address of the page and the engine "
        "(0.0.0.0: the class reaches them; a token is then required)",
    )
    ap.add_argument("--engine-port", type=int, default=int(env("FLUXO_ENGINE_PORT", "8765")))
    ap.add_argument("--page-port", type=int, default=int(env("FLUXO_PAGE_PORT", "8501")))
    ap.add_argument("--token", default=env("FLUXO_TOKEN") or None, help="presenter token")
    ap.add_argument(
        "--device", default=env("FLUXO_DEVICE", "cpu"), help="cpu or cuda (the engine's device)"
    )
    ap.add_argument(
        "--no-pin", action="store_true", help="share every core between engine, page and browser"
    )
    ap.add_argument(
        "--open",
        action="store_true",
        help="open the page in the default browser, started on the page's cores",
    )
    ap.add_argument(
        "--max-open",
        type=int,
        default=_env_num("FLUXO_MAX_OPEN", int),
        help="open requests per student (or FLUXO_MAX_OPEN; loopback tools and the presenter "
        "are not held to it)",
    )
    ap.add_argument(
        "--rate-limit",
        type=float,
        default=_env_num("FLUXO_RATE_LIMIT", float),
        help="requests/s per student (or FLUXO_RATE_LIMIT)",
    )
    ap.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for both to come up"
    )
    ap.add_argument(
        "--policy-file",
        action="append",
        default=[],
        help="a scheduling policy file of this machine's, passed to engine.serve (repeatable)",
    )
    return ap.parse_args(argv)


def _env_num(name: str, kind: type):
    """A number from the environment, or None (the engine's own default then applies)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a number, got {raw!r}") from None


def commands(
    args: argparse.Namespace, split: cpu.Split, token: str | None
) -> tuple[list[str], list[str]]:
    """The engine's and the page's command lines."""
    engine = [
        sys.executable,
        "-m",
        "engine.serve",
        "--model",
        args.model,
        "--host",
        args.host,
        "--port",
        str(args.engine_port),
        "--threads",
        str(split.engine_threads),
    ]
    if args.device != "cpu":
        engine += ["--device", args.device]
    if split.pinned and split.page_cpus:
        engine += ["--cpus", ",".join(map(str, split.engine_cpus))]
    # the page's origins are the ones whose browsers the engine lets in (engine/server/guard.py)
    engine += ["--page-port", str(args.page_port)]
    for flag, value in (("--max-open", args.max_open), ("--rate-limit", args.rate_limit)):
        if value is not None:
            engine += [flag, str(value)]
    for path in args.policy_file:  # absolute: engine.serve may start in another directory
        engine += ["--policy-file", str(Path(path).resolve())]
    # the token travels in the children's environment (FLUXO_TOKEN), never on a command line
    # that `ps` shows every user of the machine
    page = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "app" / "asgi.py"),  # the pages plus the relay route (app/relay.py)
        "--server.headless",
        "true",
        "--server.address",
        args.host,
        "--server.port",
        str(args.page_port),
    ]  # theme, toolbar, upload size and usage stats: app/.streamlit/config.toml
    return engine, page


def pin_child(cores: tuple[int, ...]):
    """A ``preexec_fn`` pinning the child before it starts any thread (POSIX with affinity)."""
    if not cores or not hasattr(os, "sched_setaffinity"):
        return None
    return lambda: os.sched_setaffinity(0, cores)


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:
            return r.status == 200
    except OSError:
        return False


def free_port() -> int:
    """A loopback port nothing listens on (for the lab's benchmarks and ``--live``)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_up(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), 0.5):
            return True
    except OSError:
        return False


def start(
    args: argparse.Namespace, split: cpu.Split | None = None
) -> tuple[subprocess.Popen, subprocess.Popen, str | None, cpu.Split]:
    split = split or (cpu.shared_split() if args.no_pin else cpu.lab_split())
    token = args.token
    if token is None and args.host not in LOOPBACK:
        token = secrets.token_urlsafe(12)
    engine_cmd, page_cmd = commands(args, split, token)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, FLUXO_ENGINE_URL=f"ws://127.0.0.1:{args.engine_port}", PYTHONPATH=path)
    if token:
        env["FLUXO_TOKEN"] = token
    else:
        env.pop("FLUXO_TOKEN", None)
    engine = subprocess.Popen(
        engine_cmd,
        cwd=ROOT,
        env=env,
        preexec_fn=pin_child(split.engine_cpus if split.pinned else ()),
    )
    page = subprocess.Popen(
        page_cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        preexec_fn=pin_child(split.page_cpus if split.pinned else ()),
    )
    if split.pinned and not hasattr(os, "sched_setaffinity"):  # Windows: pin after the start
        cpu.pin_process(split.page_cpus, page.pid)
    return engine, page, token, split


def wait_ready(engine: subprocess.Popen, page: subprocess.Popen, args: argparse.Namespace) -> None:
    deadline = time.monotonic() + args.timeout  # the first start converts the bundled GGUF (~20 s)
    page_health = f"http://127.0.0.1:{args.page_port}/_stcore/health"
    while time.monotonic() < deadline:
        if engine.poll() is not None:
            raise SystemExit("the engine server exited")
        if page.poll() is not None:
            raise SystemExit("the page exited")
        if engine_up(args.engine_port) and _up(page_health):
            return
        time.sleep(0.5)
    raise SystemExit("timed out waiting for the engine and the page")


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def token_line(host: str, token: str) -> str:
    """What the start says of the presenter token: where the page can be reached (loopback: this
    machine only, whatever the token; the walkthrough read "reachable beyond this machine" while
    the lab listened on 127.0.0.1)."""
    if host in LOOPBACK:
        where = "The page listens on this machine only (loopback): its browsers are viewers until"
        return f"{where} one types the presenter token  {token}"
    return (
        f"The page is reachable beyond this machine ({host}): students are viewers; the "
        f"presenter token is  {token}"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    engine, page, token, split = start(args)
    try:
        wait_ready(engine, page, args)
        shown = "localhost" if args.host in LOOPBACK or args.host == "0.0.0.0" else args.host
        print(
            f"\n  Fluxo lab is up:  http://{shown}:{args.page_port}   "
            f"(engine: ws://{shown}:{args.engine_port}, "
            f"model: {args.model})",
            flush=True,
        )
        print(f"  {split.describe()} {cpu.platform_note()}".rstrip(), flush=True)
        if token:
            print(f"  {token_line(args.host, token)}", flush=True)
        print("  Ctrl-C stops both.", flush=True)
        if args.open:
            # a browser started from here inherits the page's cores
            if split.pinned and split.page_cpus:
                cpu.pin_process(split.page_cpus)
            import webbrowser

            webbrowser.open(f"http://localhost:{args.page_port}")
        if hasattr(signal, "SIGTERM"):
            signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while engine.poll() is None and page.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        # a second Ctrl-C or SIGTERM (a terminal's, or `timeout` passing one on) must not cut
        # the stop short and leave a child running
        for name in ("SIGINT", "SIGTERM"):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)
        stop(page, engine)


if __name__ == "__main__":
    main()
