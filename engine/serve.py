"""``python -m engine.serve``: the engine behind a websocket server (protocol: docs/protocol.md)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import signal

from engine.config import EngineConfig
from engine.engine import Engine
from engine.server import Limits, Server


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m engine.serve", description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--token", default=os.environ.get("FLUXO_TOKEN"), help="presenter token (or FLUXO_TOKEN)")
    ap.add_argument("--model", default="smollm2", help="smollm2 (bundled), tiny (random, for tests) or a local checkpoint dir")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--policy", default="continuous")
    ap.add_argument("--runner", default="sync")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--kv-blocks", type=int, default=256)
    ap.add_argument("--kv-layout", default="paged")
    ap.add_argument("--chunk-budget", type=int, default=64)
    ap.add_argument("--queue-limit", type=int, default=Limits().queue_limit)
    ap.add_argument("--max-open", type=int, default=Limits().max_open_requests, help="open requests per client")
    ap.add_argument("--rate-limit", type=float, default=Limits().max_requests_per_s, help="requests/s per client")
    ap.add_argument("--history", type=int, default=20_000, help="step records kept for late subscribers and export")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)  # not one line per connection

    token = args.token
    if token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        token = secrets.token_urlsafe(12)
        print(f"presenter token (bound to {args.host}, control needs it): {token}", flush=True)
    config = EngineConfig(model=args.model, dtype=args.dtype, policy=args.policy, runner=args.runner, max_slots=args.slots,
                          kv_blocks=args.kv_blocks, kv_layout=args.kv_layout, chunk_budget=args.chunk_budget)
    engine = Engine(config, max_telemetry_steps=args.history, max_telemetry_requests=args.history)
    limits = Limits(queue_limit=args.queue_limit, max_open_requests=args.max_open, max_requests_per_s=args.rate_limit)
    server = Server(engine, args.host, args.port, token, limits, model_name=args.model)

    async def run() -> None:
        stop = asyncio.get_running_loop().create_future()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
        await server.serve(stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
