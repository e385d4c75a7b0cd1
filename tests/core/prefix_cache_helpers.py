"""Shared parts of the prefix-cache tests (test_prefix_cache*.py): prompts built from a few
shared prefixes, hypothesis settings, the transformers reference of the tiny model's greedy output,
and the check of an engine's block pool and registered K/V after each step."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck
from hypothesis import strategies as st

BS = 4  # the tiny engine's block size (conftest)
MAX_NEW = 10
PROP = dict(
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
# A few prefixes many prompts start with (a system preamble, a shared document), in blocks of 4.
PREFIXES = (
    [7, 7, 7, 7, 1, 2, 3, 4, 9, 9, 9, 9],
    [200, 201, 202, 203, 204, 205, 206, 207],
    [5, 5, 5, 5],
)


def shared_prompt(prefix: int, cut: int, tail: list[int]) -> list[int]:
    return PREFIXES[prefix][:cut] + tail if cut or tail else PREFIXES[prefix][:1]


# Most prompts start with a shared prefix (whole blocks of it, or a cut inside one), some with none.
prompt_st = st.builds(
    shared_prompt,
    st.integers(0, len(PREFIXES) - 1),
    st.sampled_from((12, 12, 8, 6, 4, 0)),
    st.lists(st.integers(0, 255), max_size=6),
)

_REF: dict[tuple[int, ...], list[int]] = {}


def reference(model, prompt: list[int]) -> list[int]:
    """Greedy continuation by transformers' own forward (tiny float64 model), MAX_NEW tokens."""
    key = tuple(prompt)
    if key not in _REF:
        ids = list(prompt)
        with torch.inference_mode():
            for _ in range(MAX_NEW):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        _REF[key] = ids[len(prompt) :]
    return _REF[key]


def registered_kv(engine) -> dict[int, tuple[int, torch.Tensor]]:
    """Key and K/V of every registered block, read once the step in flight (async) has landed."""
    engine.device_pool.submit(lambda: None).result()
    cache, bs = engine.model_runner.cache, engine.config.block_size
    return {
        b: (
            k,
            torch.cat(
                [cache.k[:, b * bs : (b + 1) * bs], cache.v[:, b * bs : (b + 1) * bs]]
            ).clone(),
        )
        for b, k in engine.blocks._key.items()
    }


def check_engine(engine, before: dict) -> dict:
    sch, bm = engine.scheduler, engine.blocks
    bm.check(holders=sch.running)
    for s in sch.waiting:
        assert s.block_table == [] and s.num_computed == 0
    for s in sch.running:  # a sequence's cached prefix lies in its own table
        assert len(s.block_table) * bm.block_size >= s.num_computed
    after = registered_kv(engine)
    for b, (key, kv) in after.items():
        if b in before and before[b][0] == key:
            assert torch.equal(before[b][1], kv), f"registered block {b} was written"
    return after
