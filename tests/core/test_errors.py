"""Bad input gets a clear exception with a code; the engine keeps serving everyone else."""

from __future__ import annotations

import pytest

from engine.core.config import EngineConfig
from engine.core.errors import (
    EmptyPrompt,
    FluxoError,
    InvalidConfig,
    InvalidMaxTokens,
    InvalidSampling,
    InvalidTokenIds,
    KVBudgetTooSmall,
    PromptTooLong,
    UnknownMode,
)

BAD_SUBMITS = [
    (dict(prompt=""), EmptyPrompt, "empty_prompt"),
    (dict(prompt="   "), EmptyPrompt, "empty_prompt"),
    (dict(messages=[]), EmptyPrompt, "empty_prompt"),
    (dict(messages=[{"role": "user"}]), EmptyPrompt, "empty_prompt"),
    (dict(token_ids=[]), EmptyPrompt, "empty_prompt"),
    (dict(token_ids=[1, 99999]), InvalidTokenIds, "invalid_token_ids"),
    (dict(token_ids=[1] * 300), PromptTooLong, "prompt_too_long"),
    (dict(prompt="hi", max_new_tokens=0), InvalidMaxTokens, "invalid_max_tokens"),
    (dict(prompt="hi", max_new_tokens=-3), InvalidMaxTokens, "invalid_max_tokens"),
    (dict(prompt="hi", max_new_tokens="5"), InvalidMaxTokens, "invalid_max_tokens"),
    (dict(prompt="hi", max_new_tokens=250), InvalidMaxTokens, "invalid_max_tokens"),
    (dict(prompt="hi", temperature=-1.0), InvalidSampling, "invalid_sampling"),
    (dict(prompt="hi", temperature=float("nan")), InvalidSampling, "invalid_sampling"),
    (dict(prompt="hi", top_p=0.0), InvalidSampling, "invalid_sampling"),
]


@pytest.mark.parametrize("kwargs,exc,code", BAD_SUBMITS)
def test_bad_submit_raises_coded_error_and_engine_keeps_serving(
    make_tiny_engine, kwargs, exc, code
):
    engine = make_tiny_engine(max_model_len=256)
    good = engine.submit(token_ids=[1, 2, 3], max_new_tokens=5, ignore_eos=True)
    with pytest.raises(exc) as info:
        engine.submit(**kwargs)
    assert isinstance(info.value, FluxoError) and info.value.code == code and info.value.message
    engine.run_until_idle()
    assert len(good.token_ids) == 5 and good.seq.status.value == "finished"


def test_kv_budget_smaller_than_one_sequence(make_tiny_engine):
    engine = make_tiny_engine(kv_blocks=4, block_size=4)  # 16 tokens of KV
    with pytest.raises(KVBudgetTooSmall) as info:
        engine.submit(token_ids=list(range(10)), max_new_tokens=10)
    assert info.value.code == "kv_budget_too_small"
    ok = engine.submit(token_ids=list(range(6)), max_new_tokens=6, ignore_eos=True)
    engine.run_until_idle()
    assert len(ok.token_ids) == 6


def test_budget_shrunk_live_fails_only_what_no_longer_fits(make_tiny_engine):
    engine = make_tiny_engine(kv_blocks=32, block_size=4, max_slots=1)
    big = engine.submit(token_ids=list(range(20)), max_new_tokens=20, ignore_eos=True)
    small = engine.submit(token_ids=list(range(4)), max_new_tokens=4, ignore_eos=True)
    engine.step()
    engine.reconfigure(kv_blocks=4)
    engine.run_until_idle()
    events = list(big)
    assert events[-1].kind == "error" and events[-1].error_code == "kv_budget_too_small"
    assert len(small.token_ids) == 4 and engine.blocks.num_used == 0


@pytest.mark.parametrize(
    "change,exc",
    [
        (dict(policy="fifo"), UnknownMode),
        (dict(runner="gpu"), UnknownMode),
        (dict(kv_layout="ring"), UnknownMode),
        (dict(max_slots=0), InvalidConfig),
        (dict(chunk_budget=1.5), InvalidConfig),
        (dict(block_size=8), InvalidConfig),
    ],
)
def test_bad_reconfigure_is_refused_and_nothing_changes(make_tiny_engine, change, exc):
    engine = make_tiny_engine()
    before = engine.config.live()
    with pytest.raises(exc):
        engine.reconfigure(**change)
    engine.submit(token_ids=[1, 2], max_new_tokens=3, ignore_eos=True)
    engine.run_until_idle()
    assert engine.config.live() == before


def test_unknown_policy_in_config():
    with pytest.raises(UnknownMode) as info:
        EngineConfig(policy="round-robin")
    assert info.value.code == "unknown_mode" and "continuous" in info.value.message


def test_cancel_mid_run_frees_blocks_and_ends_once(make_tiny_engine):
    engine = make_tiny_engine()
    a = engine.submit(token_ids=[3, 4, 5], max_new_tokens=30, ignore_eos=True)
    b = engine.submit(token_ids=[6, 7], max_new_tokens=8, ignore_eos=True)
    for _ in range(3):
        engine.step()
    engine.cancel(a.id)
    engine.cancel(a.id)
    engine.run_until_idle()
    kinds = [e.kind for e in a]
    assert kinds.count("done") == 1 and kinds[-1] == "done" and a.seq.status.value == "cancelled"
    assert len(b.token_ids) == 8 and engine.blocks.num_used == 0
