"""The roofline's model of a decode step, pure functions of its shape and the machine's measured
roofs (``engine.lab.roofline`` measures them): bytes read, operations, the arithmetic's bound,
where the step turns compute-bound, and the measured knee."""

from __future__ import annotations

from dataclasses import dataclass

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


def weight_flops(s: Shape, rows: int) -> int:
    """Multiply-adds x 2 of the projections and the vocabulary head for ``rows`` rows."""
    return 2 * rows * s.weight_params


def attention_flops(s: Shape, rows: int, ctx: int) -> int:
    """Multiply-adds x 2 of attention (QK^T and PV) over ``ctx`` cached tokens a row."""
    return 4 * rows * ctx * s.layers * s.heads * s.head_dim


def step_flops(s: Shape, rows: int, ctx: int) -> int:
    """Multiply-adds x 2 of the projections and of attention (QK^T and PV) for ``rows`` rows."""
    return weight_flops(s, rows) + attention_flops(s, rows, ctx)


def compute_ms(
    s: Shape, rows: int, ctx: int, gflops: float, attention_gflops: float | None = None
) -> float:
    """The arithmetic's lower bound: the weight products at ``gflops`` (the format's roof: fp32
    GEMM, or int8 ops for q4/q8), attention at ``attention_gflops`` (fp32; default the same)."""
    attn = attention_gflops or gflops
    return weight_flops(s, rows) / (gflops * 1e6) + attention_flops(s, rows, ctx) / (attn * 1e6)


def compute_bound_rows(
    s: Shape,
    ctx: int,
    bandwidth_gbs: float,
    gflops: float,
    rows: tuple[int, ...] = ROWS,
    attention_gflops: float | None = None,
) -> int | None:
    """The first row count whose arithmetic takes longer than its reading (``compute_ms`` over
    ``step_bytes`` / bandwidth; with one roof for everything, the point where the arithmetic
    intensity passes the machine balance), i.e. where compute, not memory, bounds the step."""
    for r in rows:
        read = step_bytes(s, r, ctx) / (bandwidth_gbs * 1e6)
        if compute_ms(s, r, ctx, gflops, attention_gflops) > read:
            return r
    return None


def knee_rows(rows: list[int], step_ms: list[float], growth: float = 1.5) -> int | None:
    """Measured: the first row count whose step takes ``growth`` x the one-row step (the point
    where adding rows stops being nearly free); None if no measured count gets there."""
    for r, t in zip(rows, step_ms, strict=False):
        if t >= growth * step_ms[0]:
            return r
    return None
