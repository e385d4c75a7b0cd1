"""Real ``websockets`` test clients for the server tests, and the references they compare
against."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.lab import scenario, specs
from engine.server.connection import Comparison, Limits
from engine.server.server import Server


class Client:
    """A test client: JSON in and out, waits with timeouts, keeps what it skipped past."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.seen: list[dict] = []

    async def send(self, msg: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(msg if isinstance(msg, (str, bytes)) else json.dumps(msg))

    async def recv(self, timeout: float = 60) -> dict:
        msg = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.seen.append(msg)
        return msg

    async def until(self, pred: Callable[[dict], bool], timeout: float = 120) -> dict:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            msg = await self.recv(max(0.01, deadline - loop.time()))
            if pred(msg):
                return msg

    async def drain(self, quiet_s: float) -> list[dict]:
        """Everything that arrives until nothing has for ``quiet_s`` (what must *not* come, comes
        here)."""
        out = []
        while True:
            try:
                out.append(await self.recv(quiet_s))
            except TimeoutError:
                return out

    async def chat(
        self, prompt: str, max_tokens: int = 16, **extra: Any
    ) -> tuple[int, str, dict, list[dict]]:
        """One chat to its end: (request id, streamed text, terminal message, token messages)."""
        ref = extra.pop("ref", f"r{id(prompt)}-{len(self.seen)}")
        await self.send(
            {"type": "chat", "prompt": prompt, "max_tokens": max_tokens, "ref": ref, **extra}
        )
        first = await self.until(
            lambda m: m.get("ref") == ref and m["type"] in ("accepted", "error")
        )
        if first["type"] == "error":
            return -1, "", first, []
        rid = first["request"]
        tokens: list[dict] = []
        while True:
            msg = await self.until(
                lambda m: m.get("request") == rid and m["type"] in ("token", "done", "error")
            )
            if msg["type"] != "token":
                return rid, "".join(t["text"] for t in tokens), msg, tokens
            tokens.append(msg)


async def open_client(url: str, **kwargs: Any) -> Client:
    client = Client(await connect(url, max_size=None, **kwargs))
    hello = await client.recv()
    assert hello["type"] == "hello"
    return client


def url(server: Server, query: str = "") -> str:
    return f"ws://127.0.0.1:{server.port}/{query}"


def direct_greedy(engine_model, prompts: list[str], max_tokens: int) -> list[tuple[list[int], str]]:
    """The engine's own greedy answers, without the server: the reference a streamed chat must
    equal."""
    model, tok = engine_model
    engine = Engine(EngineConfig(max_slots=8, kv_blocks=256), model=model, tokenizer=tok)
    handles = [engine.submit(prompt=p, max_new_tokens=max_tokens) for p in prompts]
    engine.run_until_idle()
    return [(h.token_ids, tok.decode(h.token_ids, skip_special_tokens=True)) for h in handles]


async def wait_idle(server: Server, timeout: float = 60) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while server.engine.has_work() or server.engine.live_requests():
        if loop.time() > deadline:
            raise AssertionError("the engine did not go idle")
        await asyncio.sleep(0.02)


TINY = {"model": "tiny", "dtype": "float64", "block_size": 4}  # exact arithmetic, fast


def start_server(
    weights: tuple,
    model: str = "smollm2",
    limits: Limits | None = None,
    token: str | None = None,
    host: str = "127.0.0.1",
    http_port: int | None = None,
    calibrate: bool = False,
    **config: Any,
) -> tuple[Server, Callable[[], None]]:
    """A fresh server (fresh engine on ``weights``, 8 slots and 256 blocks unless ``config`` says
    otherwise; ``http_port=0``: the HTTP API on any free port; ``calibrate``: its cost model
    calibrated first, as ``engine.serve`` does); returns it and its stop."""
    m, tok = weights
    cfg: dict[str, Any] = {"max_slots": 8, "kv_blocks": 256, **(TINY if model == "tiny" else {})}
    cfg.update(config)
    engine = Engine(EngineConfig(**cfg), model=m, tokenizer=tok, max_telemetry_steps=5000)
    if calibrate:
        engine.calibrate()
    comparison = Comparison(scenario.compare, tuple(specs.WORKLOADS))
    server = Server(
        engine, host, 0, token, limits, model_name=model, http_port=http_port, comparison=comparison
    )
    _, stop = server.run_in_thread()
    return server, stop
