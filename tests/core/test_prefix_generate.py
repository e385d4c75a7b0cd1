"""SmolLM2 with the prefix cache: prompts that share a ~400-token document give transformers'
own greedy ``generate`` output, whether their prefix was computed or taken from the cache."""

from __future__ import annotations

import pytest
import torch

from engine.core import device
from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.core.model import chat_ids
from engine.workloads.prefix import document_prompt

PROMPTS = (document_prompt(0), document_prompt(6), "What is the capital of France?")
MAX_NEW = 12


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One intra-op thread (here and on the device thread): on a crowded 2-core box, a second
    thread spin-waits and makes every forward several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    device.run(torch.set_num_threads, 1)
    yield
    torch.set_num_threads(before)
    device.run(torch.set_num_threads, before)


@pytest.fixture(scope="module")
def hf_reference(smollm2):
    model, tok = smollm2
    out = []
    with torch.inference_mode():
        for p in PROMPTS:
            ids = torch.tensor([chat_ids(tok, [{"role": "user", "content": p}])])
            gen = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False
            )
            out.append(gen[0, ids.shape[1] :].tolist())
    return out


CASES = {
    "continuous-sync": dict(policy="continuous"),
    "chunked-async": dict(policy="chunked", chunk_budget=48, runner="async"),
    "static-reserved": dict(policy="static", kv_layout="reserved", fill_timeout_s=0.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_smollm2_shared_prefix_equals_transformers_generate(smollm2, hf_reference, case):
    model, tok = smollm2
    engine = Engine(EngineConfig(kv_blocks=128, **CASES[case]), model=model, tokenizer=tok)
    first = engine.submit(prompt=PROMPTS[0], max_new_tokens=MAX_NEW)
    engine.run_until_idle()  # the document's blocks are computed, then cached
    later = [engine.submit(prompt=p, max_new_tokens=MAX_NEW) for p in PROMPTS]  # all three at once
    engine.run_until_idle()
    assert first.token_ids == hf_reference[0]
    assert [h.token_ids for h in later] == hf_reference
    cached = [engine.telemetry.requests[h.id]["cached_tokens"] for h in later]
    assert cached[0] >= 384 and cached[1] >= 384, cached  # the document: 24 full blocks of 16
    assert cached[2] == 16, cached  # the chat template's preamble: one full block
    engine.blocks.check(holders=[])
