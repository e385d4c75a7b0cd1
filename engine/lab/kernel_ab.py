"""``python -m engine.bench kernels [--against REV]``: the quantized decode step on the working
tree's CPU kernels against a git revision's, in one process, step by step in turn.

On this project's 2-core machine a step's time moves by up to 1.5x from one process to the next
(2026-12-01, 01:00-01:10 UTC, a quiet machine: five runs of one build timed the same 8-row q4 step
at 13.0-19.3 ms, medians of 40-60 steps each), so two runs made one after the other cannot show a
5 % change. Here both builds are loaded side by side (``kernels.cpu_quant_build``: each source
version compiles to its own library) and take turns, A B then B A, on the same batch and cache. The
ratio of each pair is taken; their median and quartiles are reported, with whether the two builds'
logits are bit for bit equal. Same day, same machine: a regrouped attention loop (each K and V row
read once for the three query heads of a KV head) measured tree/HEAD 1.062 and 1.063 at 8 rows
(quartiles 1.007-1.110 and 1.025-1.103) in two such runs, bit for bit equal, and was not kept.
The working tree against itself (``--against HEAD``, 100 pairs): 1.001 at 1 row and 0.995 at 8
(quartiles 0.970-1.027, 0.963-1.024). Against ``18f54f5~1``, the kernels before the exponentials
went 8 at a time: 0.983 at 1 row and 0.907 at 8 (quartiles 0.882-0.934), logits not bit for bit
equal (exp8 is within 1.2e-7 of expf).

The weight tiles are packed once, at load, by the working tree's build; a revision whose tile
layout differs computes other logits, and ``identical`` says so.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import torch

from engine.core.llama import LlamaForward
from engine.core.metrics import median, percentile
from engine.lab.roofline import decode_batch
from kernels import cpu_quant, cpu_quant_build

Result = dict[str, Any]


def source_at(rev: str) -> str:
    """The kernels of git revision ``rev`` as the one translation unit they compile as; raises
    ValueError when git cannot read them there."""
    root = cpu_quant_build.HERE.parent
    parts = []
    for name in cpu_quant_build.NAMES:
        try:
            proc = subprocess.run(
                ["git", "-C", str(root), "show", f"{rev}:kernels/{name}"],
                capture_output=True,
                text=True,
            )
        except OSError as exc:  # no git on this machine
            raise ValueError(f"cannot run git to read the kernels at {rev!r}: {exc}") from None
        if proc.returncode != 0 and name in cpu_quant_build.LATER:
            continue  # a file the kernels were split into after that revision
        if proc.returncode != 0:
            why = proc.stderr.strip() or f"git exited with {proc.returncode}"
            raise ValueError(f"cannot read kernels/{name} at {rev!r}: {why}")
        parts.append(proc.stdout)
    return "\n".join(parts)


def _in_turn(fw, fb, cache, base, tree, pairs: int) -> Result:
    """One batch's step on each build, ``pairs`` times in turn (A B, then B A): medians, the
    pairs' ratio quartiles, and whether the last logits of the two are bit for bit equal."""
    times: dict[str, list[float]] = {"base": [], "tree": []}
    logits: dict[str, torch.Tensor] = {}
    order = (("base", base), ("tree", tree))
    for i in range(pairs + 1):  # pair 0 warms both builds up and is not counted
        for name, lib in order if i % 2 else order[::-1]:
            with cpu_quant.using(lib):
                t = time.perf_counter()
                logits[name] = fw.forward(fb, cache)
                dt = time.perf_counter() - t
            if i:
                times[name].append(dt * 1e3)
    ratios = [t / b for b, t in zip(times["base"], times["tree"], strict=True)]
    return {
        "base_ms": median(times["base"]),
        "tree_ms": median(times["tree"]),
        "ratio_median": median(ratios),
        "ratio_p25": percentile(ratios, 25),
        "ratio_p75": percentile(ratios, 75),
        "identical": bool(torch.equal(logits["base"], logits["tree"])),
    }


def prefill_batch(n: int):
    """One prompt chunk of ``n`` tokens from position 0 (slots 0 .. n - 1), its last row sampled:
    a ``ForwardBatch`` as the model runner makes it for a whole prompt."""
    from engine.core.llama import ForwardBatch, PrefillSpan

    slots = torch.arange(n, dtype=torch.long)
    return ForwardBatch(
        input_ids=torch.arange(n) % 1000 + 100,
        positions=torch.arange(n),
        write_slots=slots,
        num_decode=0,
        decode_slots=None,
        decode_mask=None,
        prefills=[PrefillSpan(0, n, 0, slots)],
        logits_rows=torch.tensor([n - 1]),
    )


def compare(
    model,
    against: str = "HEAD",
    rows: tuple[int, ...] = (1, 8),
    pairs: int = 100,
    ctx: int = 128,
    block_size: int = 16,
    base_build: str = "avx2",
    prompts: tuple[int, ...] = (512,),
) -> Result:
    """Time the q4 decode step of ``rows`` sequences with ``ctx`` cached tokens, and the prefill
    of one ``prompts`` token chunk, on the revision's kernels ("base") and the working tree's
    ("tree"): ``pairs`` pairs each for decode, a tenth of that (at least 5) for prefill, after
    one warm-up pair."""
    tree = cpu_quant.library()
    if tree is None:
        raise RuntimeError(f"quantized CPU kernels unavailable: {cpu_quant.unavailable_reason()}")
    base = cpu_quant_build.load(source_at(against), strict=False, build=base_build)
    if not hasattr(base, "fluxo_forward_step") and not hasattr(base, "fluxo_decode_step"):
        raise ValueError(f"the kernels at {against!r} have no one-call decode step to time")
    fw = LlamaForward(model, max(ctx, *prompts) + 8, "q4")
    if fw.fused is None:
        raise RuntimeError("this model has no fused q4 decode step (engine/core/quant.py)")
    points = []
    for r in rows:
        fb, blocks = decode_batch(r, ctx, block_size)
        cache = fw.new_cache(blocks + 1, block_size)
        gen = torch.Generator().manual_seed(0)
        cache.k.normal_(generator=gen)
        cache.v.normal_(generator=gen)
        points.append({"rows": r, **_in_turn(fw, fb, cache, base, tree, pairs)})
    for n in prompts:
        cache = fw.new_cache(-(-n // block_size) + 1, block_size)
        runs = _in_turn(fw, prefill_batch(n), cache, base, tree, max(5, pairs // 10))
        points.append({"rows": n, "prefill": True, **runs})
    return {
        "against": against,
        "builds": {"base": base_build, "tree": cpu_quant.build_name()},
        "pairs": pairs,
        "ctx": ctx,
        "points": points,
        "ratios": {
            f"tree_over_base_{'prefill' if p.get('prefill') else 'step'}_{p['rows']}_rows": p[
                "ratio_median"
            ]
            for p in points
        },
    }


def table(result: Result) -> str:
    rev = result["against"]
    lines = [
        f"q4 decode step and prompt chunk, working tree ({result['builds']['tree']}) vs {rev} "
        f"({result['builds']['base']}): {result['pairs']} pairs in turn (prefill: a tenth), "
        f"decode context {result['ctx']} tokens a row",
        f"{'step':>7} {'rows':>4} {rev + ' ms':>12} {'tree ms':>9} {'tree/base':>9}"
        f" {'p25':>6} {'p75':>6}  identical",
    ]
    for p in result["points"]:
        lines.append(
            f"{'prefill' if p.get('prefill') else 'decode':>7} {p['rows']:>4}"
            f" {p['base_ms']:>12.2f} {p['tree_ms']:>9.2f} {p['ratio_median']:>9.3f}"
            f" {p['ratio_p25']:>6.3f} {p['ratio_p75']:>6.3f}  {p['identical']}"
        )
    return "\n".join(lines)
