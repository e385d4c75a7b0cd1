"""The roofline of a decode step: ``python -m engine.bench roofline``.

A decode step reads every weight once, whatever the number of rows, plus each row's KV context;
it does ~2 operations per weight per row. So at few rows its time is bytes / memory bandwidth, and
only past the machine balance (peak operations/s over bytes/s) does the arithmetic dominate. This
module measures the machine's roofs in the same run (a large tensor sum for read bandwidth, a
large fp32 GEMM for fp32 flop/s, and, where the quantized kernels build, the int8 roof: maddubs +
add from registers, the instructions the q4/q8 products use), then the engine's own decode step at
1, 2, 4, ... 64 rows for each weight format, and reports bytes per step (counted, not timed),
achieved GB/s and the fraction of the bandwidth roof, the arithmetic's own bound (the format's
weight products at its roof, attention at the fp32 one), the share of the read roof the bound
leaves attainable, and where decode turns compute-bound.

The model is ``engine.lab.roofline_model`` (pure functions: ``step_bytes``, ``compute_ms``,
``compute_bound_rows``, ``knee_rows``); ``measure_*`` here time things.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from engine.lab.roofline_model import (
    ROWS,
    Shape,
    compute_bound_rows,
    compute_ms,
    knee_rows,
    step_bytes,
    step_flops,
)


# -- measurements ----------------------------------------------------------------------------------
def _times(fn: Callable[[], Any], reps: int) -> list[float]:
    fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def measure_bandwidth(mb: int = 512, reps: int = 10) -> dict[str, float]:
    """Read bandwidth: ``sum`` of a ``mb`` MB fp32 tensor (16x the 32 MB L3); copy: read + write.
    Best of ``reps``: on a shared machine the best run is the closest to the hardware's roof."""
    x = torch.ones(mb * (1 << 20) // 4)
    y = torch.empty_like(x)
    read = _times(lambda: x.sum(), reps)
    copy = _times(lambda: y.copy_(x), reps)
    nbytes = x.numel() * 4
    return {
        "read_gbs": nbytes / min(read) / 1e9,
        "read_gbs_median": nbytes / statistics.median(read) / 1e9,
        "copy_gbs": 2 * nbytes / min(copy) / 1e9,
        "mb": mb,
    }


def measure_gflops(n: int = 1536, reps: int = 10) -> dict[str, float]:
    """fp32 GEMM throughput: ``n x n @ n x n`` (2 n^3 flops), best of ``reps``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    t = _times(lambda: torch.mm(a, b), reps)
    return {
        "gflops": 2 * n**3 / min(t) / 1e9,
        "gflops_median": 2 * n**3 / statistics.median(t) / 1e9,
        "n": n,
    }


def measure_int8(reps: int = 5) -> dict[str, float] | None:
    """The int8 roof (``kernels.cpu_quant.int8_macs_per_s``: maddubs + add from registers, on
    torch's threads) in G int8 operations/s (2 per multiply-add), best of ``reps``; None where the
    quantized kernels do not build here."""
    from kernels import cpu_quant

    if not cpu_quant.available():
        return None
    ops = [2 * cpu_quant.int8_macs_per_s() / 1e9 for _ in range(reps)]
    return {"gops": max(ops), "gops_median": statistics.median(ops)}


def shape_of(forward, weights: str) -> Shape:
    """The decode step's shape for a ``LlamaForward`` with its weights in its format."""
    model = forward.model
    from engine.core.llama import projections

    mats = [m for layer in model.model.layers for m in projections(layer)] + [model.lm_head]
    params = sum(m.weight.numel() for m in mats)
    nbytes = (
        forward.quant.nbytes
        if forward.quant is not None
        else sum(m.weight.numel() * m.weight.element_size() for m in mats)
    )
    return Shape(
        params,
        nbytes,
        len(model.model.layers),
        forward.num_kv_heads,
        forward.num_heads,
        forward.head_dim,
        torch.finfo(forward.dtype).bits // 8,
    )


def decode_batch(rows: int, ctx: int, block_size: int):
    """A decode ``ForwardBatch`` of ``rows`` sequences, each with ``ctx`` tokens cached (the new
    token is the ctx-th), in disjoint blocks; returns (batch, blocks needed)."""
    from engine.core.llama import ForwardBatch
    from kernels.attention import decode_mask, slots_from_block_tables

    per = -(-ctx // block_size)
    tables = torch.arange(rows * per).view(rows, per)  # [rows, blocks per row]
    lens = torch.full((rows,), ctx, dtype=torch.long)
    slots = slots_from_block_tables(tables, lens, block_size)  # [rows, ctx]
    fb = ForwardBatch(
        input_ids=torch.arange(rows) % 1000 + 100,
        positions=lens - 1,
        write_slots=slots[:, -1].contiguous(),
        num_decode=rows,
        decode_slots=slots,
        decode_mask=decode_mask(lens, ctx),
        logits_rows=torch.arange(rows),
    )
    return fb, rows * per


@dataclass(slots=True)
class StepPoint:
    rows: int
    step_ms: float  # median of the reps
    step_ms_min: float
    step_ms_max: float
    bytes_per_step: int
    flops_per_step: int
    achieved_gbs: float  # bytes / median time
    fraction_of_bandwidth: float  # achieved / measured read bandwidth
    roofline_ms: float  # the model's lower bound: max(read_ms, compute_ms)
    tokens_per_s: float  # rows / median time
    read_ms: float  # bytes / measured read bandwidth
    compute_ms: float  # the arithmetic at the format's roof (``compute_ms``)
    attainable_fraction: float  # read_ms / roofline_ms: the most of the read roof a step can reach


def measure_decode(
    forwards: dict[str, Any],
    bandwidth_gbs: float,
    gflops: float | dict[str, float],
    attention_gflops: float,
    ctx: int = 128,
    rows: tuple[int, ...] = ROWS,
    reps: int = 7,
    block_size: int = 16,
) -> dict[str, Any]:
    """Decode steps of each ``LlamaForward`` (one per weight format) at each row count.

    ``gflops``: the weight products' compute roof, one for all formats or per format;
    ``attention_gflops``: attention's (fp32 in every format). Formats are interleaved rep by rep,
    so drift on the shared machine hits all of them alike.
    """
    roofs = gflops if isinstance(gflops, dict) else {n: gflops for n in forwards}
    from engine.core import device

    caches = {}
    batches = {r: decode_batch(r, ctx, block_size) for r in rows}
    need = max(n for _, n in batches.values()) + 1
    for name, fwd in forwards.items():
        caches[name] = device.run(fwd.new_cache, need, block_size)
        caches[name].k.normal_(0, 1)  # real numbers in the cache, as after a prefill
        caches[name].v.normal_(0, 1)
    samples: dict[str, dict[int, list[float]]] = {n: {r: [] for r in rows} for n in forwards}
    for name, fwd in forwards.items():  # warm-up: first touches, one-time allocations
        for r in rows:
            device.run(fwd.forward, batches[r][0], caches[name])
    for _ in range(reps):
        for r in rows:
            for name, fwd in forwards.items():
                t = time.perf_counter()
                device.run(fwd.forward, batches[r][0], caches[name])
                samples[name][r].append(time.perf_counter() - t)
    return {
        name: _format_result(
            shape_of(fwd, name),
            samples[name],
            ctx,
            rows,
            bandwidth_gbs,
            roofs[name],
            attention_gflops,
        )
        for name, fwd in forwards.items()
    }


def _format_result(
    s: Shape,
    samples: dict[int, list[float]],
    ctx: int,
    rows: tuple[int, ...],
    bandwidth_gbs: float,
    gflops: float,
    attention_gflops: float,
) -> dict[str, Any]:
    """One weight format's step times (seconds, per row count) against its roofline model."""
    points = []
    for r in rows:
        ts = samples[r]
        med = statistics.median(ts)
        nb, fl = step_bytes(s, r, ctx), step_flops(s, r, ctx)
        read = nb / (bandwidth_gbs * 1e6)
        comp = compute_ms(s, r, ctx, gflops, attention_gflops)
        bound = max(read, comp)
        points.append(
            StepPoint(
                r,
                1000 * med,
                1000 * min(ts),
                1000 * max(ts),
                nb,
                fl,
                nb / med / 1e9,
                nb / med / 1e9 / bandwidth_gbs,
                bound,
                r / med,
                read,
                comp,
                read / bound,
            )
        )
    return {
        "shape": asdict(s),
        "compute_roof_gops": gflops,
        "points": [asdict(p) for p in points],
        "compute_bound_rows_model": compute_bound_rows(
            s, ctx, bandwidth_gbs, gflops, rows, attention_gflops
        ),
        "knee_rows_measured": knee_rows(list(rows), [p.step_ms for p in points]),
    }


def roofline(
    model,
    tok,
    weights: tuple[str, ...] = ("fp32", "q8", "q4"),
    ctx: int = 128,
    rows: tuple[int, ...] = ROWS,
    reps: int = 7,
) -> dict[str, Any]:
    """The benchmark: both roofs, then decode steps per format; ``ratios`` for the README."""
    from engine.core import device
    from engine.core.llama import LlamaForward

    bw = device.run(measure_bandwidth)
    peak = device.run(measure_gflops)
    int8 = device.run(measure_int8)
    forwards = {w: device.run(LlamaForward, model, ctx + 2, w) for w in weights}
    effective = {w: f.weights for w, f in forwards.items()}
    # each format's weight products at its own roof: int8 where they run on the int8 kernels
    roofs = {
        w: int8["gops"] if int8 and effective[w] != "fp32" else peak["gflops"] for w in forwards
    }
    decode = measure_decode(forwards, bw["read_gbs"], roofs, peak["gflops"], ctx, rows, reps)
    bw_after = device.run(measure_bandwidth)  # the roof again: how much did the machine drift?
    runs = {
        f"{w} x{p['rows']}": {"step_ms": p["step_ms"], "throughput": p["tokens_per_s"]}
        for w, d in decode.items()
        for p in d["points"]
        if p["rows"] in (1, 8, 64)
    }
    return {
        "machine": {
            "bandwidth": bw,
            "bandwidth_after": bw_after,
            "matmul": peak,
            "int8": int8,
            "balance_flop_per_byte": peak["gflops"] / bw["read_gbs"],
        },
        "ctx": ctx,
        "effective_weights": effective,
        "formats": decode,
        "runs": runs,
        "ratios": _ratios(decode),
    }


def _ratios(decode: dict[str, Any]) -> dict[str, float]:
    """The README's numbers: each format's share of the read bandwidth at 8 rows and 1 row, and
    each quantized format's step speed-up over fp32 at 1 and 8 rows."""
    ratios: dict[str, float] = {}
    for w, d in decode.items():
        at = {p["rows"]: p for p in d["points"]}
        if 8 in at:
            ratios[f"{w}_fraction_of_bandwidth_8_rows"] = at[8]["fraction_of_bandwidth"]
            ratios[f"{w}_attainable_fraction_8_rows"] = at[8]["attainable_fraction"]
            ratios[f"{w}_fraction_of_its_roofline_8_rows"] = at[8]["roofline_ms"] / at[8]["step_ms"]
        if 1 in at:
            ratios[f"{w}_fraction_of_bandwidth_1_row"] = at[1]["fraction_of_bandwidth"]
    base = {p["rows"]: p["step_ms"] for p in decode.get("fp32", {}).get("points", [])}
    for w, d in decode.items():
        if w != "fp32" and base:
            for p in d["points"]:
                if p["rows"] in (1, 8):
                    ratios[f"{w}_step_speedup_over_fp32_{p['rows']}_rows"] = (
                        base[p["rows"]] / p["step_ms"]
                    )
    return ratios


def table(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"read bandwidth {m['bandwidth']['read_gbs']:.1f} GB/s (best; median "
        f"{m['bandwidth']['read_gbs_median']:.1f}; after the run "
        f"{m['bandwidth_after']['read_gbs']:.1f}), "
        f"fp32 GEMM {m['matmul']['gflops']:.0f} GFLOP/s (median "
        f"{m['matmul']['gflops_median']:.0f}), "
        f"balance {m['balance_flop_per_byte']:.1f} flop/byte; context {result['ctx']} tokens a row",
        (
            f"int8 roof {m['int8']['gops']:.0f} G ops/s (median {m['int8']['gops_median']:.0f}): "
            "maddubs + add from registers, the q4/q8 products' instructions"
            if m.get("int8")
            else "int8 roof: not measured (no quantized kernels here)"
        ),
        f"{'weights':<8}{'rows':>5}{'step ms':>9}{'min':>8}{'max':>8}{'MB/step':>9}{'GB/s':>7}"
        f"{'of roof':>8}{'read ms':>8}{'calc ms':>8}{'attain':>7}{'tok/s':>8}",
    ]
    for w, d in result["formats"].items():
        for p in d["points"]:
            lines.append(
                f"{w:<8}{p['rows']:>5}{p['step_ms']:>9.2f}{p['step_ms_min']:>8.2f}{p['step_ms_max']:>8.2f}"
                f"{p['bytes_per_step'] / 1e6:>9.1f}{p['achieved_gbs']:>7.1f}"
                f"{p['fraction_of_bandwidth']:>8.2f}{p['read_ms']:>8.2f}{p['compute_ms']:>8.2f}"
                f"{p['attainable_fraction']:>7.2f}{p['tokens_per_s']:>8.0f}"
            )
        lines.append(
            f"  {w}: compute roof {d['compute_roof_gops']:.0f} G ops/s; compute-bound from "
            f"{d['compute_bound_rows_model']} rows (roofline model); "
            f"measured knee (1.5x the 1-row step) at {d['knee_rows_measured']} rows"
        )
    for k, v in result["ratios"].items():
        lines.append(f"  {k:<40} {v:8.3f}")
    return "\n".join(lines)
