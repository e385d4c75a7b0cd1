"""CPU matmuls that read GGUF-style quantized weights directly: Q4_1 and Q8_0 blocks x fp32 rows.

A decode step reads every weight once and does ~2 flops per weight per row, so at a few rows it is
bound by how many bytes the weights take. These kernels keep the weights in the GGUF's own block
layout (Q4_1: fp16 scale d, fp16 min m, 16 bytes of nibbles per 32 weights, 20 bytes = 5 bits a
weight; Q8_0: fp16 d + 32 int8, 34 bytes) and dequantize each block in registers (AVX2 + FMA +
F16C), multiplying it into up to 4 fp32 activation rows at a time. Activations stay fp32, so the
result equals ``x @ dequant(W).T`` up to summation order (no activation quantization).

The C++ source below is compiled with g++ at first use into the Fluxo cache (about 3 s) and called
through ctypes with raw pointers; OpenMP splits the output rows over torch's own thread count (the
.so links ``libgomp.so.1``, which resolves to the copy torch already loaded: one thread pool).
``available()`` is False where there is no compiler or no AVX2/FMA/F16C; callers then fall back.

Chosen by measurement (``python -m kernels.cpu_quant``; 2026-11-30, the 2-core AMD EPYC of this
project, AVX2 + FMA + F16C, *no* AVX-512; 1 thread, best of 40, while the machine ran at load
12-30 from other jobs; random weights, so every matrix but the lm head stays in the 32 MB L3 and
only the lm head shows the memory-bound case). ms per product:

    shape (N x K)      rows  fp32 oneDNN  int8pack  int4pack  Q8_0 ours  Q4_1 ours
    q 576x576             1        0.086     0.532     0.705      0.041      0.048
    q 576x576             8        0.106     2.836    13.827      0.125      0.140
    k/v 192x576           1        0.053     0.168     0.247      0.026      0.030
    gate/up 1536x576      1        0.136     0.896     1.977      0.105      0.124
    gate/up 1536x576      8        0.256    21.991    52.329      0.428      0.476
    gate/up 1536x576     32        1.201    94.833   231.019      1.386      1.506
    down 576x1536         1        0.136     0.894     1.896      0.101      0.118
    down 576x1536         8        0.243    17.627    45.819      0.328      0.336
    qkv 960x576           1        0.095     0.573     1.181      0.089      0.099
    gate+up 3072x576      1        0.295     2.875     8.943      0.246      0.293
    gate+up 3072x576      8        1.565   127.079    91.867      0.653      0.720
    lm head 49152x576     1       48.077   132.712   288.312      9.557      4.742
    lm head 49152x576     8      105.301  1136.347  2137.992     46.345     44.243
    lm head 49152x576    32      145.463  4436.752  6781.006    500.398    395.741

torch's ``_weight_int8pack_mm`` and ``_weight_int4pack_mm_for_cpu`` have no fast path on an AVX2
build (6-100x slower than fp32), so they were not used. These kernels win when the weights come
from memory (the lm head: 10x at 1 row, 2.4x at 8) and lose to oneDNN once the rows make the
product compute-bound (32 rows: they re-expand each block per 4 rows); above
``engine.quant.DEQUANT_ABOVE_ROWS`` rows a product dequantizes and runs oneDNN's GEMM instead.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

QK = 32  # weights per block (both formats)
Q4_1_BYTES = 20  # fp16 d, fp16 m, 16 bytes of 4-bit values
Q8_0_BYTES = 34  # fp16 d, 32 int8 values

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>

static inline float h2f(const uint8_t* p) {
    uint16_t h; memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Q4_1 block -> 4 x 8 fp32 weights (w = q * d + m); low nibbles are weights 0..15, high 16..31.
static inline void deq_q4_1(const uint8_t* blk, __m256 w[4]) {
    const __m256 d = _mm256_set1_ps(h2f(blk));
    const __m256 m = _mm256_set1_ps(h2f(blk + 2));
    const __m128i q = _mm_loadu_si128((const __m128i*)(blk + 4));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(q, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), d, m);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), d, m);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), d, m);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), d, m);
}

// Q8_0 block -> 4 x 8 fp32 weights (w = q * d).
static inline void deq_q8_0(const uint8_t* blk, __m256 w[4]) {
    const __m256 d = _mm256_set1_ps(h2f(blk));
    const __m128i a = _mm_loadu_si128((const __m128i*)(blk + 2));
    const __m128i b = _mm_loadu_si128((const __m128i*)(blk + 18));
    w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)), d);
    w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))), d);
    w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), d);
    w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), d);
}

// y[r, n] = sum_k x[r, k] * W[n, k] for R rows starting at x; W row n is nb blocks of BB bytes.
template <int R, int BB, bool Q4>
static inline void rows_dot(const float* x, int64_t K, const uint8_t* wrow, int64_t nb,
                            float* y, int64_t N) {
    __m256 acc0[R], acc1[R];
    for (int r = 0; r < R; r++) { acc0[r] = _mm256_setzero_ps(); acc1[r] = _mm256_setzero_ps(); }
    for (int64_t b = 0; b < nb; b++) {
        __m256 w[4];
        if (Q4) deq_q4_1(wrow + b * BB, w); else deq_q8_0(wrow + b * BB, w);
        for (int r = 0; r < R; r++) {
            const float* xr = x + r * K + b * 32;
            acc0[r] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xr), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xr + 8), acc1[r]);
            acc0[r] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xr + 16), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr + 24), acc1[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r * N] = hsum(_mm256_add_ps(acc0[r], acc1[r]));
}

template <int BB, bool Q4>
static void mm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y,
               int threads) {
    const int64_t nb = K / 32;
    // Output rows split over threads; each weight row is read from memory once for all M rows
    // (the row chunks after the first find its 360-1020 bytes in L1).
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t* wrow = w + n * nb * BB;
        int64_t r = 0;
        for (; r + 4 <= M; r += 4) rows_dot<4, BB, Q4>(x + r * K, K, wrow, nb, y + r * N + n, N);
        for (; r + 2 <= M; r += 2) rows_dot<2, BB, Q4>(x + r * K, K, wrow, nb, y + r * N + n, N);
        for (; r < M; r++) rows_dot<1, BB, Q4>(x + r * K, K, wrow, nb, y + r * N + n, N);
    }
}

template <int BB, bool Q4>
static void deq(const uint8_t* w, int64_t N, int64_t K, float* out, int threads) {
    const int64_t nb = K / 32;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t b = 0; b < nb; b++) {
            __m256 v[4];
            if (Q4) deq_q4_1(w + (n * nb + b) * BB, v); else deq_q8_0(w + (n * nb + b) * BB, v);
            float* o = out + n * K + b * 32;
            for (int j = 0; j < 4; j++) _mm256_storeu_ps(o + 8 * j, v[j]);
        }
    }
}

extern "C" {
void fluxo_q4_1_mm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y,
                   int threads) { mm<20, true>(x, M, K, w, N, y, threads); }
void fluxo_q8_0_mm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y,
                   int threads) { mm<34, false>(x, M, K, w, N, y, threads); }
void fluxo_q4_1_dequant(const uint8_t* w, int64_t N, int64_t K, float* out, int threads) {
    deq<20, true>(w, N, K, out, threads);
}
void fluxo_q8_0_dequant(const uint8_t* w, int64_t N, int64_t K, float* out, int threads) {
    deq<34, false>(w, N, K, out, threads);
}
}
"""

FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
_lib: ctypes.CDLL | None = None
_error: str | None = None
_lock = threading.Lock()


def _cpu_ok() -> str | None:
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    except (OSError, StopIteration):
        return "cannot read /proc/cpuinfo"
    missing = [f for f in ("avx2", "fma", "f16c") if f not in flags]
    return f"CPU lacks {', '.join(missing)}" if missing else None


def _build_dir() -> Path:
    return Path(os.environ.get("FLUXO_CACHE", Path.home() / ".cache" / "fluxo")) / "kernels"


def _load() -> ctypes.CDLL:
    """Compile (once per source version) and load the shared library; raises with the reason."""
    why = _cpu_ok()
    if why:
        raise RuntimeError(why)
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise RuntimeError("no C++ compiler (g++) on PATH")
    import torch  # noqa: F401  (its libgomp.so.1 must be loaded before ours resolves the name)

    tag = hashlib.sha256((SOURCE + " ".join(FLAGS)).encode()).hexdigest()[:16]
    out = _build_dir() / f"fluxo_cpu_quant_{tag}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            src = Path(tmp) / "cpu_quant.cpp"
            src.write_text(SOURCE)
            so = Path(tmp) / out.name
            proc = subprocess.run([cxx, *FLAGS, str(src), "-o", str(so)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"compiling the quantized kernels failed: {proc.stderr[-2000:]}")
            os.replace(so, out)  # atomic: a concurrent process sees the whole file or none
    lib = ctypes.CDLL(str(out))
    i64, f32p, u8p = ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p
    for name in ("fluxo_q4_1_mm", "fluxo_q8_0_mm"):
        fn = getattr(lib, name)
        fn.argtypes = [f32p, i64, i64, u8p, i64, f32p, ctypes.c_int]
        fn.restype = None
    for name in ("fluxo_q4_1_dequant", "fluxo_q8_0_dequant"):
        fn = getattr(lib, name)
        fn.argtypes = [u8p, i64, i64, f32p, ctypes.c_int]
        fn.restype = None
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None (``unavailable_reason()`` says why)."""
    global _lib, _error
    with _lock:
        if _lib is None and _error is None:
            try:
                _lib = _load()
            except (RuntimeError, OSError) as e:
                _error = str(e)
        return _lib


def available() -> bool:
    return library() is not None


def unavailable_reason() -> str | None:
    library()
    return _error


BYTES = {"q4_1": Q4_1_BYTES, "q8_0": Q8_0_BYTES}


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
