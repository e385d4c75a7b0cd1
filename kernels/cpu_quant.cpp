// Fluxo's quantized CPU matmuls with fp32 activations (each GGUF block dequantized in registers)
// and block dequantization; kernels/cpu_quant_build.py compiles this file, cpu_quant_int8.cpp,
// cpu_quant_tile.cpp and cpu_quant_decode.cpp as one translation unit (g++ or clang at first use).
//
// One source, two instruction sets: x86-64 with AVX2 + FMA + F16C (the avx2 build; avx512vnni and
// avxvnni add FLUXO_VNNI) and AArch64 with NEON + the dot-product extension (the neon build,
// -march=armv8.2-a+dotprod: sdot). The fp32 arithmetic is written once on `f8`, 8 floats: one
// __m256 on x86, two float32x4_t on ARM, every operation lane by lane with the same rounding (fused
// multiply-adds stay fused, horizontal sums add the lanes in the same order), so a row's float
// accumulation order is the same in every build. Integer dot products are exact in any grouping
// (maddubs/madd, vpdpbusd or sdot: nothing saturates), so the integer sums are identical too. The
// neon build gives the avx2 build's bits on tests/test_kernel_neon.py's inputs (g++ 12 both sides,
// the ARM one run under qemu); where a compiler contracts scalar a * b + c differently (Apple
// clang's default -ffp-contract=on against g++'s fast) the last bit of a sum can differ.
#if defined(__AVX2__)
#include <immintrin.h>
#define FLUXO_X86 1
// vpdpbusd on 256-bit vectors, in the encoding the build has: AVX-512 VNNI + VL (the avx512vnni
// build, EVEX) or AVX-VNNI (the avxvnni build, VEX: Intel Alder Lake and later laptops, Zen 5),
// the same instruction and the same int32 sums either way.
#if defined(FLUXO_VNNI) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define fluxo_dpbusd _mm256_dpbusd_epi32
#elif defined(FLUXO_VNNI) && defined(__AVXVNNI__)
#define fluxo_dpbusd _mm256_dpbusd_avx_epi32
#elif defined(FLUXO_VNNI)
#error "FLUXO_VNNI needs -mavx512vnni -mavx512vl or -mavxvnni"
#endif
#elif defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#define FLUXO_NEON 1
#else
#error "Fluxo's kernels need x86-64 AVX2 (-mavx2 -mfma -mf16c) or AArch64 NEON + dotprod (-march=armv8.2-a+dotprod)"
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <vector>

// OpenMP where the compiler has it (-fopenmp; Apple clang: -Xpreprocessor -fopenmp -lomp); without
// it the same sources build single-threaded: the pragmas are ignored and these stand in for the
// runtime (every parallel region is one thread, thread 0 of 1).
#ifdef _OPENMP
#if defined(__has_include)
#if __has_include(<omp.h>)
#include <omp.h>
#define FLUXO_OMP_H 1
#endif
#endif
#ifndef FLUXO_OMP_H  // libomp without its header (torch's copy on macOS): the three calls used here
extern "C" int omp_get_thread_num(void);
extern "C" int omp_get_num_threads(void);
extern "C" double omp_get_wtime(void);
#endif
#else
static inline int omp_get_thread_num() { return 0; }
static inline int omp_get_num_threads() { return 1; }
static inline double omp_get_wtime() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
#endif

extern "C" {
// 1 where this library was built with OpenMP (its `threads` arguments are honoured), 0 where not
// (every call runs on one thread, whatever it asks for).
int fluxo_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
}

// -- f8: 8 fp32 lanes ------------------------------------------------------------------------------
#ifdef FLUXO_X86
typedef __m256 f8;
static inline f8 f8_zero() { return _mm256_setzero_ps(); }
static inline f8 f8_set1(float v) { return _mm256_set1_ps(v); }
static inline f8 f8_load(const float* p) { return _mm256_loadu_ps(p); }
static inline void f8_store(float* p, f8 v) { _mm256_storeu_ps(p, v); }
static inline f8 f8_add(f8 a, f8 b) { return _mm256_add_ps(a, b); }
static inline f8 f8_sub(f8 a, f8 b) { return _mm256_sub_ps(a, b); }
static inline f8 f8_mul(f8 a, f8 b) { return _mm256_mul_ps(a, b); }
static inline f8 f8_div(f8 a, f8 b) { return _mm256_div_ps(a, b); }
static inline f8 f8_min(f8 a, f8 b) { return _mm256_min_ps(a, b); }
static inline f8 f8_max(f8 a, f8 b) { return _mm256_max_ps(a, b); }
static inline f8 f8_fma(f8 a, f8 b, f8 c) { return _mm256_fmadd_ps(a, b, c); }    // a * b + c
static inline f8 f8_fnma(f8 a, f8 b, f8 c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a * b
static inline f8 f8_floor(f8 a) { return _mm256_floor_ps(a); }
// 2^n for whole n in [-127, 128] (n's bits as an exponent)
static inline f8 f8_pow2i(f8 n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline f8 f8_half(const uint8_t* p) {  // 8 fp16 -> 8 fp32
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
// ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)), the order every build keeps
static inline float f8_hsum(f8 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
// out[k] = ((ak0 + ak1) + (ak2 + ak3)) + ((ak4 + ak5) + (ak6 + ak7)) for the four vectors
static inline void f8_hsum4(f8 a0, f8 a1, f8 a2, f8 a3, float* out) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}
static inline float h2f(const uint8_t* p) {
    uint16_t h; memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
#else  // FLUXO_NEON: the low 4 lanes and the high 4, each operation the x86 one's IEEE twin
struct f8 { float32x4_t lo, hi; };
static inline f8 f8_zero() { return f8{vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
static inline f8 f8_set1(float v) { return f8{vdupq_n_f32(v), vdupq_n_f32(v)}; }
static inline f8 f8_load(const float* p) { return f8{vld1q_f32(p), vld1q_f32(p + 4)}; }
static inline void f8_store(float* p, f8 v) { vst1q_f32(p, v.lo); vst1q_f32(p + 4, v.hi); }
static inline f8 f8_add(f8 a, f8 b) { return f8{vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
static inline f8 f8_sub(f8 a, f8 b) { return f8{vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)}; }
static inline f8 f8_mul(f8 a, f8 b) { return f8{vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
static inline f8 f8_div(f8 a, f8 b) { return f8{vdivq_f32(a.lo, b.lo), vdivq_f32(a.hi, b.hi)}; }
// (x86's min/max return the second operand where one is NaN, these return NaN: no input here is)
static inline f8 f8_min(f8 a, f8 b) { return f8{vminq_f32(a.lo, b.lo), vminq_f32(a.hi, b.hi)}; }
static inline f8 f8_max(f8 a, f8 b) { return f8{vmaxq_f32(a.lo, b.lo), vmaxq_f32(a.hi, b.hi)}; }
static inline f8 f8_fma(f8 a, f8 b, f8 c) {  // a * b + c, one rounding (fmla)
    return f8{vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)};
}
static inline f8 f8_fnma(f8 a, f8 b, f8 c) {  // c - a * b, one rounding (fmls)
    return f8{vfmsq_f32(c.lo, a.lo, b.lo), vfmsq_f32(c.hi, a.hi, b.hi)};
}
static inline f8 f8_floor(f8 a) { return f8{vrndmq_f32(a.lo), vrndmq_f32(a.hi)}; }
static inline float32x4_t pow2i4(float32x4_t n) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
}
static inline f8 f8_pow2i(f8 n) { return f8{pow2i4(n.lo), pow2i4(n.hi)}; }
static inline float32x4_t half4(const uint8_t* p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t*)p)));
}
static inline f8 f8_half(const uint8_t* p) { return f8{half4(p), half4(p + 8)}; }
static inline float f8_hsum(f8 v) {
    const float32x4_t s = vaddq_f32(v.lo, v.hi);
    const float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}
static inline void f8_hsum4(f8 a0, f8 a1, f8 a2, f8 a3, float* out) {  // faddp = hadd
    const float32x4_t lo = vpaddq_f32(vpaddq_f32(a0.lo, a1.lo), vpaddq_f32(a2.lo, a3.lo));
    const float32x4_t hi = vpaddq_f32(vpaddq_f32(a0.hi, a1.hi), vpaddq_f32(a2.hi, a3.hi));
    vst1q_f32(out, vaddq_f32(lo, hi));
}
static inline float h2f(const uint8_t* p) {
    uint16_t h; memcpy(&h, p, 2);
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}
// 8 integers -> f8
static inline f8 f8_i32(int32x4_t lo, int32x4_t hi) { return f8{vcvtq_f32_s32(lo), vcvtq_f32_s32(hi)}; }
static inline f8 f8_u8(uint8x8_t v) {
    const uint16x8_t w = vmovl_u8(v);
    return f8_i32(vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(w))),
                  vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(w))));
}
static inline f8 f8_s8(int8x8_t v) {
    const int16x8_t w = vmovl_s8(v);
    return f8_i32(vmovl_s16(vget_low_s16(w)), vmovl_s16(vget_high_s16(w)));
}
#endif

// e^x for 8 floats (Cephes' expf: range reduction by ln 2 in two parts, a degree-5 polynomial;
// within 2 ulp of expf). x <= -87.3 gives 0 (-inf too), so a masked score drops out; x is clamped
// at 88 (e^88 = 1.65e38) instead of reaching inf.
static inline f8 exp8(f8 x) {
    x = f8_max(f8_min(x, f8_set1(88.0f)), f8_set1(-88.3762626647949f));
    const f8 fx = f8_floor(f8_fma(x, f8_set1(1.44269504088896341f), f8_set1(0.5f)));
    x = f8_fnma(fx, f8_set1(0.693359375f), x);
    x = f8_fnma(fx, f8_set1(-2.12194440e-4f), x);
    f8 y = f8_set1(1.9875691500E-4f);
    y = f8_fma(y, x, f8_set1(1.3981999507E-3f));
    y = f8_fma(y, x, f8_set1(8.3334519073E-3f));
    y = f8_fma(y, x, f8_set1(4.1665795894E-2f));
    y = f8_fma(y, x, f8_set1(1.6666665459E-1f));
    y = f8_fma(y, x, f8_set1(5.0000001201E-1f));
    y = f8_add(f8_fma(y, f8_mul(x, x), x), f8_set1(1.0f));
    return f8_mul(y, f8_pow2i(fx));
}

#ifdef FLUXO_X86
// Q4_1 block -> 4 x 8 fp32 weights (w = q * d + m); low nibbles are weights 0..15, high 16..31.
static inline void deq_q4_1(const uint8_t* blk, f8 w[4]) {
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
static inline void deq_q8_0(const uint8_t* blk, f8 w[4]) {
    const __m256 d = _mm256_set1_ps(h2f(blk));
    const __m128i a = _mm_loadu_si128((const __m128i*)(blk + 2));
    const __m128i b = _mm_loadu_si128((const __m128i*)(blk + 18));
    w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)), d);
    w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))), d);
    w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), d);
    w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), d);
}

#else
// Q4_1 block -> 4 x 8 fp32 weights (w = q * d + m); low nibbles are weights 0..15, high 16..31.
static inline void deq_q4_1(const uint8_t* blk, f8 w[4]) {
    const f8 d = f8_set1(h2f(blk)), m = f8_set1(h2f(blk + 2));
    const uint8x16_t q = vld1q_u8(blk + 4);
    const uint8x16_t lo = vandq_u8(q, vdupq_n_u8(0x0F)), hi = vshrq_n_u8(q, 4);
    w[0] = f8_fma(f8_u8(vget_low_u8(lo)), d, m);
    w[1] = f8_fma(f8_u8(vget_high_u8(lo)), d, m);
    w[2] = f8_fma(f8_u8(vget_low_u8(hi)), d, m);
    w[3] = f8_fma(f8_u8(vget_high_u8(hi)), d, m);
}

// Q8_0 block -> 4 x 8 fp32 weights (w = q * d).
static inline void deq_q8_0(const uint8_t* blk, f8 w[4]) {
    const f8 d = f8_set1(h2f(blk));
    const int8x16_t a = vld1q_s8((const int8_t*)(blk + 2)), b = vld1q_s8((const int8_t*)(blk + 18));
    w[0] = f8_mul(f8_s8(vget_low_s8(a)), d);
    w[1] = f8_mul(f8_s8(vget_high_s8(a)), d);
    w[2] = f8_mul(f8_s8(vget_low_s8(b)), d);
    w[3] = f8_mul(f8_s8(vget_high_s8(b)), d);
}

#endif

// y[r, n] = sum_k x[r, k] * W[n, k] for R rows starting at x; W row n is nb blocks of BB bytes.
template <int R, int BB, bool Q4>
static inline void rows_dot(const float* x, int64_t K, const uint8_t* wrow, int64_t nb,
                            float* y, int64_t N) {
    f8 acc0[R], acc1[R];
    for (int r = 0; r < R; r++) { acc0[r] = f8_zero(); acc1[r] = f8_zero(); }
    for (int64_t b = 0; b < nb; b++) {
        f8 w[4];
        if (Q4) deq_q4_1(wrow + b * BB, w); else deq_q8_0(wrow + b * BB, w);
        for (int r = 0; r < R; r++) {
            const float* xr = x + r * K + b * 32;
            acc0[r] = f8_fma(w[0], f8_load(xr), acc0[r]);
            acc1[r] = f8_fma(w[1], f8_load(xr + 8), acc1[r]);
            acc0[r] = f8_fma(w[2], f8_load(xr + 16), acc0[r]);
            acc1[r] = f8_fma(w[3], f8_load(xr + 24), acc1[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r * N] = f8_hsum(f8_add(acc0[r], acc1[r]));
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
            f8 v[4];
            if (Q4) deq_q4_1(w + (n * nb + b) * BB, v); else deq_q8_0(w + (n * nb + b) * BB, v);
            float* o = out + n * K + b * 32;
            for (int j = 0; j < 4; j++) f8_store(o + 8 * j, v[j]);
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
