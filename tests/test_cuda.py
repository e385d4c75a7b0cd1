"""The engine on a CUDA device: same greedy tokens as on the CPU, sync and async. Skipped without a GPU."""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def test_cuda_greedy_matches_cpu_sync_and_async(tiny):
    model, tok = tiny
    prompts = [[(7 * i + j) % 250 for j in range(3 + 3 * i)] for i in range(5)]
    outs = {}
    for device, runner in (("cpu", "sync"), ("cuda", "sync"), ("cuda", "async")):
        m = model.to(device)
        engine = Engine(EngineConfig(model="tiny", dtype="float64", device=device, runner=runner, max_slots=3,
                                     kv_blocks=64, block_size=16), model=m, tokenizer=tok)
        handles = [engine.submit(token_ids=p, max_new_tokens=12, ignore_eos=True) for p in prompts]
        engine.run_until_idle()
        outs[(device, runner)] = [h.token_ids for h in handles]
        assert engine.blocks.num_used == 0
    model.to("cpu")
    assert outs[("cuda", "sync")] == outs[("cpu", "sync")] == outs[("cuda", "async")]
