"""``python -m engine.bench server``: what the websocket layer costs the engine and its viewers.

The server runs in the bench process on the shared weights; the clients run in a child process,
as browsers would be elsewhere, so their JSON parsing does not contend for the server's GIL.
Measured: step-to-subscriber telemetry latency (1 and 30 subscribers), the engine's decode step
time with 0 vs 30 subscribers, and request throughput with 64 chat clients.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from typing import Any

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.core.metrics import decode_only, median, percentile, step_window
from engine.server.connection import Limits
from engine.server.server import Server
from engine.workloads.canonical import CHAT_PROMPTS

Result = dict[str, Any]


# -- the child process: clients -------------------------------------------------------------------
async def _subscribe(url: str, n: int, seconds: float) -> list[float]:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    lags: list[float] = []

    async def one() -> None:
        async with connect(url, max_size=None, close_timeout=1) as ws:
            offset = json.loads(await ws.recv())["state"]["wall_offset"]
            await ws.send(json.dumps({"type": "subscribe", "history": 0}))
            end = time.time() + seconds
            while time.time() < end:
                try:
                    msg = json.loads(
                        await asyncio.wait_for(ws.recv(), max(0.01, end - time.time()))
                    )
                except (TimeoutError, ConnectionClosed):
                    break
                if msg["type"] == "step":
                    lags.append(time.time() - (msg["record"]["t_end"] + offset))

    await asyncio.gather(*(one() for _ in range(n)))
    return lags


async def _chat_load(url: str, clients: int, per_client: int, max_tokens: int) -> dict[str, float]:
    from websockets.asyncio.client import connect

    done = {"requests": 0, "tokens": 0, "errors": 0}

    async def one(i: int) -> None:
        async with connect(url, max_size=None) as ws:
            await ws.recv()
            for k in range(per_client):
                await ws.send(
                    json.dumps(
                        {
                            "type": "chat",
                            "prompt": CHAT_PROMPTS[(i + k) % len(CHAT_PROMPTS)],
                            "max_tokens": max_tokens,
                            "ignore_eos": True,
                        }
                    )
                )
            ended = 0
            while ended < per_client:
                msg = json.loads(await ws.recv())
                if msg["type"] == "done":
                    ended += 1
                    done["requests"] += 1
                    done["tokens"] += msg["stats"]["output_tokens"]
                elif msg["type"] == "error":
                    ended += 1
                    done["errors"] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(clients)))
    wall = time.perf_counter() - t0
    return {
        **done,
        "wall_s": wall,
        "requests_per_s": done["requests"] / wall,
        "tokens_per_s": done["tokens"] / wall,
    }


def _child(job: str, args: tuple, out: mp.Queue) -> None:
    out.put(asyncio.run(_subscribe(*args) if job == "subscribe" else _chat_load(*args)))


def _spawn(job: str, *args: Any) -> tuple[mp.Process, mp.Queue]:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(job, args, out), daemon=True)
    proc.start()
    return proc, out


# -- the bench ------------------------------------------------------------------------------------
def _decode_steps(engine: Engine, new_tokens: int = 64) -> list[float]:
    """Windows (s) of the decode-only steps of 8 requests decoding together."""
    start = engine.step_count
    handles = [
        engine.submit(prompt=p, max_new_tokens=new_tokens, ignore_eos=True)
        for p in CHAT_PROMPTS[:8]
    ]
    while not all(h.done for h in handles):
        time.sleep(0.01)
    return [step_window(r) for r in decode_only(engine.telemetry.steps) if r["step"] > start]


def _subscribed(srv: Server, engine: Engine, url: str, n: int) -> Result:
    """Decode step windows while ``n`` subscribers (in a child process) receive every step, and
    the lag from a step's end to its arrival at a subscriber."""
    proc, q = _spawn("subscribe", url, n, 3600.0)
    while sum(c.subscribed for c in list(srv.conns)) < n:
        time.sleep(0.05)
    steps = _decode_steps(engine)
    for conn in list(srv.conns):  # the child's clients stop when their sockets close
        conn.ws.transport.close()
    lags = q.get(timeout=120)
    proc.join(30)
    return {
        "decode_window_ms": 1000 * median(steps),
        "lag_p50_ms": 1000 * median(lags),
        "lag_p99_ms": 1000 * percentile(lags, 99),
        "messages": len(lags),
    }


def server(model, tok) -> Result:
    on = next(model.parameters()).device.type  # --device: the model was moved there
    config = EngineConfig(max_slots=32, kv_blocks=1024, device=on)
    engine = Engine(config, model=model, tokenizer=tok, max_telemetry_steps=20_000)
    limits = Limits(queue_limit=1024, max_requests_per_s=1000, max_open_requests=8)
    srv = Server(engine, "127.0.0.1", 0, None, limits)
    _, stop = srv.run_in_thread()
    url = f"ws://127.0.0.1:{srv.port}"
    runs: Result = {}
    try:
        _decode_steps(engine, 8)  # warm-up
        runs["0 subscribers"] = {"decode_window_ms": 1000 * median(_decode_steps(engine))}
        for n in (1, 30):
            runs[f"{n} subscriber{'s' * (n > 1)}"] = _subscribed(srv, engine, url, n)
        proc, q = _spawn("chat", url, 64, 5, 16)
        load = q.get(timeout=1200)
        proc.join(30)
        runs["64 chat clients"] = load
    finally:
        stop()
    step_ratio = (
        runs["30 subscribers"]["decode_window_ms"] / runs["0 subscribers"]["decode_window_ms"]
    )
    ratios = {
        "step_time_30_over_0_subscribers": step_ratio,
        "telemetry_lag_p50_ms_1": runs["1 subscriber"]["lag_p50_ms"],
        "telemetry_lag_p99_ms_1": runs["1 subscriber"]["lag_p99_ms"],
        "telemetry_lag_p50_ms_30": runs["30 subscribers"]["lag_p50_ms"],
        "telemetry_lag_p99_ms_30": runs["30 subscribers"]["lag_p99_ms"],
        "requests_per_s_64_clients": load["requests_per_s"],
    }
    return {"runs": runs, "ratios": ratios}
