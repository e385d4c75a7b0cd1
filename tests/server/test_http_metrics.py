"""The Prometheus page of the OpenAI-compatible server, read by ``prometheus_client``'s parser:
vLLM's and Fluxo's families, counts that match the engine's records, and counters that stay
monotonic across a telemetry reset."""

from __future__ import annotations

import asyncio

from http_client import idle_and_free, metrics, post, value
from server_client import open_client, url

from engine.server.server import Server

# the families a scraper can rely on
FAMILIES = {
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


def test_metrics_parse_count_and_stay_monotonic_across_a_reset(serve):
    server = serve("tiny", http_port=0, policy="static", max_slots=2, fill_timeout_s=5.0)
    ws_port, http_port = server.port, int(server.http_url.rsplit(":", 1)[1])
    answers = asyncio.run(_one_static_batch(server))
    assert [a[1]["usage"]["completion_tokens"] for a in answers] == [2, 9]
    idle_and_free(server)
    steps, _ = server.engine.telemetry.snapshot()
    fams = metrics(ws_port)
    assert fams.keys() >= FAMILIES
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
    asyncio.run(_reset(server))
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


async def _one_static_batch(server: Server) -> list[tuple[int, dict]]:
    """Two completions in one static batch: the short answer's slot is dead until the long one
    ends."""
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


async def _reset(server: Server) -> None:
    c = await open_client(url(server))
    await c.send({"type": "reset"})
    await c.until(lambda m: m["type"] == "state")  # sent once the reset is done
