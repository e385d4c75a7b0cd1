// Fluxo's register-tiled int8 GEMM for Q4_1 weights: 8 weight rows x up to 4 activation rows per
// inner loop, for 2 or more activation rows. Compiled after kernels/cpu_quant_int8.cpp (QRow,
// quantize_rows, and qmm_rows: one row, Q8_0, and the N remainder) and before cpu_quant_decode.cpp,
// by kernels/cpu_quant.py.
//
// The one-row kernels (cpu_quant_int8.cpp) reduce every (weight row, activation row, block) to a
// scalar: maddubs, madd, a horizontal step, a conversion and an fma per pair, and unpack each
// weight block again for every group of 4 activation rows. Here a tile of 8 weight rows is
// unpacked once per call into a buffer laid out so that 32-bit lane i of a vector holds 4
// consecutive weights of row i: one broadcast of 4 activation bytes times that vector (maddubs)
// advances all 8 rows at once, with no horizontal reduction. A block of one activation row costs
// 8 maddubs, 7 int16 adds (|sum| <= 8 * 2 * 15 * 127 = 30480: no overflow), 1 madd, 1 conversion,
// 1 scale multiply and 2 fmas (d * dx * sum + m * s, the Q8_1 block sum) for 8 (row, row) pairs.
//
// Measured 2026-11-30 (1 thread, thread CPU time, median of 60, machine at load ~10; random
// weights, cache-resident), ms at 8 rows, one-row kernels -> tiles: qkv 960x576 0.237 -> 0.154,
// o 576x576 0.108 -> 0.065, gate+up 3072x576 0.906 -> 0.792, down 576x1536 0.217 -> 0.137.
// Q8_0 tiles (an 8x8 dword transpose, 8 sign + 8 madd more a block) were tried and dropped: no
// faster than the one-row kernels on the layers, 1.5x slower on the 49152-row head.

// -- weight tile: 8 rows x nb blocks -> lane-interleaved bytes + fp32 scales ----------------------
static inline int32_t ld32(const uint8_t* p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

constexpr int64_t TILE_VECS = 10;  // vectors a block takes in the tile buffer: 8 of bytes, d, m

// Q4_1: qs byte p of a block holds weight p (low nibble) and p + 16 (high). Lane i of P_j takes
// row i's qs bytes 4j..4j+3 (a 4x4 dword transpose per 128-bit half: rows 0-3 low, 4-7 high), so
// its low nibbles are weights 4j..4j+3 (vector j) and its high ones 16+4j.. (vector j + 4): vector
// j always pairs with the activation's dword j.
static inline void pack_q4_1(const uint8_t* w, int64_t width, int64_t nb, __m256i* buf) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t* r = w + b * 20;
        __m256i a[4];
        for (int i = 0; i < 4; i++)  // a[i] = [row i | row i + 4]
            a[i] = _mm256_loadu2_m128i((const __m128i*)(r + (i + 4) * width + 4),
                                       (const __m128i*)(r + i * width + 4));
        const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
        const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
        const __m256i p[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                              _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
        __m256i* o = buf + b * TILE_VECS;
        for (int j = 0; j < 4; j++) {
            _mm256_store_si256(o + j, _mm256_and_si256(p[j], mask));
            _mm256_store_si256(o + j + 4, _mm256_and_si256(_mm256_srli_epi16(p[j], 4), mask));
        }
        // (d, m) fp16 pairs of rows 0 1 4 5 and 2 3 6 7 -> d and m of rows 0..7 in lane order
        const __m256 lo = _mm256_cvtph_ps(
            _mm_setr_epi32(ld32(r), ld32(r + width), ld32(r + 4 * width), ld32(r + 5 * width)));
        const __m256 hi = _mm256_cvtph_ps(_mm_setr_epi32(ld32(r + 2 * width), ld32(r + 3 * width),
                                                         ld32(r + 6 * width), ld32(r + 7 * width)));
        _mm256_store_ps((float*)(o + 8), _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm256_store_ps((float*)(o + 9), _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
    }
}

// -- MR activation rows x the 8-row tile -> out [MR][8] -------------------------------------------
static inline __m256i bcast4(const int8_t* p) {  // 4 activation bytes to every lane (a load)
    return _mm256_castps_si256(_mm256_broadcast_ss((const float*)p));
}

// pf: the next tile's 8 weight rows (or null), prefetched towards L2 a block's share at a time
// while this tile computes; the packing loads otherwise wait on memory with no arithmetic to
// overlap (at one thread they took as long as the arithmetic; a burst of prefetches at the start
// of a tile stalled on the miss queue instead).
template <int MR>
static inline void tile_rows(const __m256i* buf, int64_t nb, const int8_t* xq, const float* xd,
                             const float* xs, int64_t K, float* out, const uint8_t* pf) {
    const int64_t pfb = 8 * 20;  // the next tile's bytes per block
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i* t = buf + b * TILE_VECS;
        const int8_t* xb = xq + b * 32;
        if (pf)
            for (int64_t off = b * pfb & ~(int64_t)63; off < (b + 1) * pfb; off += 64)
                _mm_prefetch((const char*)(pf + off), _MM_HINT_T1);
        __m256i s[MR];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) s[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m256i wa = _mm256_load_si256(t + j);  // pairs with activation dword j
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                s[r] = _mm256_add_epi16(s[r], _mm256_maddubs_epi16(wa, bcast4(xb + r * K + 4 * j)));
                // Keep each row's sum one chain: g++ otherwise reassociates the 32 products of a
                // block into a tree that spills to the stack (17-20 % slower at 2-16 rows).
                __asm__("" : "+x"(s[r]));
            }
        }
        const __m256 d8 = _mm256_load_ps((const float*)(t + 8));
        const __m256 m8 = _mm256_load_ps((const float*)(t + 9));
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            const __m256i p = _mm256_madd_epi16(s[r], ones);  // int16 pairs -> int32 per row
            const __m256 dd = _mm256_mul_ps(d8, _mm256_set1_ps(xd[r * nb + b]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dd, acc[r]);
            acc[r] = _mm256_fmadd_ps(m8, _mm256_set1_ps(xs[r * nb + b]), acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) _mm256_storeu_ps(out + r * 8, acc[r]);
}

// All M activation rows against one packed tile: out [M][8].
static void tile_all_rows(const __m256i* buf, int64_t nb, const QRow& x, int64_t M, int64_t K,
                          float* out, const uint8_t* pf) {
    int64_t r = 0;
    for (; r + 4 <= M; r += 4, pf = nullptr)  // the first pass prefetches
        tile_rows<4>(buf, nb, x.q + r * K, x.d + r * nb, x.s + r * nb, K, out + r * 8, pf);
    const int rest = (int)(M - r);
    const int8_t* q = x.q + r * K;
    const float *d = x.d + r * nb, *s = x.s + r * nb;
    if (rest == 3) tile_rows<3>(buf, nb, q, d, s, K, out + r * 8, pf);
    if (rest == 2) tile_rows<2>(buf, nb, q, d, s, K, out + r * 8, pf);
    if (rest == 1) tile_rows<1>(buf, nb, q, d, s, K, out + r * 8, pf);
}

// Output rows [n0, n1) of y = x @ W.T (epilogues as qmm_rows: 0 store, 1 add, 2 SwiGLU with the
// up rows N below the gate rows): whole 8-row tiles here, the last n1 - n0 mod 8 rows by qmm_rows.
static void qmm_tiles(const uint8_t* w, int64_t N, int64_t K, const QRow& x, int64_t M, float* y,
                      int64_t ldy, int mode, int64_t n0, int64_t n1) {
    const int64_t nb = K / 32, width = nb * 20;
    std::vector<uint8_t> raw(nb * TILE_VECS * 32 + 32);  // 32-byte aligned below
    __m256i* buf = (__m256i*)(((uintptr_t)raw.data() + 31) & ~(uintptr_t)31);
    std::vector<float> v(M * 8), g(mode == 2 ? M * 8 : 0);  // [M, 8] per tile
    int64_t n = n0;
    for (; n + 8 <= n1; n += 8) {
        // the tile computed next: SwiGLU's up rows after the gate rows, then the next gate rows
        const uint8_t* next = n + 16 <= n1 ? w + (n + 8) * width : nullptr;
        pack_q4_1(w + n * width, width, nb, buf);
        tile_all_rows(buf, nb, x, M, K, v.data(), mode == 2 ? w + (n + N) * width : next);
        if (mode == 2) {
            pack_q4_1(w + (n + N) * width, width, nb, buf);
            tile_all_rows(buf, nb, x, M, K, g.data(), next);
        }
        for (int64_t r = 0; r < M; r++) {
            float* o = y + r * ldy + n;
            const float* vr = v.data() + r * 8;
            if (mode == 0) for (int i = 0; i < 8; i++) o[i] = vr[i];
            else if (mode == 1) for (int i = 0; i < 8; i++) o[i] += vr[i];
            else
                for (int i = 0; i < 8; i++) o[i] = vr[i] / (1.0f + expf(-vr[i])) * g[r * 8 + i];
        }
    }
    if (n < n1) qmm_rows<true>(w, N, K, x, M, y, ldy, mode, n, n1);
}

// This thread's share of the output rows, split on whole tiles (the last thread takes the rest).
// One activation row stays on qmm_rows: with nothing to amortize the unpacking over, a whole
// SmolLM2 decode step at 1 row took 23.7 and 24.0 ms on tiles (before the prefetch) vs 16.3 and
// 17.3 on qmm_rows (1 thread, thread CPU time, medians of 7, machine at load ~10).
static void qmm_part(const uint8_t* w, bool q4, int64_t N, int64_t K, const QRow& x, int64_t M,
                     float* y, int64_t ldy, int mode, int tid, int nt) {
    const int64_t tiles = N / 8;
    const int64_t n0 = tiles * tid / nt * 8, n1 = tid + 1 == nt ? N : tiles * (tid + 1) / nt * 8;
    if (q4 && M >= 2) qmm_tiles(w, N, K, x, M, y, ldy, mode, n0, n1);
    else if (q4) qmm_rows<true>(w, N, K, x, M, y, ldy, mode, n0, n1);
    else qmm_rows<false>(w, N, K, x, M, y, ldy, mode, n0, n1);
}

extern "C" {
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
}
