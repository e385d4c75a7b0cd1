"""The sidecar's server (engine/observe/server.py) end to end without vLLM: the captured records
go over a real ZMQ socket into ``ObservedEngine``, out of Fluxo's own ``Server`` to a websocket
client. Read-only: every message that would drive an engine gets ``read_only``."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import websockets
import zmq

from engine.observe.launch import free_port
from engine.observe.server import DRIVING, ObservedServer
from engine.observe.source import ObservedEngine

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_0.32_rank0.jsonl"
TOKEN = "observed-sidecar-token-0123"
VLLM_URL = "http://127.0.0.1:9"  # named in hello; the sidecar itself never calls it here


def test_records_reach_a_websocket_client_and_controls_are_refused():
    addr = f"tcp://127.0.0.1:{free_port()}"
    engine = ObservedEngine(addr, max_model_len=8192)
    server = ObservedServer(engine, VLLM_URL, "0.32.0", port=0, model_name="smollm2", token=TOKEN)
    _, shutdown = server.run_in_thread()
    try:
        assert engine.bound.wait(10)
        viewer = asyncio.run(_hello(server.port))
        hello, errors, steps, requests = asyncio.run(_client(server.port, addr))
    finally:
        shutdown()
    assert viewer["role"] == "viewer"  # this machine too: nobody drives vLLM through here
    assert hello["role"] == "presenter"  # with the token: and still every control is refused
    assert hello["http_url"] == VLLM_URL and hello["server"] == "fluxo"
    observed = hello["state"]["observed"]
    assert observed["engine"] == "vllm" and observed["read_only"] is True
    assert sorted(errors) == sorted(DRIVING) and set(errors.values()) == {"read_only"}
    lines = FIXTURE.read_text().splitlines()
    assert [s["step"] for s in steps] == list(range(1, len(lines) + 1))
    assert sum(r["output_tokens"] for r in requests) == sum(
        sum(json.loads(x)["out"].values()) for x in lines
    )
    assert engine.translator.missed == 0 and engine.refused == 0
    first = json.loads(lines[0])  # the page's modes show vLLM's own limits, not a launch default
    config = server.state()["config"]
    assert config["max_slots"] == first["limits"]["max_num_seqs"]
    assert config["chunk_budget"] == first["limits"]["max_num_batched_tokens"]
    assert config["kv_blocks"] == first["kv"]["total"]


async def _hello(port: int) -> dict:
    async with websockets.connect(f"ws://127.0.0.1:{port}") as ws:
        return json.loads(await ws.recv())


async def _client(port: int, addr: str):
    """Each record is pushed once the previous one's step came back: at vLLM's pace, not in one
    burst (a burst past the subscriber buffer is down-sampled, by design: ``skipped``)."""
    lines = FIXTURE.read_text().splitlines()
    shift = time.time() - json.loads(lines[0])["t"][0]  # replayed now: inside the metrics window
    want_requests = sum(
        len(json.loads(x)["finished"]) + len(json.loads(x)["aborted"]) for x in lines
    )
    async with websockets.connect(f"ws://127.0.0.1:{port}/?token={TOKEN}") as ws:
        hello = json.loads(await ws.recv())
        for kind in DRIVING:
            await ws.send(json.dumps({"type": kind, "ref": kind, "prompt": "hi", "request": 1}))
        await ws.send(json.dumps({"type": "subscribe", "history": 0}))
        got: dict[str, list] = {
            "error": [],
            "step": [],
            "request": [],
            "metrics": [],
            "history": [],
        }
        # subscribed only once its (empty) history is back: a record pushed before that would
        # go to no subscriber (CI lost step 1 this way on a loaded machine)
        await _until(ws, got, lambda: len(got["history"]) == 1)
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.connect(addr)
        try:
            for n, line in enumerate(lines, 1):
                push.send(json.dumps(_now(json.loads(line), shift)).encode())
                await _until(ws, got, lambda n=n: len(got["step"]) == n)
            await _until(ws, got, lambda: len(got["request"]) == want_requests)
            # the server's 1 s summary over the observed records (KV waste, busy, TTFT, ...)
            await _until(ws, got, lambda: any(m["summary"]["steps"] for m in got["metrics"]))
        finally:
            push.close(0)
    errors = {m["ref"]: m["code"] for m in got["error"]}
    steps = [m["record"] for m in got["step"]]
    assert all(m["skipped"] == 0 for m in got["step"])
    return hello, errors, steps, [m["record"] for m in got["request"]]


def _now(record: dict, shift: float) -> dict:
    record["t"] = [t + shift for t in record["t"]]
    record["arrivals"] = {k: t + shift for k, t in record["arrivals"].items()}
    return record


async def _until(ws, got: dict[str, list], done, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not done():
            msg = json.loads(await ws.recv())
            if msg["type"] in got:
                got[msg["type"]].append(msg)
