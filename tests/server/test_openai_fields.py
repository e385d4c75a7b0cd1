"""What the OpenAI API offers and Fluxo does not implement is refused with ``unsupported`` and
its ``param`` (never a 200 that ignored it), and the prefix cache shows to an HTTP client: in the
usage (``prompt_tokens_details.cached_tokens``) and in vLLM's ``prefix_cache_*`` counters."""

from __future__ import annotations

import pytest
from http_client import idle_and_free, metrics, post, value

PROMPT = "The weights are read once per step, whatever the batch size. " * 6  # > 2 KV blocks


@pytest.fixture
def server(serve):
    return serve("tiny", http_port=0, max_slots=4, kv_blocks=64, block_size=16)


@pytest.mark.parametrize(
    ("field", "value_"),
    [
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "auto"),
        ("logprobs", True),
        ("top_logprobs", 3),
        ("response_format", {"type": "json_object"}),
    ],
)
def test_a_field_the_api_does_not_implement_is_refused(server, field, value_):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, answer = post(server, "/v1/chat/completions", {**body, field: value_})
    assert status == 400, answer
    err = answer["error"]
    param = "logprobs" if field == "top_logprobs" else field
    assert err["code"] == "unsupported" and err["param"] == param, err


def test_what_is_implemented_or_off_still_answers(server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for extra in ({"response_format": {"type": "text"}}, {"logprobs": False}, {"tools": []}):
        status, answer = post(server, "/v1/chat/completions", {**body, **extra})
        assert status == 200, (extra, answer)


def test_the_prefix_cache_shows_in_usage_and_metrics(server):
    port = int(server.http_url.rsplit(":", 1)[1])
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2}
    _, first = post(server, "/v1/completions", body)
    idle_and_free(server)
    _, second = post(server, "/v1/completions", body)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["usage"]["prompt_tokens"]  # whole blocks, never the last token
    idle_and_free(server)
    fams = metrics(port)
    queries = value(fams, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total")
    hits = value(fams, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total")
    assert queries == first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"]
    assert hits == cached
