// Fluxo's quantized CPU matmuls with fp32 activations (each GGUF block dequantized in registers)
// and block dequantization; kernels/cpu_quant.py compiles this file followed by
// kernels/cpu_quant_decode.cpp into one library (g++ at first use).
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include <vector>

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

// e^x for 8 floats (Cephes' expf: range reduction by ln 2 in two parts, a degree-5 polynomial;
// within 2 ulp of expf). x <= -87.3 gives 0 (-inf too), so a masked score drops out; x is clamped
// at 88 (e^88 = 1.65e38) instead of reaching inf.
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-88.3762626647949f));
    const __m256 fx = _mm256_floor_ps(
        _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.0f));
    const __m256i n = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
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
