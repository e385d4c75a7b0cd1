"""The peer benchmark's client (engine/observe/bench.py) against Fluxo's own server (tiny model,
real HTTP and server-sent events): the numbers it reports agree with the engine's own counters.
The vLLM side runs in ``python -m engine.bench vllm`` (docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from engine.observe.bench import run_once, sse_texts, table
from engine.workloads.canonical import WorkItem
from tests.servers import start_engine, stop


def test_sse_texts_keeps_chunks_with_text_only():
    lines = [
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n',
        b"\n",
        b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n',
        b'data: {"choices":[{"text":"lo"}]}\n',
        b'data: {"choices":[],"usage":{"completion_tokens":2}}\n',
        b"data: [DONE]\n",
    ]
    assert [t for _, t in sse_texts(lines)] == ["Hel", "lo"]


@pytest.fixture(scope="module")
def fluxo(tmp_path_factory):
    proc, ws_url = start_engine(tmp_path_factory.mktemp("bench"))
    port = int(ws_url.rsplit(":", 1)[1])
    yield f"http://127.0.0.1:{port + 1}"
    stop(proc)


def test_a_run_on_fluxos_server_agrees_with_its_counters(fluxo):
    items = [WorkItem(f"Say hello to student {i}.", n) for i, n in enumerate((8, 12, 16, 20))]
    r = run_once(fluxo, "tiny", items)
    assert r["useful_tokens"] == 56 == r["engine_tokens"]  # EOS ignored: exactly what was asked
    assert 0 < r["ttft_p50"] <= r["ttft_p95"] < r["wall_s"]
    assert 0 < r["itl_p50"] <= r["itl_p95"] <= r["itl_p99"]
    assert r["engine_steps"] >= 20  # the longest answer alone takes 20 steps
    line = table({"runs": [{"engine": "fluxo", "round": 1, **r}]}).splitlines()[1]
    assert line.startswith("fluxo") and f"{r['tokens_per_s']:.1f}" in line
