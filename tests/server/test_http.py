"""The OpenAI-compatible HTTP API with real clients on a real loopback server: the ``openai``
package (streaming and not) against the websocket's greedy answer, 32 concurrent streams,
disconnects, and the health check. The raw event stream and stop strings:
test_http_stream.py; the Prometheus page: test_http_metrics.py."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import openai
import pytest
from http_client import CHAT, client, http_records, idle_and_free, raw_request
from server_client import open_client, url

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.server.connection import Limits
from engine.server.http_api import HttpApi
from engine.server.server import Server


@pytest.mark.model  # SmolLM2
def test_openai_client_streamed_and_whole_answers_equal_the_websocket_greedy_answer(serve):
    server = serve("smollm2", http_port=0)

    async def ws_chat():
        c = await open_client(url(server))
        hello = c.seen[0]
        rid, text, done, tokens = await c.chat(CHAT[0]["content"], 16, ref="ws")
        return hello, text, done, tokens

    hello, ws_text, ws_done, ws_tokens = asyncio.run(ws_chat())
    assert hello["http_url"] == server.http_url
    assert ws_done["status"] == "finished" and "Paris" in ws_text
    api = client(server)
    whole = api.chat.completions.create(
        model="smollm2", messages=CHAT, max_tokens=16, temperature=0
    )
    deltas, finishes, usage = [], [], None
    for chunk in api.chat.completions.create(
        model="smollm2",
        messages=CHAT,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            deltas.append(choice.delta.content or "")
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    n_ws = ws_done["stats"]["output_tokens"]
    finish = "length" if n_ws == 16 else "stop"
    assert "".join(deltas) == ws_text == whole.choices[0].message.content
    assert finishes == [finish] == [whole.choices[0].finish_reason]
    assert usage.completion_tokens == whole.usage.completion_tokens == n_ws == len(ws_tokens)
    assert usage.prompt_tokens == whole.usage.prompt_tokens == ws_done["stats"]["prompt_tokens"]
    # The same engine and telemetry as websocket chats, tagged by peer.
    records = http_records(server)
    assert len(records) == 2 and {r["client"] for r in records} == {"http:local"}
    assert all(r["status"] == "finished" and r["output_tokens"] == n_ws for r in records)
    models = api.models.list()
    assert [m.id for m in models.data] == ["smollm2"]


def test_32_concurrent_streaming_clients_finish_exactly_once_and_kv_is_free(serve):
    server = serve(
        "tiny",
        http_port=0,
        max_slots=16,
        kv_blocks=512,
        limits=Limits(max_open_requests=64, max_requests_per_s=1000, queue_limit=256),
    )
    t0 = time.perf_counter()
    results = asyncio.run(_concurrent_streams(server, 32))
    elapsed = time.perf_counter() - t0
    assert len({rid for rid, *_ in results}) == 32
    assert all(finishes == ["length"] and n == 10 for _, finishes, _, n in results)
    idle_and_free(server)
    records = http_records(server)
    assert len(records) == 32 and all(
        r["status"] == "finished" and r["output_tokens"] == 10 for r in records
    )
    steps = server.engine.telemetry.snapshot()[0]
    # really concurrent
    assert max(sum(s["request"] is not None for s in st["slots"]) for st in steps) > 8
    print(f"\n32 streams of 10 tokens in {elapsed:.2f} s")


async def _concurrent_streams(server: Server, n: int) -> list[tuple[str, list[str], str, int]]:
    api = openai.AsyncOpenAI(
        base_url=server.http_url + "/v1", api_key="x", max_retries=0, timeout=120
    )
    try:
        return await asyncio.gather(*(_stream_one(api, i) for i in range(n)))
    finally:
        await api.close()


async def _stream_one(api: openai.AsyncOpenAI, i: int) -> tuple[str, list[str], str, int]:
    """One streamed chat of 10 tokens: its id (one for all chunks), finish reasons, text and
    completion tokens."""
    stream = await api.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": f"question {i}"}],
        max_tokens=10,
        temperature=0.7,
        seed=i,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    ids, finishes, text, usage = set(), [], [], None
    async for chunk in stream:
        ids.add(chunk.id)
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert len(ids) == 1
    return ids.pop(), finishes, "".join(text), usage.completion_tokens


def test_a_closed_connection_cancels_its_request_and_frees_kv(serve):
    server = serve("tiny", http_port=0, kv_blocks=512)
    port = int(server.http_url.rsplit(":", 1)[1])
    body = {"messages": CHAT, "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    sock = raw_request(port, {**body, "stream": True})
    seen = b""
    while seen.count(b"data: ") < 4:  # the role chunk and three tokens
        seen += sock.recv(4096)
    assert server.engine.blocks.num_used > 0
    sock.close()
    idle_and_free(server)
    # Not streaming: the client gives up before the answer.
    sock = raw_request(port, body)
    deadline = time.monotonic() + 30
    while (
        not any(s.token_times for s in server.engine.live_requests())
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)  # generating, the answer far from done
    sock.close()
    idle_and_free(server)
    records = http_records(server)
    assert [r["status"] for r in records] == ["cancelled", "cancelled"]
    assert all(0 < r["output_tokens"] < 400 for r in records)


def test_health_ok_while_serving_and_503_before_the_server_is_up(serve, tiny):
    server = serve("tiny", http_port=0)
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10) as r:
        assert r.status == 200 and json.loads(r.read())["status"] == "ok"
    model, tok = tiny
    engine = Engine(
        EngineConfig(model="tiny", dtype="float64", max_slots=2, kv_blocks=16, block_size=4),
        model=model,
        tokenizer=tok,
    )
    not_started = Server(engine, "127.0.0.1", 0, None, model_name="tiny")
    reply = HttpApi(not_started).health()
    assert reply.status == 503 and json.loads(reply.body)["status"] == "loading"
