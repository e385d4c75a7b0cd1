"""The OpenAI-compatible HTTP API's event stream as curl sees it (chat and text completions,
bytes as sent), the health check on both ports, and stop strings (cut before them, streamed or
not, and held back across deltas)."""

from __future__ import annotations

import json
import time

from http_client import CHAT, client, curl, idle_and_free, post

from engine.server.openai_shapes import StopCutter
from engine.server.server import Server


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
    first = chunks[0]["choices"][0]["delta"]  # the role rides on the first token, as vLLM's
    assert first["role"] == "assistant" and isinstance(first["content"], str), first
    assert all(
        c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks
    )
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    status, whole = post(server, "/v1/chat/completions", body)
    assert status == 200 and whole["choices"][0]["message"]["content"] == text
    # Text completions stream too, and a GET of the health check answers on both ports.
    _check_text_completion_stream(server)
    _check_health_on_both_ports(server)


def _check_text_completion_stream(server: Server) -> None:
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


def _check_health_on_both_ports(server: Server) -> None:
    for port in (server.port, int(server.http_url.rsplit(":", 1)[1])):
        out = curl("-i", f"http://127.0.0.1:{port}/health")
        assert (
            out.stdout.startswith("HTTP/1.1 200")
            and json.loads(out.stdout.split("\r\n\r\n")[1])["status"] == "ok"
        )


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


def test_the_first_chunk_waits_for_the_first_token(serve):
    """Load tools time the first streamed chunk as TTFT: it must be the first token's, not an
    empty role chunk sent before the prefill (issue 38, item 8: ~15 ms against a 3.7 s prefill).
    300 ms of host work a step makes the prefill step slow on any machine."""
    server = serve("tiny", http_port=0, host_work_ms=300.0)
    stream = client(server).chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=3, stream=True, extra_body={"ignore_eos": True}
    )
    t0 = time.perf_counter()
    first = next(iter(stream))
    waited = time.perf_counter() - t0
    rest = list(stream)
    delta = first.choices[0].delta
    assert delta.role == "assistant" and delta.content is not None, first
    assert waited >= 0.2, waited  # most of one 300 ms step: the prefill's (was ~0.01 s)
    text = delta.content + "".join(c.choices[0].delta.content or "" for c in rest if c.choices)
    assert rest[-1].choices[0].finish_reason == "length" and isinstance(text, str)
