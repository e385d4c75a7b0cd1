"""Peer baseline: the same workload through transformers' own serving paths.

``hf_static`` is what a naive server does with ``model.generate``: fixed batches that run until
their longest member. ``hf_continuous`` is transformers' own continuous batching manager. Both
ignore EOS so every request produces exactly the tokens it asked for, as in Fluxo's ``batching``
benchmark.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig
from transformers.generation.continuous_batching.utils import WorkloadHints

from engine.core.numbers import ceil_div
from engine.workloads.canonical import WorkItem


@dataclass(slots=True)
class PeerResult:
    name: str  # "hf_static" or "hf_continuous"
    useful_tokens: int  # sum of each request's max_new_tokens
    wall_s: float
    tokens_per_s: float  # useful_tokens / wall_s
    slots: int | None  # batch size / slot count (None when the library sized it itself)
    note: str


def prompt_ids(tokenizer: Any, items: list[WorkItem]) -> list[list[int]]:
    out = []
    for it in items:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": it.prompt}], add_generation_prompt=True
        )
        # transformers 5 returns a BatchEncoding unless tokenize-only output is requested
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def _greedy_config(model: Any, **kw: Any) -> GenerationConfig:
    # A fresh config, so sampling defaults shipped with the checkpoint cannot sneak in
    return GenerationConfig(do_sample=False, pad_token_id=model.config.pad_token_id or 0, **kw)


def _result(
    name: str, items: list[WorkItem], wall: float, slots: int | None, note: str
) -> PeerResult:
    useful = sum(it.max_new_tokens for it in items)
    return PeerResult(name, useful, wall, useful / wall, slots, note)


def hf_static(model: Any, tokenizer: Any, items: list[WorkItem], slots: int) -> PeerResult:
    """``model.generate`` over static batches of ``slots`` requests, in arrival order."""
    order = sorted(items, key=lambda it: it.arrival_s)
    prompts = prompt_ids(tokenizer, order)
    pad_id = model.config.pad_token_id or 0
    with torch.inference_mode():
        # One token of warm-up so one-time allocator/kernel setup is not billed to the first batch
        model.generate(
            torch.tensor([prompts[0]]), generation_config=_greedy_config(model, max_new_tokens=1)
        )
        start = time.perf_counter()
        for b in range(0, len(order), slots):
            batch, ids = order[b : b + slots], prompts[b : b + slots]
            width = max(map(len, ids))
            # Left padding keeps every prompt's last token at the end, where generation continues
            input_ids = torch.tensor([[pad_id] * (width - len(x)) + x for x in ids])
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
            n = max(it.max_new_tokens for it in batch)
            # min == max: EOS is suppressed, so the batch runs until its longest member like a naive
            # server
            cfg = _greedy_config(model, max_new_tokens=n, min_new_tokens=n)
            out = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=cfg)
            if out.shape[1] != width + n:
                raise RuntimeError(
                    f"static batch produced {out.shape[1] - width} tokens, expected {n}"
                )
        wall = time.perf_counter() - start
    return _result(
        "hf_static", items, wall, slots, f"model.generate, batches of {slots}, padded to batch max"
    )


def _drain(manager: Any, ids: list[str | None]) -> dict[str, int]:
    """Blocks until every request in ``ids`` finished; returns its generated-token count."""
    done: dict[str, int] = {}
    while len(done) < len(ids):
        # blocking get: no busy polling competing with the worker thread
        res = manager.get_result(timeout=1)
        if res is None:
            if not manager.is_running():
                raise RuntimeError("continuous batching thread died")
        elif res.error is not None:
            raise RuntimeError(f"{res.request_id} failed: {res.error}")
        elif res.is_finished():
            done[res.request_id] = len(res.generated_tokens)
    return done


def hf_continuous(
    model: Any, tokenizer: Any, items: list[WorkItem], slots: int | None
) -> PeerResult:
    """transformers' ContinuousBatchingManager: all requests submitted at once, each with its own
    length."""
    prompts = prompt_ids(tokenizer, items)
    page = ContinuousBatchingConfig.page_size
    need = sum(
        ceil_div(len(p) + it.max_new_tokens, page) for p, it in zip(prompts, items, strict=False)
    )
    # max_requests_per_batch is the manager's slot count. num_blocks caps the KV cache, which on CPU
    # would otherwise be sized to 90% of system RAM (and zero-filled); 2x the need keeps preemption
    # out of the run.
    cb = ContinuousBatchingConfig(max_requests_per_batch=slots, num_blocks=2 * need)
    # The same hints generate_batch passes; with slots=None they size the batch to min(requests,
    # 1024)
    hints = WorkloadHints(
        max(map(len, prompts)), max(it.max_new_tokens for it in items), len(items)
    )
    # -1: no EOS, every request runs to its max_new_tokens
    gen = _greedy_config(model, eos_token_id=-1)
    with torch.inference_mode():  # the manager's thread copies the caller's inference mode
        manager = model.init_continuous_batching(
            generation_config=gen, continuous_batching_config=cb, workload_hints=hints
        )
        manager.warmup()  # builds the paged cache now, so it is not billed to the run
        sized = manager.continuous_batching_config.max_requests_per_batch
        manager.start()
        try:
            # One token of warm-up, as for hf_static, so one-time kernel setup is not billed to the
            # run
            _drain(manager, [manager.add_request(prompts[0], max_new_tokens=1, eos_token_id=-1)])
            start = time.perf_counter()
            ids = [
                manager.add_request(p, max_new_tokens=it.max_new_tokens, eos_token_id=-1)
                for p, it in zip(prompts, items, strict=False)
            ]
            done = _drain(manager, ids)
            wall = time.perf_counter() - start
        finally:
            manager.stop(block=True)
            manager.destroy()
    for rid, it in zip(ids, items, strict=False):
        if done[rid] != it.max_new_tokens:
            raise RuntimeError(f"{rid} produced {done[rid]} tokens, asked for {it.max_new_tokens}")
    note = f"max_requests_per_batch={sized}" + (
        " (set)" if slots is not None else " (manager's default)"
    )
    return _result("hf_continuous", items, wall, slots, note)


def main(argv: list[str] | None = None) -> int:
    """Both peers on the ``batching`` workload in this (fresh) process; ``--json`` writes them."""
    import argparse
    import json
    from dataclasses import asdict

    from engine.core.model import load_model
    from engine.workloads.canonical import batching_workload

    ap = argparse.ArgumentParser(prog="python -m engine.peer")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    mdl, tok = load_model("smollm2", "float32")
    work = batching_workload()
    results = [hf_static(mdl, tok, work, args.slots), hf_continuous(mdl, tok, work, args.slots)]
    for r in results:
        print(
            f"{r.name:14s} {r.useful_tokens} tok in {r.wall_s:6.1f} s = {r.tokens_per_s:5.1f} "
            f"tok/s  [{r.note}]"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({r.name: asdict(r) for r in results}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
