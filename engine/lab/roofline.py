"""The roofline of a decode step: ``python -m engine.bench roofline``.

A decode step reads every weight once, whatever the number of rows, plus each row's KV context;
it does ~2 flops per weight per row. So at few rows its time is bytes / memory bandwidth, and
only past the machine balance (peak flop/s over bytes/s) does the arithmetic dominate. This module
measures the machine's two roofs in the same run (a large tensor sum for read bandwidth, a large
fp32 GEMM for flop/s), then the engine's own decode step at 1, 2, 4, ... 64 rows for each weight
format, and reports bytes per step (counted, not timed), achieved GB/s and the fraction of the
bandwidth roof, and where decode turns compute-bound.

The pure functions (``step_bytes``, ``step_flops``, ``roofline_ms``, ``compute_bound_rows``,
``knee_rows``) are the model; ``measure_*`` time things.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

ROWS = (1, 2, 4, 8, 16, 32, 64)


# -- the model (pure) ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Shape:
    """What one decode step of a Llama model touches, independent of the machine."""

    weight_params: int  # parameters of every matrix a step multiplies (layers' 7 + vocabulary head)
    weight_bytes: int  # their bytes in the weight format
    layers: int
    kv_heads: int
    heads: int
    head_dim: int
    kv_itemsize: int  # bytes per cached K or V element


def step_bytes(s: Shape, rows: int, ctx: int) -> int:
    """Bytes read from memory by one decode step: the weights once, plus each row's K and V."""
    kv = rows * ctx * s.layers * 2 * s.kv_heads * s.head_dim * s.kv_itemsize
    return s.weight_bytes + kv


def step_flops(s: Shape, rows: int, ctx: int) -> int:
    """Multiply-adds x 2 of the projections and of attention (QK^T and PV) for ``rows`` rows."""
    return 2 * rows * s.weight_params + 4 * rows * ctx * s.layers * s.heads * s.head_dim


def roofline_ms(nbytes: int, flops: int, bandwidth_gbs: float, gflops: float) -> float:
    """The roofline's lower bound on a step's time: the slower of reading and computing."""
    return max(nbytes / (bandwidth_gbs * 1e6), flops / (gflops * 1e6))


def compute_bound_rows(
    s: Shape, ctx: int, bandwidth_gbs: float, gflops: float, rows: tuple[int, ...] = ROWS
) -> int | None:
    """The first row count whose arithmetic intensity (flop/byte) exceeds the machine balance
    (gflops / bandwidth), i.e. where the roofline says compute, not memory, bounds the step."""
    balance = gflops / bandwidth_gbs
    for r in rows:
        if step_flops(s, r, ctx) / step_bytes(s, r, ctx) > balance:
            return r
    return None


def knee_rows(rows: list[int], step_ms: list[float], growth: float = 1.5) -> int | None:
    """Measured: the first row count whose step takes ``growth`` x the one-row step (the point
    where adding rows stops being nearly free); None if no measured count gets there."""
    for r, t in zip(rows, step_ms, strict=False):
        if t >= growth * step_ms[0]:
            return r
    return None


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
    roofline_ms: float  # the model's lower bound
    tokens_per_s: float  # rows / median time


def measure_decode(
    forwards: dict[str, Any],
    bandwidth_gbs: float,
    gflops: float,
    ctx: int = 128,
    rows: tuple[int, ...] = ROWS,
    reps: int = 7,
    block_size: int = 16,
) -> dict[str, Any]:
    """Decode steps of each ``LlamaForward`` (one per weight format) at each row count.

    Formats are interleaved rep by rep, so drift on the shared machine hits all of them alike.
    """
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
        name: _format_result(shape_of(fwd, name), samples[name], ctx, rows, bandwidth_gbs, gflops)
        for name, fwd in forwards.items()
    }


def _format_result(
    s: Shape,
    samples: dict[int, list[float]],
    ctx: int,
    rows: tuple[int, ...],
    bandwidth_gbs: float,
    gflops: float,
) -> dict[str, Any]:
    """One weight format's step times (seconds, per row count) against its roofline model."""
    points = []
    for r in rows:
        ts = samples[r]
        med = statistics.median(ts)
        nb, fl = step_bytes(s, r, ctx), step_flops(s, r, ctx)
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
                roofline_ms(nb, fl, bandwidth_gbs, gflops),
                r / med,
            )
        )
    return {
        "shape": asdict(s),
        "points": [asdict(p) for p in points],
        "compute_bound_rows_model": compute_bound_rows(s, ctx, bandwidth_gbs, gflops, rows),
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
    forwards = {w: device.run(LlamaForward, model, ctx + 2, w) for w in weights}
    effective = {w: f.weights for w, f in forwards.items()}
    decode = measure_decode(forwards, bw["read_gbs"], peak["gflops"], ctx, rows, reps)
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
        f"{'weights':<8}{'rows':>5}{'step ms':>9}{'min':>8}{'max':>8}{'MB/step':>9}{'GB/s':>7}"
        f"{'of roof':>8}{'roof ms':>8}{'tok/s':>8}",
    ]
    for w, d in result["formats"].items():
        for p in d["points"]:
            lines.append(
                f"{w:<8}{p['rows']:>5}{p['step_ms']:>9.2f}{p['step_ms_min']:>8.2f}{p['step_ms_max']:>8.2f}"
                f"{p['bytes_per_step'] / 1e6:>9.1f}{p['achieved_gbs']:>7.1f}"
                f"{p['fraction_of_bandwidth']:>8.2f}{p['roofline_ms']:>8.2f}{p['tokens_per_s']:>8.0f}"
            )
        lines.append(
            f"  {w}: compute-bound from {d['compute_bound_rows_model']} rows (roofline model); "
            f"measured knee (1.5x the 1-row step) at {d['knee_rows_measured']} rows"
        )
    for k, v in result["ratios"].items():
        lines.append(f"  {k:<40} {v:8.3f}")
    return "\n".join(lines)
