"""The OpenAI-compatible HTTP API with real clients on a real loopback server: the ``openai``
package (streaming and not), curl's view of the event stream, 32 concurrent streams, disconnects,
stop strings, and the Prometheus page read by ``prometheus_client``'s parser."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request

import openai
from prometheus_client.parser import text_string_to_metric_families
from server_client import open_client, url, wait_idle

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.server.http_api import HttpApi, StopCutter
from engine.server.server import Limits, Server


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.http_url + "/v1", api_key="not-checked", max_retries=0, timeout=120
    )


def post(server: Server, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        server.http_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def idle_and_free(server: Server) -> None:
    asyncio.run(wait_idle(server))
    deadline = time.monotonic() + 10
    while server.engine.blocks.num_used and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.engine.blocks.num_used == 0


def http_records(server: Server) -> list[dict]:
    return [r for r in server.engine.telemetry.snapshot()[1] if r["client"].startswith("http:")]


CHAT = [{"role": "user", "content": "What is the capital of France?"}]


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
    assert len(records) == 2 and {r["client"] for r in records} == {"http:127.0.0.1"}
    assert all(r["status"] == "finished" and r["output_tokens"] == n_ws for r in records)
    models = api.models.list()
    assert [m.id for m in models.data] == ["smollm2"]


def curl(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run(
        ["curl", "-sS", "-N", "--max-time", "60", *args], capture_output=True, timeout=90
    )
    out.stdout, out.stderr = out.stdout.decode(), out.stderr.decode()  # bytes as sent: \r\n kept
    return out


def test_raw_event_stream_as_curl_sees_it(serve):
    server = serve("tiny", http_port=0)
    body = {
        "model": "tiny",
        "messages": CHAT,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
    }
    out = curl(
        "-i",
        server.http_url + "/v1/chat/completions",
        "-H",
        "Content-Type: application/json",
        "-d",
        json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}),
    )
    assert out.returncode == 0, out.stderr
    head, _, events = out.stdout.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 200") and "text/event-stream" in head
    blocks = events.split("\n\n")
    assert blocks[-1] == "" and blocks[-2] == "data: [DONE]"  # curl shows the de-chunked body
    chunks = []
    for block in blocks[:-2]:
        assert block.startswith("data: ") and "\n" not in block, block
        chunks.append(json.loads(block[len("data: ") :]))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(
        c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks
    )
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    status, whole = post(server, "/v1/chat/completions", body)
    assert status == 200 and whole["choices"][0]["message"]["content"] == text
    # Text completions stream too, and a GET of the health check answers on both ports.
    out = curl(
        server.http_url + "/v1/completions",
        "-d",
        json.dumps(
            {
                "prompt": "abc",
                "max_tokens": 5,
                "temperature": 0,
                "stream": True,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            }
        ),
    )
    lines = [b for b in out.stdout.split("\n\n") if b]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(b[6:]) for b in lines[:-1]]
    assert (
        all(c["object"] == "text_completion" for c in chunks)
        and chunks[-1]["usage"]["completion_tokens"] == 5
    )
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    for port in (server.port, int(server.http_url.rsplit(":", 1)[1])):
        out = curl("-i", f"http://127.0.0.1:{port}/health")
        assert (
            out.stdout.startswith("HTTP/1.1 200")
            and json.loads(out.stdout.split("\r\n\r\n")[1])["status"] == "ok"
        )


def test_32_concurrent_streaming_clients_finish_exactly_once_and_kv_is_free(serve):
    server = serve(
        "tiny",
        http_port=0,
        max_slots=16,
        kv_blocks=512,
        limits=Limits(max_open_requests=64, max_requests_per_s=1000, queue_limit=256),
    )

    async def one(api: openai.AsyncOpenAI, i: int) -> tuple[str, list[str], str, int]:
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

    async def main():
        api = openai.AsyncOpenAI(
            base_url=server.http_url + "/v1", api_key="x", max_retries=0, timeout=120
        )
        try:
            return await asyncio.gather(*(one(api, i) for i in range(32)))
        finally:
            await api.close()

    t0 = time.perf_counter()
    results = asyncio.run(main())
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


def raw_request(port: int, body: dict, path: str = "/v1/chat/completions") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    data = json.dumps(body).encode()
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


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


def test_stop_strings_cut_the_text_before_them(serve):
    server = serve("tiny", http_port=0)
    base = {"prompt": "hello", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    status, full = post(server, "/v1/completions", base)
    text = full["choices"][0]["text"]
    assert status == 200 and full["choices"][0]["finish_reason"] == "length" and len(text) >= 8
    stop = text[5:8]
    cut = text[: text.find(stop)]
    status, got = post(server, "/v1/completions", {**base, "stop": [stop, "\x00never"]})
    assert (
        status == 200
        and got["choices"][0]["text"] == cut
        and got["choices"][0]["finish_reason"] == "stop"
    )
    assert got["usage"]["completion_tokens"] < 24
    api = client(server)
    streamed = "".join(
        c.choices[0].text
        for c in api.completions.create(
            model="tiny",
            prompt="hello",
            max_tokens=16,
            temperature=0,
            stop=stop,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert streamed == cut
    idle_and_free(server)  # the engine's request was cancelled at the stop


def test_stop_cutter_holds_back_a_possible_stop_prefix_across_deltas():
    cut = StopCutter(["lo w", "END"])
    assert [cut.feed(d) for d in ("Hel", "l", "o", " wor")] == ["He", "l", "", ""]  # "Hel" in all
    assert cut.stopped
    cut = StopCutter(["xyz"])
    assert [cut.feed(d) for d in ("ax", "yb", "x")] == ["a", "xyb", ""] and cut.flush() == "x"
    assert not cut.stopped and StopCutter([]).feed("abc") == "abc"


def metrics(port: int) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    return {
        f.name: {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
    }


def value(fams: dict, family: str, sample: str | None = None, **labels) -> float:
    want = tuple(sorted({"model_name": "tiny", **labels}.items()))
    return fams[family][(sample or family, want)]


def test_metrics_parse_count_and_stay_monotonic_across_a_reset(serve):
    server = serve("tiny", http_port=0, policy="static", max_slots=2, fill_timeout_s=5.0)
    ws_port, http_port = server.port, int(server.http_url.rsplit(":", 1)[1])

    async def two():  # one static batch: the short answer's slot is dead until the long one ends
        loop = asyncio.get_running_loop()
        return await asyncio.gather(
            *(
                loop.run_in_executor(
                    None,
                    post,
                    server,
                    "/v1/completions",
                    {"prompt": "ab", "max_tokens": n, "temperature": 0, "ignore_eos": True},
                )
                for n in (2, 9)
            )
        )

    answers = asyncio.run(two())
    assert [a[1]["usage"]["completion_tokens"] for a in answers] == [2, 9]
    idle_and_free(server)
    steps, _ = server.engine.telemetry.snapshot()
    fams = metrics(ws_port)
    assert fams.keys() >= {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:num_preemptions",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "fluxo:dead_slot_steps",
        "fluxo:policy_info",
    }
    dead = sum(s["tokens"]["dead"] for s in steps)
    assert dead > 0 and value(fams, "fluxo:dead_slot_steps", "fluxo:dead_slot_steps_total") == dead
    assert value(fams, "vllm:generation_tokens", "vllm:generation_tokens_total") == 11
    prompt = sum(a[1]["usage"]["prompt_tokens"] for a in answers)
    assert value(fams, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == prompt
    assert (
        value(fams, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count")
        == 2
    )
    assert (
        value(fams, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count")
        == 1 + 8
    )
    assert (
        value(fams, "vllm:kv_cache_usage_perc") == 0
        and value(fams, "vllm:num_requests_running") == 0
    )
    assert value(fams, "fluxo:policy_info", policy="static", runner="sync", kv_layout="paged") == 1

    async def reset():
        c = await open_client(url(server))
        await c.send({"type": "reset"})
        await c.until(lambda m: m["type"] == "state")  # sent once the reset is done

    asyncio.run(reset())
    assert server.engine.telemetry.snapshot() == ([], [])
    status, _ = post(
        server,
        "/v1/completions",
        {"prompt": "ab", "max_tokens": 3, "temperature": 0, "ignore_eos": True},
    )
    idle_and_free(server)
    after = metrics(http_port)
    assert value(after, "vllm:generation_tokens", "vllm:generation_tokens_total") == 11 + 3
    assert value(after, "fluxo:dead_slot_steps", "fluxo:dead_slot_steps_total") >= dead
    assert value(after, "fluxo:policy_info", policy="static", runner="sync", kv_layout="paged") == 1


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
