"""Linear layers with weights pre-packed for oneDNN on the CPU.

A decode step multiplies a handful of rows by every weight matrix, so it is bound by how fast the
weights stream from memory. oneDNN's pre-packed layout streams about twice as fast as the plain
GEMM for such skinny products (measured on the 2-core AVX-512 machine: 60 MLP-sized matrices at 8
rows, 20.0 -> 10.5 ms; the 49152-row vocabulary projection, 17.9 -> 4.1 ms). Results differ from
the plain product only by float rounding order. float64 (the exact tests) and CUDA keep the module.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Linear = Callable[[torch.Tensor], torch.Tensor]


# Below this many weights the packed call's fixed cost wins: 8 rows by a 16x16 or 256x16 weight
# (the policy scorer's counting stand-in) took 14.6-15.0 us packed and 4.8-5.8 us plain, one
# thread, AVX-512 EPYC, 2026-12-07; 576x576 took 68 packed, 95 plain.
MIN_PACKED = 1 << 14


def packable(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
    )


def packed(module: torch.nn.Linear, rows_hint: int = 8) -> Linear:
    """A callable equal to ``module`` (up to rounding), backed by a packed copy of its weight."""
    weight = module.weight.detach()
    if not packable(weight) or weight.numel() < MIN_PACKED:
        return module
    bias = module.bias.detach() if module.bias is not None else None
    w = torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)

    def linear(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")

    return linear
