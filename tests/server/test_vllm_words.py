"""vLLM's own words on Fluxo's server (issue 38, item 8): the flags a vLLM user reaches for set
Fluxo's switches, and ``/tokenize`` / ``/detokenize`` answer in vLLM's shapes, counting what a
completion of the same body would read."""

from __future__ import annotations

import urllib.request

from http_client import CHAT, post

from engine.serve import config_from, parse_args


def test_vllm_flags_set_the_same_switches():
    vllm = "--max-num-seqs 3 --max-num-batched-tokens 64 --no-enable-prefix-caching --block-size 32"
    fluxo = "--slots 3 --chunk-budget 64 --no-prefix-cache --block-size 32"
    a, b = (config_from(parse_args(flags.split())) for flags in (vllm, fluxo))
    assert a == b
    assert (a.max_slots, a.chunk_budget, a.prefix_cache, a.block_size) == (3, 64, False, 32)
    assert config_from(parse_args(["--enable-prefix-caching"])).prefix_cache is True


def test_tokenize_counts_what_a_completion_reads(serve):
    server = serve("tiny", http_port=0)
    status, chat = post(server, "/tokenize", {"model": "tiny", "messages": CHAT})
    assert status == 200 and chat["count"] == len(chat["tokens"]) > 0, chat
    assert chat["max_model_len"] == server.engine.config.max_model_len
    status, done = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})
    assert status == 200 and done["usage"]["prompt_tokens"] == chat["count"]
    status, text = post(server, "/tokenize", {"prompt": "Hello there"})
    assert status == 200 and text["tokens"] == server.engine.tokenizer.encode("Hello there")
    status, back = post(server, "/detokenize", {"tokens": text["tokens"]})
    assert status == 200 and back == {"prompt": server.engine.tokenizer.decode(text["tokens"])}
    # coded errors, as the completions give them
    status, err = post(server, "/detokenize", {"tokens": [1, -5]})
    assert status == 400 and err["error"]["code"] == "invalid_token_ids", err
    status, err = post(server, "/detokenize", {"tokens": "abc"})
    assert status == 400 and err["error"]["code"] == "bad_field", err
    status, err = post(server, "/tokenize", {"prompt": "   "})
    assert status == 400 and err["error"]["code"] == "empty_prompt", err
    try:
        urllib.request.urlopen(server.http_url + "/tokenize", timeout=30)
        raise AssertionError("GET /tokenize answered")
    except urllib.error.HTTPError as e:
        assert e.code == 405
