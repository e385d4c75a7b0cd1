// Fluxo's int8-activation products: activations quantized per 32 (Q8_1) x GGUF blocks, one weight
// row and one activation row at a time (the tiles' N remainder, and Q8_0 matrices without tiles;
// every other product runs cpu_quant_tile.cpp's 8x4 tiles, one row included). Compiled after
// kernels/cpu_quant.cpp, before cpu_quant_tile.cpp and cpu_quant_decode.cpp, by
// kernels/cpu_quant_build.py (AVX2 + FMA + F16C, or NEON + dotprod; OpenMP where the compiler has
// it).
//
// Activations are quantized per block of 32 to int8 with one fp32 scale d = max|x| / 127 and the
// block sum s = d * sum(q) (llama.cpp's Q8_1). A weight block times an activation block is then one
// integer dot product (x86: _mm256_maddubs_epi16 + _mm256_madd_epi16; ARM: sdot) and one fp32 fma:
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

#ifdef FLUXO_X86
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

#else
static void quantize_rows(const float* x, int64_t M, int64_t K, QRow out) {
    const int64_t nb = K / 32;
    for (int64_t i = 0; i < M * nb; i++) {
        const float* p = x + i * 32;
        float32x4_t v[8];
        float32x4_t mx = vdupq_n_f32(0.0f);
        for (int j = 0; j < 8; j++) {
            v[j] = vld1q_f32(p + 4 * j);
            mx = vmaxq_f32(mx, vabsq_f32(v[j]));
        }
        const float amax = vmaxvq_f32(mx);
        const float d = amax / 127.0f;
        const float32x4_t id = vdupq_n_f32(d > 0.0f ? 127.0f / amax : 0.0f);
        int32x4_t r[8];
        for (int j = 0; j < 8; j++)  // round to nearest even (fcvtns), as x86's cvtps after round
            r[j] = vcvtnq_s32_f32(vmulq_f32(v[j], id));
        int32x4_t sum = vaddq_s32(vaddq_s32(r[0], r[1]), vaddq_s32(r[2], r[3]));
        sum = vaddq_s32(sum, vaddq_s32(vaddq_s32(r[4], r[5]), vaddq_s32(r[6], r[7])));
        for (int j = 0; j < 2; j++) {  // |r| <= 127: the narrowing never saturates
            const int16x8_t a = vcombine_s16(vqmovn_s32(r[4 * j]), vqmovn_s32(r[4 * j + 1]));
            const int16x8_t c = vcombine_s16(vqmovn_s32(r[4 * j + 2]), vqmovn_s32(r[4 * j + 3]));
            vst1q_s8(out.q + i * 32 + 16 * j, vcombine_s8(vqmovn_s16(a), vqmovn_s16(c)));
        }
        out.d[i] = d;
        out.s[i] = d * (float)vaddvq_s32(sum);
    }
}

#endif

// -- one weight row x R activation rows ------------------------------------------------------------
#ifdef FLUXO_X86
// One weight block (b) times R activation rows, into acc / summ (kept in registers by the caller).
template <int R, bool Q4>
static inline void qblock(const uint8_t* wrow, int64_t b, const QRow& x, int64_t K, f8 acc[R],
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
        if (Q4) summ[r] = fmaf(mw, x.s[r * nbx + b], summ[r]);
    }
}

#else
// One weight block (b) times R activation rows, into acc / summ (kept in registers by the caller).
// sdot: lane i of a product is the 4 products of bytes 4i..4i+3, weights 0..15 against activations
// 0..15 in the first, 16..31 in the second: the lanes of x86's maddubs + madd, the same int32s.
template <int R, bool Q4>
static inline void qblock(const uint8_t* wrow, int64_t b, const QRow& x, int64_t K, f8 acc[R],
                          float summ[R]) {
    const int64_t nbx = K / 32;
    int8x16_t w0, w1;
    float dw, mw = 0.0f;
    if (Q4) {
        const uint8_t* blk = wrow + b * 20;
        dw = h2f(blk);
        mw = h2f(blk + 2);
        const uint8x16_t t = vld1q_u8(blk + 4);
        w0 = vreinterpretq_s8_u8(vandq_u8(t, vdupq_n_u8(0x0F)));  // 0..15: fits sdot's signed
        w1 = vreinterpretq_s8_u8(vshrq_n_u8(t, 4));
    } else {
        const uint8_t* blk = wrow + b * 34;
        dw = h2f(blk);
        w0 = vld1q_s8((const int8_t*)(blk + 2));
        w1 = vld1q_s8((const int8_t*)(blk + 18));
    }
    const int32x4_t zero = vdupq_n_s32(0);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const int8_t* qx = x.q + r * K + b * 32;
        const f8 p = f8_i32(vdotq_s32(zero, w0, vld1q_s8(qx)), vdotq_s32(zero, w1, vld1q_s8(qx + 16)));
        acc[r] = f8_fma(p, f8_set1(dw * x.d[r * nbx + b]), acc[r]);
        if (Q4) summ[r] = fmaf(mw, x.s[r * nbx + b], summ[r]);
    }
}

#endif

// One weight row times R activation rows; two accumulator sets (even and odd blocks) so that the
// fma latency chains overlap at one row.
template <int R, bool Q4>
static inline void qdot(const uint8_t* wrow, int64_t nb, const QRow& x, int64_t K, float out[R]) {
    f8 a0[R], a1[R];
    float s0[R], s1[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        a0[r] = a1[r] = f8_zero();
        s0[r] = s1[r] = 0.0f;
    }
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        qblock<R, Q4>(wrow, b, x, K, a0, s0);
        qblock<R, Q4>(wrow, b + 1, x, K, a1, s1);
    }
    if (b < nb) qblock<R, Q4>(wrow, b, x, K, a0, s0);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) out[r] = f8_hsum(f8_add(a0[r], a1[r])) + s0[r] + s1[r];
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
#if defined(FLUXO_X86) && defined(FLUXO_VNNI) && defined(__AVX512F__) && defined(__AVX512BW__)
// the avx512vnni build's products run vpdpbusd on zmm (cpu_quant_tile.cpp's pair kernels): 64
// multiply-adds an instruction
constexpr double INT8_MACS_A_STEP = 64.0;
__attribute__((noinline)) static int int8_pairs(int64_t iters) {
    __m512i a[6], acc[6];
    const __m512i w = _mm512_set1_epi8(3);
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) a[i] = _mm512_set1_epi8((char)(i + 1)), acc[i] = _mm512_setzero_si512();
    for (int64_t n = 0; n < iters; n++) {
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++) {
            __asm__("" : "+v"(a[i]));  // an input the compiler cannot hoist out of the loop
            acc[i] = _mm512_dpbusd_epi32(acc[i], w, a[i]);
        }
    }
    __m512i t = acc[0];
#pragma GCC unroll 6
    for (int i = 1; i < 6; i++) t = _mm512_add_epi32(t, acc[i]);
    return _mm512_reduce_add_epi32(t);
}

#elif defined(FLUXO_X86)
constexpr double INT8_MACS_A_STEP = 32.0;
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
            acc[i] = fluxo_dpbusd(acc[i], w, a[i]);  // the VNNI build's one-instruction step
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

#else
// ARM (the neon build): sdot does 16 multiply-adds into int32 lanes, two a chain a step (32 as
// x86's), on 6 chains: 6 inputs, 12 sums and the weight fit in NEON's 32 registers.
constexpr double INT8_MACS_A_STEP = 32.0;
__attribute__((noinline)) static int int8_pairs(int64_t iters) {
    int8x16_t a[6];
    int32x4_t acc[12];
    const int8x16_t w = vdupq_n_s8(3);
    for (int i = 0; i < 6; i++) a[i] = vdupq_n_s8((int8_t)(i + 1));
    for (int i = 0; i < 12; i++) acc[i] = vdupq_n_s32(0);
    for (int64_t n = 0; n < iters; n++) {
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++) {
            __asm__("" : "+w"(a[i]));  // an input the compiler cannot hoist out of the loop
            acc[2 * i] = vdotq_s32(acc[2 * i], w, a[i]);
            acc[2 * i + 1] = vdotq_s32(acc[2 * i + 1], w, a[i]);
        }
    }
    int32x4_t t = acc[0];
    for (int i = 1; i < 12; i++) t = vaddq_s32(t, acc[i]);
    return vgetq_lane_s32(t, 0);
}

#endif

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
    return INT8_MACS_A_STEP * 6.0 * (double)iters * (double)ran / dt;
}

// x [M, K] fp32 -> Q8_1 blocks (q [M, K] int8, d and s [M, K/32]).
void fluxo_quantize_q8_1(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s) {
    quantize_rows(x, M, K, QRow{q, d, s});
}
}
