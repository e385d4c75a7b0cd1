// Fluxo's int8-activation products: activations quantized per 32 (Q8_1) x GGUF blocks, one weight
// row and one activation row at a time (the tiles' N remainder, and Q8_0 matrices without tiles;
// every other product runs cpu_quant_tile.cpp's 8x4 tiles, one row included). Compiled after kernels/cpu_quant.cpp, before
// cpu_quant_tile.cpp and cpu_quant_decode.cpp, by kernels/cpu_quant.py (g++ at first use, AVX2 +
// FMA + F16C, OpenMP).
//
// Activations are quantized per block of 32 to int8 with one fp32 scale d = max|x| / 127 and the
// block sum s = d * sum(q) (llama.cpp's Q8_1). A weight block times an activation block is then one
// integer dot product (_mm256_maddubs_epi16 + _mm256_madd_epi16) and one fp32 fma:
//   Q4_1 (w = dw * qw + mw):  dw * dx * sum(qw * qx) + mw * s
//   Q8_0 (w = dw * qw):       dw * dx * sum(qw * qx)
// The fp32-activation kernels dequantize each block to 32 floats first (4 conversions and 4 fmas
// more per block), which made a one-row step compute-bound on this 2-core AVX2 machine.

// -- activations -> Q8_1 blocks --------------------------------------------------------------------
struct QRow {  // one matrix of quantized activations: M rows of K
    int8_t* q;  // [M, K]
    float* d;   // [M, K/32]
    float* s;   // [M, K/32]
};

static void quantize_rows(const float* x, int64_t M, int64_t K, QRow out) {
    const int64_t nb = K / 32;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < M * nb; i++) {
        const float* p = x + i * 32;
        __m256 v[4];
        __m256 mx = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(p + 8 * j);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[j]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const __m256 id = _mm256_set1_ps(d > 0.0f ? 127.0f / amax : 0.0f);
        __m256i r[4];
        for (int j = 0; j < 4; j++)  // round to nearest even, as llama.cpp's quantize_row_q8_1
            r[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_ROUND_NEAREST));
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_hadd_epi32(s4, s4);
        s4 = _mm_hadd_epi32(s4, s4);
        __m256i a = _mm256_packs_epi32(r[0], r[1]);
        __m256i b = _mm256_packs_epi32(r[2], r[3]);
        a = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), perm);
        _mm256_storeu_si256((__m256i*)(out.q + i * 32), a);
        out.d[i] = d;
        out.s[i] = d * (float)_mm_cvtsi128_si32(s4);
    }
}

// -- one weight row x R activation rows ------------------------------------------------------------
// One weight block (b) times R activation rows, into acc / summ (kept in registers by the caller).
template <int R, bool Q4>
static inline void qblock(const uint8_t* wrow, int64_t b, const QRow& x, int64_t K, __m256 acc[R],
                          float summ[R]) {
    const int64_t nbx = K / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i qw, aw;
    float dw, mw = 0.0f;
    if (Q4) {
        const uint8_t* blk = wrow + b * 20;
        int32_t dm;
        memcpy(&dm, blk, 4);
        const __m128 dmf = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));  // d and m in one conversion
        dw = _mm_cvtss_f32(dmf);
        mw = _mm_cvtss_f32(_mm_movehdup_ps(dmf));
        const __m128i t = _mm_loadu_si128((const __m128i*)(blk + 4));
        qw = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
        aw = qw;  // 0..15, unsigned: the first operand of maddubs
    } else {
        const uint8_t* blk = wrow + b * 34;
        dw = h2f(blk);
        qw = _mm256_loadu_si256((const __m256i*)(blk + 2));
        aw = _mm256_sign_epi8(qw, qw);  // |w|; w's sign moves onto x below
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        __m256i qx = _mm256_loadu_si256((const __m256i*)(x.q + r * K + b * 32));
        if (!Q4) qx = _mm256_sign_epi8(qx, qw);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, qx), ones);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * x.d[r * nbx + b]), acc[r]);
        if (Q4) summ[r] += mw * x.s[r * nbx + b];
    }
}

// One weight row times R activation rows; two accumulator sets (even and odd blocks) so that the
// fma latency chains overlap at one row.
template <int R, bool Q4>
static inline void qdot(const uint8_t* wrow, int64_t nb, const QRow& x, int64_t K, float out[R]) {
    __m256 a0[R], a1[R];
    float s0[R], s1[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        a0[r] = a1[r] = _mm256_setzero_ps();
        s0[r] = s1[r] = 0.0f;
    }
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        qblock<R, Q4>(wrow, b, x, K, a0, s0);
        qblock<R, Q4>(wrow, b + 1, x, K, a1, s1);
    }
    if (b < nb) qblock<R, Q4>(wrow, b, x, K, a0, s0);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) out[r] = hsum(_mm256_add_ps(a0[r], a1[r])) + s0[r] + s1[r];
}

// Output rows [n0, n1) of y = x @ W.T for all M rows; epilogue: 0 store, 1 add (residual),
// 2 SwiGLU: W holds gate rows then up rows (2 * N of them); y[r, n] = silu(gate) * up. One
// activation row at a time, so that an output element never depends on M (batch invariance: see
// qmm_part); here it serves Q8_0 matrices without tiles and the N mod 8 rows the tiles leave.
template <bool Q4>
static void qmm_rows(const uint8_t* w, int64_t N, int64_t K, const QRow& x, int64_t M, float* y,
                     int64_t ldy, int mode, int64_t n0, int64_t n1) {
    const int64_t nb = K / 32, width = nb * (Q4 ? 20 : 34);
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t r = 0; r < M; r++) {
            const QRow xr = {x.q + r * K, x.d + r * nb, x.s + r * nb};
            float v[1], g[1];
            qdot<1, Q4>(w + n * width, nb, xr, K, v);
            float* o = y + r * ldy + n;
            if (mode == 0) *o = v[0];
            else if (mode == 1) *o += v[0];
            else {
                qdot<1, Q4>(w + (n + N) * width, nb, xr, K, g);
                *o = v[0] / (1.0f + expf(-v[0])) * g[0];
            }
        }
    }
}

// -- the machine's int8 roof ------------------------------------------------------------------------
// The most int8 arithmetic one thread can do with the instructions these kernels use: maddubs (32
// u8 x s8 multiply-adds) then an int16 add (the Q4_1 tiles' inner step), on 6 independent register
// chains, no memory. 6 chains, not more: 16 ymm registers hold 6 inputs, 6 sums and the weight
// without spilling. Measured 2026-11-30, this project's 2-core AMD EPYC (AVX2, no VNNI), thread
// by thread: ~0.37 ns a pair (about one a cycle), ~0.18 ns an fp32 fma on 8 chains (two a cycle).
__attribute__((noinline)) static int int8_pairs(int64_t iters) {
    __m256i a[6], acc[6];
    const __m256i w = _mm256_set1_epi8(3);
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) a[i] = _mm256_set1_epi8((char)(i + 1)), acc[i] = _mm256_setzero_si256();
    for (int64_t n = 0; n < iters; n++) {
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++) {
            __asm__("" : "+x"(a[i]));  // an input the compiler cannot hoist out of the loop
#ifdef FLUXO_VNNI
            acc[i] = _mm256_dpbusd_epi32(acc[i], w, a[i]);  // the VNNI build's one-instruction step
#else
            acc[i] = _mm256_add_epi16(acc[i], _mm256_maddubs_epi16(w, a[i]));
#endif
        }
    }
    __m256i t = acc[0];
#pragma GCC unroll 6
    for (int i = 1; i < 6; i++) t = _mm256_add_epi16(t, acc[i]);
    return _mm256_extract_epi16(t, 0);
}

extern "C" {
// Int8 multiply-adds per second of `threads` threads each running int8_pairs(iters) at once (wall
// time of the whole region); *sink: their results, so that none is optimized away.
double fluxo_int8_macs_per_s(int64_t iters, int threads, int64_t* sink) {
    int64_t total = 0, ran = 0;
    const double t0 = omp_get_wtime();
    #pragma omp parallel num_threads(threads) reduction(+ : total, ran)
    {
        total += int8_pairs(iters);
        ran += 1;
    }
    const double dt = omp_get_wtime() - t0;
    *sink = total;
    return 32.0 * 6.0 * (double)iters * (double)ran / dt;
}

// x [M, K] fp32 -> Q8_1 blocks (q [M, K] int8, d and s [M, K/32]).
void fluxo_quantize_q8_1(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s) {
    quantize_rows(x, M, K, QRow{q, d, s});
}
}
