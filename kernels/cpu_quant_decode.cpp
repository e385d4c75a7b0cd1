// Fluxo's quantized decode step on the CPU: int8 activations x GGUF blocks, and a whole decode
// step (every layer, final norm, vocabulary head) in one call. Compiled with kernels/cpu_quant.cpp
// by kernels/cpu_quant.py (g++ at first use, AVX2 + FMA + F16C, OpenMP).
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
// 2 SwiGLU: W holds gate rows then up rows (2 * N of them); y[r, n] = silu(gate) * up.
template <bool Q4>
static void qmm_rows(const uint8_t* w, int64_t N, int64_t K, const QRow& x, int64_t M, float* y,
                     int64_t ldy, int mode, int64_t n0, int64_t n1) {
    const int64_t nb = K / 32, bb = Q4 ? 20 : 34, width = nb * bb;
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t r = 0; r < M;) {
            const int take = M - r >= 4 ? 4 : (M - r >= 2 ? 2 : 1);
            QRow xr = {x.q + r * K, x.d + r * nb, x.s + r * nb};
            float v[4], g[4];
            if (take == 4) qdot<4, Q4>(w + n * width, nb, xr, K, v);
            else if (take == 2) qdot<2, Q4>(w + n * width, nb, xr, K, v);
            else qdot<1, Q4>(w + n * width, nb, xr, K, v);
            if (mode == 2) {
                if (take == 4) qdot<4, Q4>(w + (n + N) * width, nb, xr, K, g);
                else if (take == 2) qdot<2, Q4>(w + (n + N) * width, nb, xr, K, g);
                else qdot<1, Q4>(w + (n + N) * width, nb, xr, K, g);
            }
            for (int j = 0; j < take; j++) {
                float* o = y + (r + j) * ldy + n;
                if (mode == 0) *o = v[j];
                else if (mode == 1) *o += v[j];
                else *o = v[j] / (1.0f + expf(-v[j])) * g[j];
            }
            r += take;
        }
    }
}

static void qmm_part(const uint8_t* w, bool q4, int64_t N, int64_t K, const QRow& x, int64_t M,
                     float* y, int64_t ldy, int mode, int tid, int nt) {
    const int64_t n0 = N * tid / nt, n1 = N * (tid + 1) / nt;
    if (q4) qmm_rows<true>(w, N, K, x, M, y, ldy, mode, n0, n1);
    else qmm_rows<false>(w, N, K, x, M, y, ldy, mode, n0, n1);
}

#ifndef FP32_HEAD
#define FP32_HEAD 1
#endif

// -- the whole decode step -------------------------------------------------------------------------
static void rmsnorm(const float* h, const float* w, int64_t M, int64_t D, float eps, float* out) {
    for (int64_t r = 0; r < M; r++) {
        const float* x = h + r * D;
        float ss = 0.0f;
        for (int64_t i = 0; i < D; i++) ss += x[i] * x[i];
        const float inv = 1.0f / sqrtf(ss / (float)D + eps);
        for (int64_t i = 0; i < D; i++) out[r * D + i] = (x[i] * inv) * w[i];
    }
}

// transformers' rotate_half rotary: x[i] pairs with x[i + d/2]; c, s: the position's table rows.
static inline void rope(float* x, const float* c, const float* s, int64_t d) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * c[i] - b * s[i];
        x[i + half] = b * c[i + half] + a * s[i + half];
    }
}

struct Step {  // everything one decode step reads, as the Python side lays it out
    const int64_t* desc;  // per layer: qkv, q4?, o, q4?, gate_up, q4?, down, q4?, ln1, ln2; head, q4?, norm
    int64_t layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    float eps, scale;
    float* h;  // [B, hidden] in: embeddings; out: last hidden state
    int64_t rows;
    const int64_t* pos;  // [B]
    const float *cos, *sin;  // [max_len, head_dim]
    float *kc, *vc;  // layer 0's [slots, kv_heads, head_dim]; next layer at + layer_stride
    int64_t layer_stride;
    const int64_t* write_slots;  // [B]
    const int64_t* ctx_slots;  // [B, ctx]
    const uint8_t* mask;  // [B, ctx] 1 where the slot belongs to the row
    int64_t ctx;
    float* logits;  // [B, vocab]
};

struct Scratch {  // one thread's own activations
    std::vector<float> f, scores, q;
    std::vector<int8_t> xq;
    std::vector<float> xd, xs;
    QRow row() { return QRow{xq.data(), xd.data(), xs.data()}; }
};

// Rows [u0, u1) of (row, kv head): the new K (rotated) and V into the paged cache.
static void write_kv(const Step& s, const float* qkv, int64_t ldq, float* kc, float* vc, int tid, int nt) {
    const int64_t units = s.rows * s.kv_heads, hd = s.head_dim;
    for (int64_t u = units * tid / nt; u < units * (tid + 1) / nt; u++) {
        const int64_t b = u / s.kv_heads, g = u % s.kv_heads;
        float* kd = kc + (s.write_slots[b] * s.kv_heads + g) * hd;
        float* vd = vc + (s.write_slots[b] * s.kv_heads + g) * hd;
        memcpy(kd, qkv + b * ldq + (s.heads + g) * hd, hd * sizeof(float));
        memcpy(vd, qkv + b * ldq + (s.heads + s.kv_heads + g) * hd, hd * sizeof(float));
        rope(kd, s.cos + s.pos[b] * hd, s.sin + s.pos[b] * hd, hd);
    }
}

// q . k over d floats (d a multiple of 8), two fma chains.
static inline float dot8(const float* a, const float* b, int64_t d) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    if (i < d) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    return hsum(_mm256_add_ps(s0, s1));
}

// q . k for four keys at once: four fma chains, one horizontal reduction for all four.
static inline void dot4(const float* q, const float* k0, const float* k1, const float* k2,
                        const float* k3, int64_t d, float* out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < d; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + i), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + i), a3);
    }
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

// o = inv * sum_j p[j] v[slot[j]] with the NV x 8 outputs in registers (a chain through memory
// per key made this loop 3x slower).
template <int NV>
static inline void pv(const float* p, const int64_t* slot, const uint8_t* mask, int64_t n,
                      const float* v, int64_t vstride, float inv, float* o) {
    __m256 acc[NV];
#pragma GCC unroll 16
    for (int i = 0; i < NV; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        if (!mask[j]) continue;
        const __m256 pp = _mm256_set1_ps(p[j]);
        const float* vr = v + slot[j] * vstride;
#pragma GCC unroll 16
        for (int i = 0; i < NV; i++) acc[i] = _mm256_fmadd_ps(pp, _mm256_loadu_ps(vr + 8 * i), acc[i]);
    }
    const __m256 iv = _mm256_set1_ps(inv);
#pragma GCC unroll 16
    for (int i = 0; i < NV; i++) _mm256_storeu_ps(o + 8 * i, _mm256_mul_ps(acc[i], iv));
}

// Units (row, head) (head_dim a multiple of 8): softmax(q k^T * scale) v over the row's context slots.
static void attend(const Step& s, const float* qkv, int64_t ldq, const float* kc, const float* vc,
                   float* out, Scratch& t, int tid, int nt) {
    const int64_t units = s.rows * s.heads, hd = s.head_dim, rep = s.heads / s.kv_heads;
    float* q = t.q.data();
    float* sc = t.scores.data();
    for (int64_t u = units * tid / nt; u < units * (tid + 1) / nt; u++) {
        const int64_t b = u / s.heads, hh = u % s.heads, g = hh / rep;
        memcpy(q, qkv + b * ldq + hh * hd, hd * sizeof(float));
        rope(q, s.cos + s.pos[b] * hd, s.sin + s.pos[b] * hd, hd);
        const int64_t* sl = s.ctx_slots + b * s.ctx;
        const float* kg = kc + g * hd;
        const int64_t ks = s.kv_heads * hd;
        int64_t j = 0;
        for (; j + 4 <= s.ctx; j += 4)  // padding slots are valid memory; the mask drops them below
            dot4(q, kg + sl[j] * ks, kg + sl[j + 1] * ks, kg + sl[j + 2] * ks, kg + sl[j + 3] * ks, hd,
                 sc + j);
        for (; j < s.ctx; j++) sc[j] = dot8(q, kg + sl[j] * ks, hd);
        float mx = -INFINITY;
        for (j = 0; j < s.ctx; j++) {
            sc[j] = s.mask[b * s.ctx + j] ? sc[j] * s.scale : -INFINITY;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < s.ctx; j++) {
            if (!s.mask[b * s.ctx + j]) continue;
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float* o = out + b * s.heads * hd + hh * hd;
        const int64_t* slot = s.ctx_slots + b * s.ctx;
        const uint8_t* mk = s.mask + b * s.ctx;
        const float* vg = vc + g * hd;
        const int64_t vs = s.kv_heads * hd;
        if (hd == 64) pv<8>(sc, slot, mk, s.ctx, vg, vs, 1.0f / sum, o);
        else if (hd == 128) pv<16>(sc, slot, mk, s.ctx, vg, vs, 1.0f / sum, o);
        else if (hd == 16) pv<2>(sc, slot, mk, s.ctx, vg, vs, 1.0f / sum, o);
        else {
            for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
            for (int64_t j = 0; j < s.ctx; j++)
                if (mk[j])
                    for (int64_t i = 0; i < hd; i++) o[i] += sc[j] * vg[slot[j] * vs + i];
            for (int64_t i = 0; i < hd; i++) o[i] /= sum;
        }
    }
}

// The vocabulary head on fp32 activations (cpu_quant.cpp's block-dequantizing kernel), output rows
// [n0, n1) of this thread: it reads the largest matrix, so it is memory-bound either way.
static void head_fp32(const float* x, int64_t M, int64_t K, const uint8_t* w, bool q4, int64_t N,
                      float* y, int tid, int nt) {
    const int64_t nb = K / 32, width = nb * (q4 ? 20 : 34);
    for (int64_t n = N * tid / nt; n < N * (tid + 1) / nt; n++) {
        const uint8_t* wrow = w + n * width;
        int64_t r = 0;
        for (; r + 4 <= M; r += 4) {
            if (q4) rows_dot<4, 20, true>(x + r * K, K, wrow, nb, y + r * N + n, N);
            else rows_dot<4, 34, false>(x + r * K, K, wrow, nb, y + r * N + n, N);
        }
        for (; r < M; r++) {
            if (q4) rows_dot<1, 20, true>(x + r * K, K, wrow, nb, y + r * N + n, N);
            else rows_dot<1, 34, false>(x + r * K, K, wrow, nb, y + r * N + n, N);
        }
    }
}

static void step_thread(const Step& s, float* qkv, float* attn, float* act, int tid, int nt) {
    const int64_t B = s.rows, D = s.hidden, hd = s.head_dim;
    const int64_t nqkv = (s.heads + 2 * s.kv_heads) * hd, kmax = D > s.inter ? D : s.inter;
    Scratch t;
    t.f.resize(B * kmax);
    t.xq.resize(B * kmax);
    t.xd.resize(B * kmax / 32);
    t.xs.resize(B * kmax / 32);
    t.scores.resize(s.ctx > 0 ? s.ctx : 1);
    t.q.resize(hd);
    QRow x = t.row();
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);  // flush denormals to zero (tiny softmax weights are microcode-slow)
    for (int64_t l = 0; l < s.layers; l++) {
        const int64_t* d = s.desc + l * 10;
        float* kc = s.kc + l * s.layer_stride;
        float* vc = s.vc + l * s.layer_stride;
        rmsnorm(s.h, (const float*)d[8], B, D, s.eps, t.f.data());
        quantize_rows(t.f.data(), B, D, x);
        qmm_part((const uint8_t*)d[0], d[1], nqkv, D, x, B, qkv, nqkv, 0, tid, nt);
        #pragma omp barrier
        write_kv(s, qkv, nqkv, kc, vc, tid, nt);
        #pragma omp barrier
        attend(s, qkv, nqkv, kc, vc, attn, t, tid, nt);
        #pragma omp barrier
        quantize_rows(attn, B, s.heads * hd, x);
        qmm_part((const uint8_t*)d[2], d[3], D, s.heads * hd, x, B, s.h, D, 1, tid, nt);
        #pragma omp barrier
        rmsnorm(s.h, (const float*)d[9], B, D, s.eps, t.f.data());
        quantize_rows(t.f.data(), B, D, x);
        qmm_part((const uint8_t*)d[4], d[5], s.inter, D, x, B, act, s.inter, 2, tid, nt);
        #pragma omp barrier
        quantize_rows(act, B, s.inter, x);
        qmm_part((const uint8_t*)d[6], d[7], D, s.inter, x, B, s.h, D, 1, tid, nt);
        #pragma omp barrier
    }
    const int64_t* hdesc = s.desc + s.layers * 10;
    rmsnorm(s.h, (const float*)hdesc[2], B, D, s.eps, t.f.data());
    if (FP32_HEAD) {
        head_fp32(t.f.data(), B, D, (const uint8_t*)hdesc[0], hdesc[1], s.vocab, s.logits, tid, nt);
    } else {
        quantize_rows(t.f.data(), B, D, x);
        qmm_part((const uint8_t*)hdesc[0], hdesc[1], s.vocab, D, x, B, s.logits, s.vocab, 0, tid, nt);
    }
    _mm_setcsr(csr);
}

extern "C" {
// x [M, K] fp32 -> Q8_1 blocks (q [M, K] int8, d and s [M, K/32]).
void fluxo_quantize_q8_1(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s) {
    quantize_rows(x, M, K, QRow{q, d, s});
}

// y [M, N'] = act(x [M, K] @ W.T) with x quantized to Q8_1; mode 0: y = x W^T (N' = N);
// 2: W is gate rows then up rows, y = silu(gate) * up (N' = N / 2).
void fluxo_qmm(const float* x, int64_t M, int64_t K, const uint8_t* w, int q4, int64_t N, float* y,
               int mode, int threads) {
    std::vector<int8_t> q(M * K);
    std::vector<float> d(M * K / 32), s(M * K / 32);
    QRow xr{q.data(), d.data(), s.data()};
    quantize_rows(x, M, K, xr);
    const int64_t n = mode == 2 ? N / 2 : N;
    #pragma omp parallel num_threads(threads)
    qmm_part(w, q4, n, K, xr, M, y, n, mode, omp_get_thread_num(), omp_get_num_threads());
}

void fluxo_decode_step(const int64_t* desc, const int64_t* dims, const float* eps_scale, float* h,
                       int64_t rows, const int64_t* pos, const float* cos, const float* sin, float* kc,
                       float* vc, int64_t layer_stride, const int64_t* write_slots,
                       const int64_t* ctx_slots, const uint8_t* mask, int64_t ctx, float* logits,
                       int threads) {
    Step s{desc, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], eps_scale[0],
           eps_scale[1], h, rows, pos, cos, sin, kc, vc, layer_stride, write_slots, ctx_slots, mask,
           ctx, logits};
    std::vector<float> qkv(rows * (s.heads + 2 * s.kv_heads) * s.head_dim);
    std::vector<float> attn(rows * s.heads * s.head_dim), act(rows * s.inter);
    #pragma omp parallel num_threads(threads)
    step_thread(s, qkv.data(), attn.data(), act.data(), omp_get_thread_num(), omp_get_num_threads());
}
}
