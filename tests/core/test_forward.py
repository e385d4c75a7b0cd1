"""The engine's own ragged, paged forward agrees with the transformers forward on the same
weights."""

from __future__ import annotations

import torch

from engine.core.config import EngineConfig
from engine.core.engine import Engine


def _capture_rows(engine: Engine) -> list[tuple[list[int], torch.Tensor]]:
    """Record, for every sampled logits row, the token ids the row's sequence held at that step.

    Observes the real runner (no stand-in): each row predicts the token after those ids.
    """
    seen: list[tuple[list[int], torch.Tensor]] = []
    build, forward = engine.model_runner.build, engine.model_runner.forward_impl.forward
    pending: list = []

    def spy_build(batch):
        fb, rows = build(batch)
        pending[:] = [None if s is None else list(s.prompt_ids) + list(s.output_ids) for s in rows]
        return fb, rows

    def spy_forward(fb, cache):
        logits = forward(fb, cache)
        seen.extend((ids, logits[i].clone()) for i, ids in enumerate(pending) if ids is not None)
        return logits

    engine.model_runner.build, engine.model_runner.forward_impl.forward = spy_build, spy_forward
    return seen


def _reference(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1]


def test_tiny_float64_matches_transformers_exactly(tiny):
    model, tok = tiny
    # Chunked with a small budget and blocks of 4 makes every kind of row: whole prefills, prefill
    # chunks continuing over cached tokens, decodes whose context spans several blocks.
    engine = Engine(
        EngineConfig(
            model="tiny",
            dtype="float64",
            policy="chunked",
            chunk_budget=7,
            block_size=4,
            kv_blocks=64,
            max_slots=3,
        ),
        model=model,
        tokenizer=tok,
    )
    seen = _capture_rows(engine)
    for i, n in enumerate((3, 11, 17, 6)):
        engine.submit(
            token_ids=[(7 * i + j) % 250 for j in range(n)], max_new_tokens=6, ignore_eos=True
        )
    engine.run_until_idle()
    assert len(seen) == 4 * 6
    worst = max(float((logits - _reference(model, ids)).abs().max()) for ids, logits in seen)
    assert worst < 1e-9, worst


def test_static_dead_slots_do_not_disturb_live_rows(tiny):
    model, tok = tiny
    engine = Engine(
        EngineConfig(
            model="tiny",
            dtype="float64",
            policy="static",
            block_size=4,
            kv_blocks=64,
            max_slots=3,
            fill_timeout_s=0.0,
        ),
        model=model,
        tokenizer=tok,
    )
    seen = _capture_rows(engine)
    for i, m in enumerate((2, 9, 5)):
        engine.submit(
            token_ids=[(11 * i + j) % 250 for j in range(5 + i)], max_new_tokens=m, ignore_eos=True
        )
    engine.run_until_idle()
    dead_steps = sum(1 for r in engine.telemetry.steps if r["tokens"]["dead"])
    assert dead_steps >= 4  # the short member sat dead while the long one finished
    worst = max(float((logits - _reference(model, ids)).abs().max()) for ids, logits in seen)
    assert worst < 1e-9, worst


def test_smollm2_float32_logits_close_and_argmax_equal(smollm2):
    model, tok = smollm2
    engine = Engine(
        EngineConfig(policy="chunked", chunk_budget=24, kv_blocks=64, max_slots=4),
        model=model,
        tokenizer=tok,
    )
    seen = _capture_rows(engine)
    for p in (
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "Why is the sky blue?",
    ):
        engine.submit(prompt=p, max_new_tokens=4, ignore_eos=True)
    engine.run_until_idle()
    assert len(seen) == 12
    for ids, logits in seen:
        ref = _reference(model, ids)
        assert torch.allclose(logits, ref, atol=2e-3, rtol=1e-4), float((logits - ref).abs().max())
        assert int(logits.argmax()) == int(ref.argmax())
