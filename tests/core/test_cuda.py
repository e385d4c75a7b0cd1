"""The engine on a CUDA device (engine/core/cuda_exec.py): the same greedy tokens as transformers
and as the CPU path, with decode graphs on and off, sync and async; the h2d, compute and d2h lanes
really overlap under async; a replayed decode step is much cheaper than an eager one. Skipped
without a GPU (scripts/gpu_check.sh runs them on one)."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.core.metrics import median
from engine.core.model import chat_ids
from engine.workloads.canonical import CHAT_PROMPTS

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine"
)

PROMPTS = (
    "What is the capital of France?",
    "Name five planets of the solar system.",
    "Write a haiku about the sea.",
    "How do I boil an egg?",
)
MAX_NEW = (24, 12, 30, 18)
MODES = [(runner, graphs) for runner in ("sync", "async") for graphs in (True, False)]


def _tokens(engine: Engine, prompts, max_new) -> list[list[int]]:
    handles = [
        engine.submit(prompt=p, max_new_tokens=n) for p, n in zip(prompts, max_new, strict=False)
    ]
    engine.run_until_idle()
    assert engine.blocks.num_used == 0
    return [h.token_ids for h in handles]


@pytest.fixture(scope="module")
def smollm2_cuda(smollm2):
    model, tok = smollm2
    return copy.deepcopy(model).to("cuda"), tok  # the session's CPU copy stays where it is


def test_tiny_greedy_matches_cpu_sync_and_async_graphs_on_and_off(tiny):
    model, tok = tiny
    cuda_model = copy.deepcopy(model).to("cuda")
    prompts = [[(7 * i + j) % 250 for j in range(3 + 3 * i)] for i in range(5)]
    outs = {}
    for device, runner, graphs in [("cpu", "sync", False)] + [("cuda", r, g) for r, g in MODES]:
        engine = Engine(
            EngineConfig(
                model="tiny",
                dtype="float64",
                device=device,
                runner=runner,
                max_slots=3,
                kv_blocks=64,
                block_size=16,
                cuda_graphs=graphs,
            ),
            model=cuda_model if device == "cuda" else model,
            tokenizer=tok,
        )
        handles = [engine.submit(token_ids=p, max_new_tokens=12, ignore_eos=True) for p in prompts]
        engine.run_until_idle()
        outs[(device, runner, graphs)] = [h.token_ids for h in handles]
        assert engine.blocks.num_used == 0
        if device == "cuda":
            stats = engine.cuda.stats()
            assert stats["cuda_graphs"] is graphs and (stats["replays"] > 0) is graphs, stats
    assert all(v == outs[("cpu", "sync", False)] for v in outs.values()), outs


@pytest.fixture(scope="module")
def references(smollm2, smollm2_cuda):
    """transformers' generate on the GPU, one prompt at a time, greedy; and the CPU engine's
    tokens."""
    model, tok = smollm2_cuda
    hf = []
    with torch.inference_mode():
        for p, n in zip(PROMPTS, MAX_NEW, strict=False):
            ids = torch.tensor([chat_ids(tok, [{"role": "user", "content": p}])], device="cuda")
            gen = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
            )
            hf.append(gen[0, ids.shape[1] :].tolist())
    cpu = _tokens(
        Engine(EngineConfig(kv_blocks=128), model=smollm2[0], tokenizer=tok), PROMPTS, MAX_NEW
    )
    return hf, cpu


@pytest.mark.parametrize("runner,graphs", MODES)
def test_smollm2_greedy_equals_transformers_and_cpu(smollm2_cuda, references, runner, graphs):
    model, tok = smollm2_cuda
    ref, cpu = references
    gpu = _tokens(
        Engine(
            EngineConfig(kv_blocks=128, device="cuda", runner=runner, cuda_graphs=graphs),
            model=model,
            tokenizer=tok,
        ),
        PROMPTS,
        MAX_NEW,
    )
    assert gpu == ref
    assert gpu == cpu


def _decode_engine(model, tok, runner: str, graphs: bool, slots: int = 8, new: int = 48) -> Engine:
    engine = Engine(
        EngineConfig(device="cuda", runner=runner, max_slots=slots, cuda_graphs=graphs),
        model=model,
        tokenizer=tok,
    )
    for i in range(slots):
        engine.submit(prompt=CHAT_PROMPTS[i], max_new_tokens=new, ignore_eos=True)
    engine.run_until_idle()
    return engine


def _lane(record: dict, name: str) -> dict:
    return next(s for s in record["spans"] if s["lane"] == name)


def test_async_lanes_overlap_on_the_gpu(smollm2_cuda):
    model, tok = smollm2_cuda
    engine = _decode_engine(model, tok, "async", True)
    recs = [r for r in engine.telemetry.steps if not r["tokens"]["prefill"]][1:]
    assert len(recs) > 20
    for r in recs:  # each lane's events are ordered: copy in, compute, copy out
        h2d, comp, d2h = (_lane(r, n) for n in ("h2d", "compute", "d2h"))
        assert (
            h2d["start"] <= h2d["end"] <= comp["start"] + 1e-4
            and comp["end"] <= d2h["start"] + 1e-4
        )
    # Step N+1's inputs are copied in while step N computes, and the host prepares meanwhile.
    copied = sum(
        _lane(b, "h2d")["start"] < _lane(a, "compute")["end"]
        for a, b in zip(recs, recs[1:], strict=False)
    )
    prepared = sum(
        _lane(b, "cpu_prepare")["start"] < _lane(a, "compute")["end"]
        for a, b in zip(recs, recs[1:], strict=False)
    )
    assert copied >= len(recs) // 2 and prepared >= len(recs) // 2, (copied, prepared, len(recs))


def test_graph_replay_decode_step_at_most_0_7_of_eager_at_batch_8(smollm2_cuda):
    model, tok = smollm2_cuda
    times = {True: [], False: []}
    for _ in range(2):  # interleaved A/B
        for graphs in (True, False):
            engine = _decode_engine(model, tok, "sync", graphs)
            times[graphs] += [
                _lane(r, "compute")["end"] - _lane(r, "compute")["start"]
                for r in engine.telemetry.steps
                if not r["tokens"]["prefill"]
            ][2:]
    ratio = median(times[True]) / median(times[False])
    assert ratio <= 0.7, ratio
