"""``python -m engine.observe``: Fluxo's pages on a real vLLM (docs/observe.md).

  --start-vllm              start vLLM from .venv-vllm on the bundled model, with the observer
  --vllm http://HOST:PORT   attach to a vLLM started with the observer (the command is printed
                            by --print-vllm-command) publishing to --observer

Then serve Fluxo's websocket protocol on --port, read-only, ``hello.http_url`` naming vLLM's
OpenAI API, so the page's chat and traffic go to vLLM.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import threading
from pathlib import Path

from engine.observe import launch
from engine.observe.server import ObservedServer
from engine.observe.source import ObservedEngine
from engine.server.guard import Origins

DEFAULT_OBSERVER = "tcp://127.0.0.1:5557"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.observe", description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--start-vllm", action="store_true", help="start vLLM from .venv-vllm")
    where.add_argument("--vllm", metavar="URL", help="a running vLLM's OpenAI API")
    where.add_argument("--print-vllm-command", action="store_true", help="how to start vLLM")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765, help="the sidecar's websocket port")
    p.add_argument("--token", default=None, help="presenter token (as engine.serve)")
    p.add_argument("--observer", default=DEFAULT_OBSERVER, help="ZMQ endpoint the sidecar binds")
    p.add_argument("--vllm-port", type=int, default=8000, help="with --start-vllm: vLLM's port")
    p.add_argument("--data-parallel-size", type=int, default=1, help="vLLM's data-parallel ranks")
    p.add_argument("--max-num-seqs", type=int, default=8, help="vLLM's --max-num-seqs")
    p.add_argument("--page-port", type=int, action="append", help="the page's port (8501)")
    p.add_argument("--capture", type=Path, help="append the observer's records (JSON lines)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    page_ports = tuple(args.page_port or [8501])
    kw = dict(dp=args.data_parallel_size, max_num_seqs=args.max_num_seqs, page_ports=page_ports)
    if args.print_vllm_command:
        cmd = launch.vllm_command(args.vllm_port, **kw)
        env = f"FLUXO_OBSERVER_ADDR={args.observer} HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=2"
        print(env, shlex.join(cmd))
        return 0
    proc = None
    url = args.vllm.rstrip("/") if args.vllm else f"http://127.0.0.1:{args.vllm_port}"
    try:
        if args.start_vllm:
            proc = launch.start_vllm(args.vllm_port, args.observer, **kw)
            print(f"starting vLLM on {url} (the first start compiles, ~4 min here)", flush=True)
        launch.wait_ready(url, proc)
        about = launch.info(url)
        engine = ObservedEngine(
            args.observer, about["max_model_len"], dp=args.data_parallel_size,
            capture=args.capture, max_num_seqs=args.max_num_seqs,
        )  # fmt: skip
        origins = Origins.build(args.host, page_ports)
        server = ObservedServer(
            engine, url, about["version"], host=args.host, port=args.port,
            token=args.token, model_name=about["model"], origins=origins,
        )  # fmt: skip
        print(f"vLLM {about['version']} observed on ws://{args.host}:{args.port}", flush=True)
        threading.Thread(target=_probe, args=(engine, url, about["model"]), daemon=True).start()
        from engine.serve import _serve

        _serve(server)
    except launch.VllmUnavailable as exc:
        print(f"engine.observe: {exc.message}", file=sys.stderr)
        return 2
    finally:
        if proc is not None:
            launch.stop(proc)
    return 0


def _probe(engine: ObservedEngine, url: str, model: str) -> None:
    """Once the sidecar listens: one token per rank, so vLLM's limits are known at once."""
    if engine.bound.wait(30):
        try:
            launch.probe(url, model, n=engine.dp)
        except OSError as exc:
            logging.getLogger("fluxo.observe").warning("vLLM's limits wait for traffic: %s", exc)


if __name__ == "__main__":
    sys.exit(main())
