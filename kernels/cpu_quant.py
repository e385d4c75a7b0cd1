"""CPU matmuls that read GGUF-style quantized weights directly (Q4_1 and Q8_0 blocks), and the
whole quantized decode step in one call.

A decode step reads every weight once and does ~2 flops per weight per row, so at a few rows it is
bound by how many bytes the weights take. These kernels keep the weights in the GGUF's own block
layout (Q4_1: fp16 scale d, fp16 min m, 16 bytes of nibbles per 32 weights, 20 bytes = 5 bits a
weight; Q8_0: fp16 d + 32 int8, 34 bytes) and dequantize each block in registers (AVX2 + FMA +
F16C), multiplying it into up to 4 fp32 activation rows at a time (``matmul``: the result equals
``x @ dequant(W).T`` up to summation order).

The serving path (``qmatmul``, ``forward_step``; ``cpu_quant_decode.cpp``) quantizes activations to
int8 per 32 (llama.cpp's Q8_1: scale max|x|/127 and the block sum) and multiplies blocks with
integer dot products (``_mm256_maddubs_epi16``), 4 conversions and 4 fmas a block fewer, the
vocabulary head included. Measured 2026-11-30 (thread CPU time, p10 of 200, 1 thread, machine at
load ~11): gate+up 3072x576 at 1 row 0.244 ms fp32 activations -> 0.134 int8, at 8 rows 0.874 ->
0.736; the head 49152x576 Q8_0 at 1 row 6.05 -> 4.92 ms, and (medians, load ~10) at 8 rows
14.6 -> 8.0 ms. From 2 activation rows, Q4_1 products (and, since, the Q8_0 head) run 8x4
register tiles (``cpu_quant_tile.cpp``: 8 weight rows per maddubs, the next tile prefetched while
one computes), at first on each weight block unpacked once per call, now on a copy of the weights
rearranged at load (``tiles``: the same bytes per weight, nibbles unpacked in registers). The
whole SmolLM2 q4 decode step (ctx 128, 1 thread, process CPU ms, median of 9; three A/B pairs at
load 4-10), before -> after the tiles and the int8 head: 8 rows 52.2, 52.2, 71.6 -> 35.4, 43.6,
46.8; 2 rows 23.2, 23.7, 32.3 -> 16.6, 21.0, 21.4; 1 row 15.1, 15.6, 21.7 -> 15.4, 17.9, 19.3
(unchanged within noise).
At 2 threads, once the machine fell quiet (load ~1, 13:04 UTC; A B A B, two pairs):
``engine.lab.roofline.roofline(weights=("q4",), rows=(1, 8), reps=7)`` 8 rows 53.5, 35.9 ->
25.2, 27.3 ms a step (0.17, 0.22 -> 0.34, 0.30 of the read roof measured in the same run), 1 row
13.1, 10.8 -> 11.7, 10.2; the ``batching`` workload, continuous, 8 slots: 143.9, 151.4 -> 255.2,
205.1 useful tokens/s (69.4, 73.2 -> 121.1, 98.1 per CPU second; 259 steps in every run).
Then ``python -m engine.bench peer`` and ``roofline`` (2 threads, load 0-2, 13:06-13:16 UTC):
``batching`` at 8 slots 209.6 useful tokens/s vs llama.cpp's server 82.9 (2.53x), one stream
91.4 vs ``llama-bench`` tg64 65.3 (1.40x); the q4 step at 8 rows 27.8 ms = 0.31 of the 16.9 GB/s
read roof (1 row 10.7 ms, 0.56). What is left at 8 rows (1-thread profile): the tiles'
arithmetic ~40 %, attention over the fp32 KV cache ~25 %, the Q8_0 head ~19 %, packing ~11 %.
``forward_step`` runs every layer, the final norm and the head in one OpenMP region, for decode
rows and prompt-chunk rows alike, each row's numbers independent of the others' (the same
tokens under any schedule): each
product's output rows split over the threads, 6 barriers a layer, norms and activation
quantization repeated per thread instead of a barrier each, SwiGLU and the residual adds in the
products' epilogues, paged attention over the KV cache in place.

The C++ sources (``cpu_quant.cpp``, ``cpu_quant_int8.cpp``, ``cpu_quant_tile.cpp``,
``cpu_quant_attend.cpp``, ``cpu_quant_decode.cpp``, one translation unit) are compiled with g++
at first use into the Fluxo cache (about 3 s) and called through ctypes with raw pointers; OpenMP
splits the output rows over torch's own thread count (the .so links ``libgomp.so.1``, which
resolves to the copy torch already loaded: one thread pool).
One source builds for x86-64 (AVX2 + FMA + F16C; AVX-512 VNNI) and ARM64 (NEON + the dot-product
extension: Apple Silicon), bit-identical results either way (``cpu_quant_build.BUILDS``); without
OpenMP (Apple clang without libomp) the same build runs on one thread. ``available()`` is False
where no build runs (no compiler, no such CPU, ``FLUXO_KERNELS=fp32``); ``unavailable_reason()``
and ``unavailable_code()`` say why, and callers fall back to fp32.

Chosen by measurement against oneDNN fp32 and torch's int8/int4 packed matmuls (2026-11-30,
``python -m kernels.cpu_quant``; the table and its reading: docs/benchmarks.md, "Choosing the CPU
quantized kernels"): above ``engine.core.quant.DEQUANT_ABOVE_ROWS`` rows a fp32-activation
``QuantLinear`` dequantizes and runs oneDNN's GEMM instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator

import torch

from kernels import cpu_quant_build

QK = 32  # weights per block (both formats)
Q4_1_BYTES = 20  # fp16 d, fp16 m, 16 bytes of 4-bit values
Q8_0_BYTES = 34  # fp16 d, 32 int8 values

_lib: ctypes.CDLL | None = None
_error: str | None = None
_error_code: str | None = None
_lock = threading.Lock()
Unavailable = cpu_quant_build.KernelsUnavailable


def _load() -> ctypes.CDLL:
    """Compile (once per source version and build) and load the working tree's kernels, the build
    this CPU runs best (``cpu_quant_build.choose_build``); raises ``Unavailable`` with the
    reason."""
    forced = os.environ.get("FLUXO_KERNELS", "").strip()
    try:
        build = cpu_quant_build.choose_build()
    except ValueError as exc:
        raise Unavailable("unknown_build", str(exc)) from None
    if build is None:
        if forced == "fp32":
            raise Unavailable("forced_fp32", "FLUXO_KERNELS=fp32 asks for no kernels")
        why = cpu_quant_build.why_no_build()
        raise Unavailable("cpu_lacks", f"no kernel build for this CPU ({why})")
    try:
        return cpu_quant_build.load(build=build)
    except Unavailable as exc:
        if forced:  # say that the build was forced: the CPU's best one might have run
            raise Unavailable(exc.code, f"FLUXO_KERNELS={forced}: {exc}") from None
        raise


def build_name() -> str | None:
    """Which build serves (``avx512vnni``, ``avxvnni``, ``avx2``, ``neon``), or None where the
    kernels are unavailable."""
    lib = library()
    return getattr(lib, "fluxo_build", None) if lib is not None else None


def build_note() -> str | None:
    """What to know about the build that serves, or None: "built without OpenMP: 1 thread" where
    the compiler had none (Apple clang without libomp)."""
    lib = library()
    if lib is not None and not getattr(lib, "fluxo_threads_ok", True):
        return "built without OpenMP: 1 thread"
    return None


@contextlib.contextmanager
def using(lib: ctypes.CDLL) -> Iterator[None]:
    """Every kernel call in the block goes to ``lib`` (one ``cpu_quant_build.load`` returned): for
    timing two builds in one process (``engine.lab.kernel_ab``)."""
    global _lib
    saved = library()
    _lib = lib
    try:
        yield
    finally:
        _lib = saved


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None (``unavailable_reason()`` says why)."""
    global _lib, _error, _error_code
    with _lock:
        if _lib is None and _error is None:
            try:
                _lib = _load()
            except (RuntimeError, OSError) as e:
                _error = str(e)
                _error_code = getattr(e, "code", "load_failed")
        return _lib


def serving(weights: str, asked: str, device: str) -> tuple[str | None, str | None]:
    """The build serving ``weights`` (avx512vnni, avxvnni, avx2, neon; None on fp32) and what the
    page says beside it: a note on that build (built without OpenMP), or why ``asked`` q4/q8 is
    served as fp32 on the CPU (the kernels' own reason), else None."""
    if weights != "fp32":
        return build_name(), build_note()
    if asked != "fp32" and device == "cpu":
        return None, unavailable_reason() or "the model is not an fp32 CPU model"
    return None, None


def available() -> bool:
    return library() is not None


def unavailable_reason() -> str | None:
    library()
    return _error


def unavailable_code() -> str | None:
    """``unavailable_reason()``'s stable code (``cpu_quant_build.KernelsUnavailable``), or
    ``load_failed`` (the library would not load), or None."""
    library()
    return _error_code


BYTES = {"q4_1": Q4_1_BYTES, "q8_0": Q8_0_BYTES}
# forward_step's phases, in cpu_quant_decode.cpp's order (enum Phase)
PHASES = ("products", "head", "attention", "norms", "waits")


def _check(blocks: torch.Tensor, fmt: str, k: int) -> None:
    if fmt not in BYTES:
        raise ValueError(f"unknown block format {fmt!r}")
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or not blocks.is_contiguous():
        raise ValueError("blocks must be a contiguous uint8 [N, K/32 * bytes] tensor")
    if k % QK or blocks.shape[1] != k // QK * BYTES[fmt]:
        raise ValueError(f"blocks of width {blocks.shape[1]} do not hold K={k} weights as {fmt}")


def matmul(x: torch.Tensor, blocks: torch.Tensor, fmt: str) -> torch.Tensor:
    """``x [M, K] fp32 @ dequant(blocks [N, ...]).T -> [M, N] fp32`` with the compiled kernel."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"quantized CPU kernels unavailable: {_error}")
    m, k = x.shape
    _check(blocks, fmt, k)
    x = x.contiguous()
    if x.dtype != torch.float32:
        raise ValueError("the quantized kernels take fp32 activations")
    n = blocks.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    if m:
        fn = lib.fluxo_q4_1_mm if fmt == "q4_1" else lib.fluxo_q8_0_mm
        fn(x.data_ptr(), m, k, blocks.data_ptr(), n, y.data_ptr(), torch.get_num_threads())
    return y


def dequantize(blocks: torch.Tensor, fmt: str, k: int) -> torch.Tensor:
    """``[N, K]`` fp32 weights of ``blocks`` with the compiled kernel (same rounding as matmul)."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"quantized CPU kernels unavailable: {_error}")
    _check(blocks, fmt, k)
    out = torch.empty(blocks.shape[0], k, dtype=torch.float32)
    fn = lib.fluxo_q4_1_dequant if fmt == "q4_1" else lib.fluxo_q8_0_dequant
    fn(blocks.data_ptr(), blocks.shape[0], k, out.data_ptr(), torch.get_num_threads())
    return out


def _lib_or_raise() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError(f"quantized CPU kernels unavailable: {_error}")
    return lib


def quantize_q8_1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 ``[M, K]`` -> the kernels' int8 activations: ``q [M, K]`` int8, ``d`` and ``s``
    ``[M, K/32]``
    (scale ``max|x| / 127`` per 32, and ``d * sum(q)``)."""
    lib = _lib_or_raise()
    x = x.contiguous()
    m, k = x.shape
    if k % QK or x.dtype != torch.float32:
        raise ValueError("quantize_q8_1 takes fp32 rows of a multiple of 32")
    q = torch.empty(m, k, dtype=torch.int8)
    d, s = torch.empty(m, k // QK), torch.empty(m, k // QK)
    lib.fluxo_quantize_q8_1(x.data_ptr(), m, k, q.data_ptr(), d.data_ptr(), s.data_ptr())
    return q, d, s


def tiles(blocks: torch.Tensor, fmt: str, k: int) -> torch.Tensor:
    """``blocks [N, ...]`` in the register tiles' layout (``cpu_quant_tile.cpp``), once at load:
    the same bytes (Q4_1: 4 bits a weight, fp16 d and m; Q8_0: int8 and fp16 d) per 8-row tile,
    rearranged so that the tiles read them in place; the last ``N mod 8`` rows stay as they are."""
    lib = _lib_or_raise()
    _check(blocks, fmt, k)
    out = torch.empty_like(blocks)
    fn = lib.fluxo_q4_1_tiles if fmt == "q4_1" else lib.fluxo_q8_0_tiles
    fn(blocks.data_ptr(), blocks.shape[0], k, out.data_ptr())
    return out


def qmatmul(
    x: torch.Tensor,
    blocks: torch.Tensor,
    fmt: str,
    swiglu: bool = False,
    tiles: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [M, K] @ dequant(blocks).T`` with ``x`` quantized to int8 per 32 (``quantize_q8_1``) and
    integer dot products, as the decode step computes it. ``swiglu``: the blocks are gate rows then
    up rows, and the result is ``silu(gate) * up`` ``[M, N/2]``. ``tiles``: ``tiles(blocks)``, read
    by the products at 2 or more rows (Q4_1: the same numbers, without packing each tile per call;
    Q8_0: tiles instead of the one-row kernel, equal up to fp32 summation order)."""
    lib = _lib_or_raise()
    m, k = x.shape
    _check(blocks, fmt, k)
    if tiles is not None and tiles.shape != blocks.shape:
        raise ValueError("tiles must be cpu_quant.tiles(blocks)")
    x = x.contiguous()
    if x.dtype != torch.float32:
        raise ValueError("the quantized kernels take fp32 activations")
    n = blocks.shape[0]
    y = torch.empty(m, n // 2 if swiglu else n, dtype=torch.float32)
    if m:
        lib.fluxo_qmm(
            x.data_ptr(),
            m,
            k,
            blocks.data_ptr(),
            tiles.data_ptr() if tiles is not None else None,
            fmt == "q4_1",
            n,
            y.data_ptr(),
            2 if swiglu else 0,
            torch.get_num_threads(),
        )
    return y


def int8_macs_per_s(threads: int | None = None, iters: int = 20_000_000) -> float:
    """The int8 roof: multiply-adds per second of ``threads`` threads (torch's count by default)
    running ``maddubs`` + add, the tiles' inner step, from registers (``cpu_quant_int8.cpp``)."""
    lib = _lib_or_raise()
    sink = ctypes.c_int64(0)
    return lib.fluxo_int8_macs_per_s(iters, threads or torch.get_num_threads(), ctypes.byref(sink))


def tile_macs_per_s(fmt: str, threads: int | None = None, iters: int = 200_000) -> float:
    """The tiles' own roof: multiply-adds per second of ``threads`` threads (torch's count by
    default) running the 2+-row products' inner kernel (``fmt``: "q4_1" or "q8_0", 4 activation
    rows x one 8-row tile of K = 576) on a tile that stays in L1 (``cpu_quant_tile.cpp``)."""
    lib = _lib_or_raise()
    sink = ctypes.c_int64(0)
    n = threads or torch.get_num_threads()
    return lib.fluxo_tile_macs_per_s(fmt == "q4_1", iters, n, ctypes.byref(sink))


def forward_step(
    desc: torch.Tensor,
    dims: torch.Tensor,
    eps_scale: torch.Tensor,
    h: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    write_slots: torch.Tensor,
    ctx_slots: torch.Tensor,
    ctx_start: torch.Tensor,
    head_rows: torch.Tensor,
    logits: torch.Tensor,
    phases: torch.Tensor | None = None,
) -> None:
    """One whole forward step in one call (``cpu_quant_decode.cpp``), for any mix of decode rows
    and prompt-chunk rows: row ``b`` writes its K/V at ``write_slots[b]`` and attends to the
    ``positions[b] + 1`` slots of ``ctx_slots`` from ``ctx_start[b]``; ``logits [len(head_rows),
    vocab]`` is filled for ``head_rows``; ``h`` is overwritten. Every tensor contiguous, int64
    indices (``engine.core.quant.FusedStep`` prepares them). ``phases``: a float64 ``[threads,
    len(PHASES)]`` tensor to which each thread adds the seconds it spent in each of ``PHASES``
    (the step is otherwise the same).

    A build from before this entry (``engine.lab.kernel_ab``'s base revision) has only the
    decode-only step: there, decode-only batches run through it (``_legacy_decode_step``)."""
    lib = _lib_or_raise()
    threads = torch.get_num_threads()
    if phases is not None and (
        phases.dtype != torch.float64 or phases.shape != (threads, len(PHASES))
    ):
        raise ValueError(f"phases must be float64 [{threads}, {len(PHASES)}]")
    if not hasattr(lib, "fluxo_forward_step"):
        _legacy_decode_step(lib, threads, locals())
        return
    p = [t.data_ptr() for t in (desc, dims, eps_scale, h, positions, cos, sin, k, v)]
    q = [t.data_ptr() for t in (write_slots, ctx_slots, ctx_start, head_rows)]
    lib.fluxo_forward_step(
        *p[:4], h.shape[0], *p[4:], k.stride(0), *q, head_rows.shape[0], logits.data_ptr(),
        threads, phases.data_ptr() if phases is not None else None,
    )  # fmt: skip


def _legacy_decode_step(lib: ctypes.CDLL, threads: int, a: dict) -> None:
    """An older build's ``fluxo_decode_step``: padded ``[B, L]`` context slots and a mask, logits
    for every row (then those of ``head_rows`` are kept)."""
    pos, start = a["positions"], a["ctx_start"]
    rows = pos.shape[0]
    width = int(pos.max()) + 1 if rows else 1
    offsets = torch.arange(width)
    ctx = a["ctx_slots"][(start[:, None] + offsets).clamp(max=a["ctx_slots"].shape[0] - 1)]
    mask = (offsets[None, :] <= pos[:, None]).to(torch.uint8)
    full = torch.empty(rows, a["logits"].shape[1], dtype=torch.float32)
    timed = a["phases"] is not None
    fn = lib.fluxo_decode_step_phases if timed else lib.fluxo_decode_step
    extra = (a["phases"].data_ptr(),) if timed else ()
    k = a["k"]
    fn(
        *(a[n].data_ptr() for n in ("desc", "dims", "eps_scale", "h")),
        rows,
        *(a[n].data_ptr() for n in ("positions", "cos", "sin", "k", "v")),
        k.stride(0),
        a["write_slots"].data_ptr(),
        ctx.contiguous().data_ptr(),
        mask.data_ptr(),
        width,
        full.data_ptr(),
        threads,
        *extra,
    )
    a["logits"].copy_(full[a["head_rows"]])
