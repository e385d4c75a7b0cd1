# ruff: noqa: B023  (each lambda is timed inside the loop iteration that made it)
"""Kernel timings: the quantized CPU matmuls of ``kernels/cpu_quant.py`` (fp32 activations, and
the int8-activation ones the decode step uses) against oneDNN's packed fp32 and torch's own
int4/int8 packed CPU matmuls, on SmolLM2's projection shapes.

``python -m engine.lab.kernel_bench`` -- a measurement run by hand, not a test.
"""

from __future__ import annotations

import torch

from engine.core.packed import packed
from engine.core.quant import quantize
from kernels.cpu_quant import matmul, qmatmul


def main(reps: int = 40) -> None:  # pragma: no cover - a measurement, run by hand
    """Median ms per product on SmolLM2's shapes: oneDNN packed fp32, torch's int4/int8 packed
    CPU matmuls, and Fluxo's kernels (``python -m engine.lab.kernel_bench``)."""
    import time

    shapes = {
        "q 576x576": (576, 576),
        "k/v 192x576": (192, 576),
        "gate/up 1536x576": (1536, 576),
        "down 576x1536": (576, 1536),
        "qkv 960x576": (960, 576),
        "gate+up 3072x576": (3072, 576),
        "lm head 49152x576": (49152, 576),
    }

    def timed(fn, x) -> float:
        fn(x)
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn(x)
            ts.append(time.perf_counter() - t)
        # min: the machine is shared; a preempted OpenMP thread adds whole scheduler slices
        return 1000 * min(ts)

    print(
        f"{'shape':<20}{'rows':>5}"
        + "".join(
            f"{c:>12}"
            for c in (
                "fp32 onednn",
                "int8pack",
                "int4pack",
                "q8_0 ours",
                "q4_1 ours",
                "q8_0 int8",
                "q4_1 int8",
            )
        )
    )
    for label, (n, k) in shapes.items():
        w = torch.randn(n, k) * 0.05
        lin = torch.nn.Linear(k, n, bias=False)
        lin.weight.data.copy_(w)
        dense = packed(lin)
        b8, b4 = quantize(w, "q8_0"), quantize(w, "q4_1")
        i8 = (w / (w.abs().amax(1, keepdim=True) / 127)).round().to(torch.int8)
        s8 = w.abs().amax(1) / 127
        lo, hi = w.view(n, k // 32, 32).amin(-1), w.view(n, k // 32, 32).amax(-1)
        sc = (hi - lo) / 15
        q4 = ((w.view(n, k // 32, 32) - lo[..., None]) / sc[..., None]).round().clamp(0, 15)
        q4 = q4.reshape(n, k).to(torch.int32)
        sz = torch.stack((sc, lo + 8 * sc), -1).transpose(0, 1).contiguous()  # [K/32, N, 2]
        try:
            p4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4, 1)
            int4 = lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, p4, 32, sz)  # noqa: E731
        except RuntimeError:
            int4 = None
        for m in (1, 8, 32):
            x = torch.randn(m, k)
            cells = [
                timed(dense, x),
                timed(lambda x: torch.ops.aten._weight_int8pack_mm(x, i8, s8), x),
                timed(int4, x) if int4 else float("nan"),
                timed(lambda x: matmul(x, b8, "q8_0"), x),
                timed(lambda x: matmul(x, b4, "q4_1"), x),
                timed(lambda x: qmatmul(x, b8, "q8_0"), x),
                timed(lambda x: qmatmul(x, b4, "q4_1"), x),
            ]
            print(f"{label:<20}{m:>5}" + "".join(f"{c:>12.3f}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
