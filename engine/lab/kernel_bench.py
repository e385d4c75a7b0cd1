"""Kernel timings: the quantized CPU matmuls of ``kernels/cpu_quant.py`` (fp32 activations, and
the int8-activation ones the decode step uses: one-row kernels at 1 row and for Q8_0, 8x4 tiles for
Q4_1 from 2 rows) against oneDNN's packed fp32 and torch's own int4/int8 packed CPU matmuls, on
SmolLM2's projection shapes.

``python -m engine.lab.kernel_bench`` -- a measurement run by hand, not a test. Each cell is the
best of ``reps`` wall-clock times in ms (the machine is shared; a preempted OpenMP thread adds
whole scheduler slices) and, after the slash, the median thread CPU time of the calling thread.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from engine.core.packed import packed
from engine.core.quant import quantize
from kernels.cpu_quant import matmul, qmatmul

SHAPES = {  # label: (N, K) of y = x @ W.T
    "q 576x576": (576, 576),
    "k/v 192x576": (192, 576),
    "gate/up 1536x576": (1536, 576),
    "down 576x1536": (576, 1536),
    "qkv 960x576": (960, 576),
    "gate+up 3072x576": (3072, 576),
    "lm head 49152x576": (49152, 576),
}
COLUMNS = (
    "fp32 onednn",
    "int8pack",
    "int4pack",
    "q8_0 ours",
    "q4_1 ours",
    "q8_0 int8",
    "q4_1 int8",
)
ROWS = (1, 2, 4, 8, 32)

Product = Callable[[torch.Tensor], torch.Tensor]


def timed(fn: Product | None, x: torch.Tensor, reps: int) -> str:
    """``best wall ms/median thread-CPU ms`` of ``fn(x)`` over ``reps`` calls after one warm-up."""
    if fn is None:
        return "-"
    fn(x)
    wall, cpu = [], []
    for _ in range(reps):
        t, c = time.perf_counter(), time.thread_time()
        fn(x)
        wall.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
    return f"{1000 * min(wall):.3f}/{1000 * statistics.median(cpu):.3f}"


def torch_packed(w: torch.Tensor) -> tuple[Product, Product | None]:
    """torch's int8 weight-only product and its int4 one (None where this build lacks it)."""
    n, k = w.shape
    s8 = w.abs().amax(1) / 127
    i8 = (w / s8[:, None]).round().to(torch.int8)
    blocks = w.view(n, k // 32, 32)  # [N, nb, 32]
    lo, sc = blocks.amin(-1), (blocks.amax(-1) - blocks.amin(-1)) / 15  # [N, nb]
    q4 = ((blocks - lo[..., None]) / sc[..., None]).round().clamp(0, 15)
    sz = torch.stack((sc, lo + 8 * sc), -1).transpose(0, 1).contiguous()  # [nb, N, 2]
    int8 = lambda x: torch.ops.aten._weight_int8pack_mm(x, i8, s8)  # noqa: E731
    try:
        p4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4.reshape(n, k).int(), 1)
    except RuntimeError:
        return int8, None
    return int8, lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, p4, 32, sz)


def products(w: torch.Tensor) -> list[Product | None]:
    """The seven products of ``COLUMNS`` for the weight ``w [N, K]``."""
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight.data.copy_(w)
    b8, b4 = quantize(w, "q8_0"), quantize(w, "q4_1")
    int8, int4 = torch_packed(w)
    return [
        packed(lin),
        int8,
        int4,
        lambda x: matmul(x, b8, "q8_0"),
        lambda x: matmul(x, b4, "q4_1"),
        lambda x: qmatmul(x, b8, "q8_0"),
        lambda x: qmatmul(x, b4, "q4_1"),
    ]


def main(reps: int = 40) -> None:  # pragma: no cover - a measurement, run by hand
    """Every product on every shape and row count (``python -m engine.lab.kernel_bench``)."""
    print(f"threads {torch.get_num_threads()}; cells: best wall ms / median thread CPU ms")
    print(f"{'shape':<20}{'rows':>5}" + "".join(f"{c:>16}" for c in COLUMNS))
    for label, (n, k) in SHAPES.items():
        fns = products(torch.randn(n, k) * 0.05)
        for m in ROWS:
            x = torch.randn(m, k)
            cells = [timed(fn, x, reps) for fn in fns]
            print(f"{label:<20}{m:>5}" + "".join(f"{c:>16}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
