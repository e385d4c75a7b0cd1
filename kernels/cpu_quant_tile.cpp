// Fluxo's register-tiled int8 GEMMs: 8 weight rows x up to 4 activation rows per inner loop, for 2
// or more activation rows; Q4_1 (the layers) and Q8_0 (the vocabulary head, and q8's layers).
// Compiled after kernels/cpu_quant_int8.cpp (QRow, quantize_rows, and qmm_rows: the N remainder)
// and before cpu_quant_decode.cpp, by kernels/cpu_quant_build.py.
//
// The one-row kernels (cpu_quant_int8.cpp) reduce every (weight row, activation row, block) to a
// scalar: maddubs, madd, a horizontal step, a conversion and an fma per pair, and unpack each
// weight block again for every group of 4 activation rows. Here the weights of 8 rows are laid
// out so that 32-bit lane i of a vector holds 4 consecutive weights of row i: one broadcast of 4
// activation bytes times that vector (maddubs) advances all 8 rows at once, with no horizontal
// reduction. Q4_1: a block of one activation row costs 8 maddubs, 7 int16 adds (|sum| <= 8 * 2 *
// 15 * 127 = 30480: no overflow), 1 madd, 1 conversion, 1 scale multiply and 2 fmas (d * dx * sum
// + m * s, the Q8_1 block sum) for 8 (row, row) pairs.
//
// That layout is made once at load (fluxo_q4_1_tiles / fluxo_q8_0_tiles: a second copy of each
// matrix, same size, that the products at 2+ rows read; one row reads the GGUF blocks), and keeps
// the bytes of the format (Q4_1 nibbles unpacked by shift + and in registers, fp16 scales), so a
// step reads as many bytes as before. Without a copy, Q4_1 tiles are packed per call.
// Measured 2026-11-30 (1 thread, 8 rows, thread CPU time, median of 61 (head: 21), machine at load
// 9-11 from other jobs; random weights, cache-resident but the head; three A/B pairs), ms, tiles
// packed per call -> at load: qkv 960x576 0.130 0.080 0.102 -> 0.106 0.069 0.071, gate+up
// 3072x576 0.433 0.311 0.432 -> 0.371 0.246 0.239, down 576x1536 0.188 0.153 0.126 -> 0.157 0.157
// 0.158; the Q8_0 head 49152x576, one-row kernel -> tiles: 10.38 10.75 7.59 -> 6.30 5.06 5.30.
// Whole SmolLM2 q4 step, 8 rows, ctx 128 (engine.lab.roofline, median of 9; with the exp8 of
// cpu_quant_decode.cpp), before -> after, A B A B: 1 thread (15:31-15:45 UTC, load 2.1-2.6) 44.9
// 44.0 40.1 43.6 -> 26.0 30.6 25.3 34.7 ms; 2 threads, the one pair at load ~1.8 (15:31) 27.1
// (25.8-32.0) -> 19.3 (18.9-19.6) and 18.7 (17.6-19.2): 0.27 -> 0.39 of the read roof (19.1-19.7
// GB/s); at load 2-5 every 2-thread median, either version, was 58-750 ms (threads descheduled
// at the step's barriers).
// (Before: one-row kernels -> tiles packed per call, load ~10: qkv 0.237 -> 0.154, o 576x576
// 0.108 -> 0.065, gate+up 0.906 -> 0.792, down 0.217 -> 0.137; Q8_0 tiles packed per call were
// 1.5x slower than the one-row kernel on the head.)

// -- weight tiles: 8 rows x nb blocks -> lane-interleaved bytes + fp16 scales ----------------------
constexpr int64_t TILE_BYTES = 160;  // a block of a tile: 4 x 32 bytes of nibbles, 8 fp16 d, 8 m

// The tile layout (20 bytes per 32 weights, as Q4_1): for each 8-row tile, its nb blocks of
// TILE_BYTES each. Q4_1: qs byte p of a block holds weight p (low nibble) and p + 16 (high). Lane i
// of vector j takes row i's qs bytes 4j..4j+3 (a 4x4 dword transpose per 128-bit half: rows 0-3
// low, 4-7 high), so its low nibbles are weights 4j..4j+3 and its high ones 16+4j..: masked in
// registers by tile_rows, low nibbles pair with the activation's dword j and high ones with j + 4.
// Then the 8 rows' d, then their m (fp16, lane order). Written once at load (fluxo_q4_1_tiles) or
// per call where a product has no packed copy.
#ifdef FLUXO_X86
static inline void pack_q4_1(const uint8_t* w, int64_t width, int64_t nb, uint8_t* out) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t* r = w + b * 20;
        __m256i a[4];
        for (int i = 0; i < 4; i++)  // a[i] = [row i | row i + 4]
            a[i] = _mm256_loadu2_m128i((const __m128i*)(r + (i + 4) * width + 4),
                                       (const __m128i*)(r + i * width + 4));
        const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
        const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
        uint8_t* o = out + b * TILE_BYTES;
        _mm256_storeu_si256((__m256i*)o, _mm256_unpacklo_epi64(t0, t2));
        _mm256_storeu_si256((__m256i*)(o + 32), _mm256_unpackhi_epi64(t0, t2));
        _mm256_storeu_si256((__m256i*)(o + 64), _mm256_unpacklo_epi64(t1, t3));
        _mm256_storeu_si256((__m256i*)(o + 96), _mm256_unpackhi_epi64(t1, t3));
        for (int i = 0; i < 8; i++) {
            memcpy(o + 128 + 2 * i, r + i * width, 2);
            memcpy(o + 144 + 2 * i, r + i * width + 2, 2);
        }
    }
}

#else
static inline void pack_q4_1(const uint8_t* w, int64_t width, int64_t nb, uint8_t* out) {
    for (int64_t b = 0; b < nb; b++) {  // the same bytes as x86's unpacks, by copies
        const uint8_t* r = w + b * 20;
        uint8_t* o = out + b * TILE_BYTES;
        for (int i = 0; i < 8; i++) {
            for (int j = 0; j < 4; j++) memcpy(o + 32 * j + 4 * i, r + i * width + 4 + 4 * j, 4);
            memcpy(o + 128 + 2 * i, r + i * width, 2);
            memcpy(o + 144 + 2 * i, r + i * width + 2, 2);
        }
    }
}

#endif

constexpr int64_t TILE8_BYTES = 272;  // a block of a Q8_0 tile: 8 x 32 int8, then 8 fp16 d

// Q8_0's tile layout (34 bytes a row-block, as Q8_0): lane i of vector j holds row i's int8 weights
// 4j..4j+3, then the 8 rows' d. Packed once at load only (fluxo_q8_0_tiles).
static void pack_q8_0(const uint8_t* w, int64_t width, int64_t nb, uint8_t* out) {
    for (int64_t b = 0; b < nb; b++) {
        uint8_t* o = out + b * TILE8_BYTES;
        for (int i = 0; i < 8; i++) {
            const uint8_t* r = w + i * width + b * 34;
            for (int j = 0; j < 8; j++) memcpy(o + 32 * j + 4 * i, r + 2 + 4 * j, 4);
            memcpy(o + 256 + 2 * i, r, 2);
        }
    }
}

#ifdef FLUXO_X86
// -- the integer dot step: u8 weights x s8 activations, 4 products a 32-bit lane ----------------------
// AVX2: maddubs gives int16 pairs, added up in int16 (a Q4_1 block's |sum| <= 30480: exact) and
// widened once a block (madd); Q8_0's pairs reach 2 * 127 * 128 and are widened every step.
// VNNI (FLUXO_VNNI: the avx512vnni and avxvnni builds): vpdpbusd adds the four products of a lane into
// int32 in one instruction. The integer sums are the same numbers either way (nothing saturates),
// so both builds give bit-identical results; VNNI only drops the adds and the widening.
#ifdef FLUXO_VNNI
static inline __m256i dot_step(__m256i acc, __m256i w, __m256i x) { return fluxo_dpbusd(acc, w, x); }
static inline __m256i dot_sum(__m256i acc, __m256i) { return acc; }
static inline __m256i dot_step32(__m256i acc, __m256i w, __m256i x, __m256i) {
    return fluxo_dpbusd(acc, w, x);
}
#else
static inline __m256i dot_step(__m256i acc, __m256i w, __m256i x) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x));
}
static inline __m256i dot_sum(__m256i acc, __m256i ones) { return _mm256_madd_epi16(acc, ones); }
static inline __m256i dot_step32(__m256i acc, __m256i w, __m256i x, __m256i ones) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
}
#endif

// -- MR activation rows x the 8-row tile -> out [MR][8] -------------------------------------------
static inline __m256i bcast4(const int8_t* p) {  // 4 activation bytes to every lane (a load)
    return _mm256_castps_si256(_mm256_broadcast_ss((const float*)p));
}

// pf: the next tile's 8 weight rows (or null), prefetched into L1 a block's share at a time
// while this tile computes; the packing loads otherwise wait on memory with no arithmetic to
// overlap (at one thread they took as long as the arithmetic; a burst of prefetches at the start
// of a tile stalled on the miss queue instead). Into L1 (T0), not L2 (T1): the whole q4 step,
// ctx 128, 2 threads, Zen 5 EPYC, 2026-12-01 20:40 UTC, engine.lab.kernel_ab against T1, 80
// pairs in turn, tree/HEAD at 1, 4, 8, 16 rows: avx512vnni 0.994 0.988 0.937 0.946 (8 rows, the
// pair kernel's prefetch alone, in two more runs: 0.950 0.971), avx2 0.982 0.958 0.987 0.968;
// bits unchanged. (Two pairs ahead instead of one, T1: 1.022 at 8 rows.)
template <int MR>
static inline void tile_rows(const uint8_t* tile, int64_t nb, const int8_t* xq, const float* xd,
                             const float* xs, int64_t K, float* out, const uint8_t* pf) {
    const int64_t pfb = TILE_BYTES;  // the next tile's bytes per block (either layout)
    const __m256i ones = _mm256_set1_epi16(1), mask = _mm256_set1_epi8(0x0F);
    f8 acc[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) acc[r] = f8_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t* t = tile + b * TILE_BYTES;
        __m256i raw[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) raw[j] = _mm256_loadu_si256((const __m256i*)(t + 32 * j));
        const int8_t* xb = xq + b * 32;
        if (pf)
            for (int64_t off = b * pfb & ~(int64_t)63; off < (b + 1) * pfb; off += 64)
                _mm_prefetch((const char*)(pf + off), _MM_HINT_T0);
        __m256i s[MR];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) s[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m256i wa = j < 4 ? _mm256_and_si256(raw[j], mask)  // pairs with dword j
                                     : _mm256_and_si256(_mm256_srli_epi16(raw[j - 4], 4), mask);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                s[r] = dot_step(s[r], wa, bcast4(xb + r * K + 4 * j));
                // Keep each row's sum one chain: g++ otherwise reassociates the 32 products of a
                // block into a tree that spills to the stack (17-20 % slower at 2-16 rows).
                __asm__("" : "+x"(s[r]));
            }
        }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(t + 128)));
        const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(t + 144)));
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            const __m256i p = dot_sum(s[r], ones);  // int32 per (weight row, activation row)
            const __m256 dd = _mm256_mul_ps(d8, _mm256_set1_ps(xd[r * nb + b]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dd, acc[r]);
            acc[r] = _mm256_fmadd_ps(m8, _mm256_set1_ps(xs[r * nb + b]), acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) f8_store(out + r * 8, acc[r]);
}

// The Q8_0 tile: signed weights, so |w| is maddubs' unsigned operand and w's sign moves onto the
// broadcast activation (one sign a row and dword); a maddubs pair reaches 2 * 127 * 127, so each is
// widened to int32 (madd) before the block sum. xs: unused (no min).
template <int MR>
static inline void tile8_rows(const uint8_t* tile, int64_t nb, const int8_t* xq, const float* xd,
                              const float*, int64_t K, float* out, const uint8_t* pf) {
    const __m256i ones = _mm256_set1_epi16(1);
    f8 acc[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) acc[r] = f8_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t* t = tile + b * TILE8_BYTES;
        const int8_t* xb = xq + b * 32;
        if (pf)
            for (int64_t off = b * TILE8_BYTES & ~(int64_t)63; off < (b + 1) * TILE8_BYTES; off += 64)
                _mm_prefetch((const char*)(pf + off), _MM_HINT_T0);
        __m256i s[MR];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) s[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m256i w = _mm256_loadu_si256((const __m256i*)(t + 32 * j));
            const __m256i aw = _mm256_sign_epi8(w, w);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const __m256i xv = _mm256_sign_epi8(bcast4(xb + r * K + 4 * j), w);
                s[r] = dot_step32(s[r], aw, xv, ones);
                __asm__("" : "+x"(s[r]));
            }
        }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(t + 256)));
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            const __m256 dd = _mm256_mul_ps(d8, _mm256_set1_ps(xd[r * nb + b]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), dd, acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) f8_store(out + r * 8, acc[r]);
}

#if defined(FLUXO_VNNI) && defined(__AVX512F__) && defined(__AVX512BW__)
// -- two 8-row tiles at once in 512-bit vectors (the avx512vnni build) ------------------------------
// The tiles stay in their 8-row layout (one packing for every build); a zmm holds block b of tile
// A in its low 256 bits and block b of tile B in its high 256, so one vpdpbusd advances 16 weight
// rows by 4 products, and each broadcast activation dword serves 16 rows instead of 8. Every lane
// runs tile_rows' VNNI chain and its fp32 epilogue (the same integer sum, the same mul and two
// fmas in the same order), so a pair's outputs are tile_rows' bit for bit: results never depend
// on how a thread's tiles fall into pairs.
#define FLUXO_ZMM 1
// From how many activation rows a product runs its tiles in pairs. The whole SmolLM2 q4 step at
// ctx 128 against HEAD's one tile at a time (engine.lab.kernel_ab, 60-80 pairs in turn, 2
// threads, Zen 5 EPYC, 2026-12-01 20:00-20:05 UTC, load < 1), tree/HEAD medians; first with pairs
// from 2 rows (1-row step 2.5 ms): 2 rows 1.095, 4 1.028-1.034, 5 0.968, 6 0.918, 7 0.885, 8
// 0.865-0.881, 12 0.831, 16 0.789; then from 5 rows, twice, while the host was busier (1-row step
// 3.0-3.5 ms): 4 rows 0.997 1.003 (one tile), 5 1.023 1.005, 6 0.984 0.988, 8 0.933 0.925, 16
// 0.810 0.814. Every logit bit for bit equal. With few rows the step waits on memory more than on
// the products, and one tile at a time is as fast or faster there.
constexpr int64_t PAIR_ROWS = 6;
static inline __m512i pair_load(const uint8_t* a, const uint8_t* b) {  // 32 bytes of each tile
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)a)),
                              _mm256_loadu_si256((const __m256i*)b), 1);
}
static inline __m512 pair_half(const uint8_t* a, const uint8_t* b) {  // 8 + 8 fp16 -> 16 fp32
    return _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)a)), _mm_loadu_si128((const __m128i*)b), 1));
}
static inline __m512i bcast4_16(const int8_t* p) {  // 4 activation bytes to every lane (a load)
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}
static inline void pair_store(float* a, float* b, __m512 v) {
    _mm256_storeu_ps(a, _mm512_castps512_ps256(v));
    _mm256_storeu_ps(b, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
static inline void pair_prefetch(const uint8_t* pf, int64_t tile_b, int64_t b, int64_t block) {
    if (!pf) return;  // the next pair's two tiles, a block's share of each
    for (int64_t off = b * block & ~(int64_t)63; off < (b + 1) * block; off += 64) {
        _mm_prefetch((const char*)(pf + off), _MM_HINT_T0);
        _mm_prefetch((const char*)(pf + tile_b + off), _MM_HINT_T0);
    }
}

// tile_rows for tiles a and b at once: outa, outb [MR][8]. pf: the next pair's first tile (its
// second at pf + tile_b), or null.
template <int MR>
static inline void tile_pair_rows(const uint8_t* ta, const uint8_t* tb, int64_t nb, const int8_t* xq,
                                  const float* xd, const float* xs, int64_t K, float* outa,
                                  float* outb, const uint8_t* pf, int64_t tile_b) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    __m512 acc[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *a = ta + b * TILE_BYTES, *c = tb + b * TILE_BYTES;
        __m512i raw[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) raw[j] = pair_load(a + 32 * j, c + 32 * j);
        const int8_t* xb = xq + b * 32;
        pair_prefetch(pf, tile_b, b, TILE_BYTES);
        __m512i s[MR];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) s[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m512i wa = j < 4 ? _mm512_and_si512(raw[j], mask)
                                     : _mm512_and_si512(_mm512_srli_epi16(raw[j - 4], 4), mask);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                s[r] = _mm512_dpbusd_epi32(s[r], wa, bcast4_16(xb + r * K + 4 * j));
                __asm__("" : "+v"(s[r]));  // one chain a row, as in tile_rows
            }
        }
        const __m512 d16 = pair_half(a + 128, c + 128), m16 = pair_half(a + 144, c + 144);
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            const __m512 dd = _mm512_mul_ps(d16, _mm512_set1_ps(xd[r * nb + b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r]), dd, acc[r]);
            acc[r] = _mm512_fmadd_ps(m16, _mm512_set1_ps(xs[r * nb + b]), acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) pair_store(outa + r * 8, outb + r * 8, acc[r]);
}

// tile8_rows for tiles a and b at once. AVX-512 has no vpsignb: |w| by vpabsb, and the
// activation negated where w < 0 by a masked subtraction (where w is 0, |w| is 0 and so is the
// product, as vpsignb's zero gives): the same int8 operands as tile8_rows', the same sums.
template <int MR>
static inline void tile8_pair_rows(const uint8_t* ta, const uint8_t* tb, int64_t nb, const int8_t* xq,
                                   const float* xd, const float*, int64_t K, float* outa,
                                   float* outb, const uint8_t* pf, int64_t tile_b) {
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *a = ta + b * TILE8_BYTES, *c = tb + b * TILE8_BYTES;
        const int8_t* xb = xq + b * 32;
        pair_prefetch(pf, tile_b, b, TILE8_BYTES);
        __m512i s[MR];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) s[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m512i w = pair_load(a + 32 * j, c + 32 * j);
            const __m512i aw = _mm512_abs_epi8(w);
            const __mmask64 neg = _mm512_movepi8_mask(w);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const __m512i x = bcast4_16(xb + r * K + 4 * j);
                s[r] = _mm512_dpbusd_epi32(s[r], aw, _mm512_mask_sub_epi8(x, neg, zero, x));
                __asm__("" : "+v"(s[r]));
            }
        }
        const __m512 d16 = pair_half(a + 256, c + 256);
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            const __m512 dd = _mm512_mul_ps(d16, _mm512_set1_ps(xd[r * nb + b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r]), dd, acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) pair_store(outa + r * 8, outb + r * 8, acc[r]);
}

// All M activation rows against tiles a and b: outa, outb [M][8] (tile_all_rows for a pair).
template <bool Q4>
static void tile_pair_all_rows(const uint8_t* ta, const uint8_t* tb, int64_t nb, const QRow& x,
                               int64_t M, int64_t K, float* outa, float* outb, const uint8_t* pf,
                               int64_t tile_b) {
    int64_t r = 0;
    for (; r + 4 <= M; r += 4, pf = nullptr) {  // the first pass prefetches
        const int8_t* q = x.q + r * K;
        const float *d = x.d + r * nb, *s = x.s + r * nb;
        if (Q4) tile_pair_rows<4>(ta, tb, nb, q, d, s, K, outa + r * 8, outb + r * 8, pf, tile_b);
        else tile8_pair_rows<4>(ta, tb, nb, q, d, s, K, outa + r * 8, outb + r * 8, pf, tile_b);
    }
    const int rest = (int)(M - r);
    const int8_t* q = x.q + r * K;
    const float *d = x.d + r * nb, *s = x.s + r * nb;
    float *oa = outa + r * 8, *ob = outb + r * 8;
    if (rest == 3) (Q4 ? tile_pair_rows<3> : tile8_pair_rows<3>)(ta, tb, nb, q, d, s, K, oa, ob, pf, tile_b);
    if (rest == 2) (Q4 ? tile_pair_rows<2> : tile8_pair_rows<2>)(ta, tb, nb, q, d, s, K, oa, ob, pf, tile_b);
    if (rest == 1) (Q4 ? tile_pair_rows<1> : tile8_pair_rows<1>)(ta, tb, nb, q, d, s, K, oa, ob, pf, tile_b);
}
#endif

#else
// -- the same tiles on ARM (the neon build) ---------------------------------------------------------
// A tile vector's 32 bytes are two NEON registers: rows 0-3 and rows 4-7. sdot adds the four
// products of each 32-bit lane into int32 (weights x activations, both signed: Q4_1's nibbles
// 0..15 fit, and Q8_0 needs no sign trick), the same integers as x86's maddubs chains; the fp32
// epilogue is x86's, lane for lane. (udot would need unsigned activations; i8mm's smmla/usmmla
// multiply 2x8 by 8x2 blocks, another tile layout: not used, see docs/architecture.md.)
static inline int8x16_t bcast4(const int8_t* p) {  // 4 activation bytes to every lane
    int32_t v;
    memcpy(&v, p, 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

template <int MR>
static inline void tile_rows(const uint8_t* tile, int64_t nb, const int8_t* xq, const float* xd,
                             const float* xs, int64_t K, float* out, const uint8_t* pf) {
    const int64_t pfb = TILE_BYTES;
    const uint8x16_t mask = vdupq_n_u8(0x0F);
    f8 acc[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) acc[r] = f8_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t* t = tile + b * TILE_BYTES;
        uint8x16_t raw[8];  // vector j's rows 0-3 at 2j, rows 4-7 at 2j + 1
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) raw[j] = vld1q_u8(t + 16 * j);
        const int8_t* xb = xq + b * 32;
        if (pf)
            for (int64_t off = b * pfb & ~(int64_t)63; off < (b + 1) * pfb; off += 64)
                __builtin_prefetch(pf + off, 0, 2);
        int32x4_t s0[MR], s1[MR];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) s0[r] = s1[r] = vdupq_n_s32(0);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const int k = 2 * (j & 3);
            const int8x16_t w0 = vreinterpretq_s8_u8(j < 4 ? vandq_u8(raw[k], mask) : vshrq_n_u8(raw[k], 4));
            const int8x16_t w1 =
                vreinterpretq_s8_u8(j < 4 ? vandq_u8(raw[k + 1], mask) : vshrq_n_u8(raw[k + 1], 4));
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const int8x16_t xv = bcast4(xb + r * K + 4 * j);
                s0[r] = vdotq_s32(s0[r], w0, xv);
                s1[r] = vdotq_s32(s1[r], w1, xv);
            }
        }
        const f8 d8 = f8_half(t + 128), m8 = f8_half(t + 144);
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            const f8 dd = f8_mul(d8, f8_set1(xd[r * nb + b]));
            acc[r] = f8_fma(f8_i32(s0[r], s1[r]), dd, acc[r]);
            acc[r] = f8_fma(m8, f8_set1(xs[r * nb + b]), acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) f8_store(out + r * 8, acc[r]);
}

template <int MR>
static inline void tile8_rows(const uint8_t* tile, int64_t nb, const int8_t* xq, const float* xd,
                              const float*, int64_t K, float* out, const uint8_t* pf) {
    f8 acc[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) acc[r] = f8_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t* t = tile + b * TILE8_BYTES;
        const int8_t* xb = xq + b * 32;
        if (pf)
            for (int64_t off = b * TILE8_BYTES & ~(int64_t)63; off < (b + 1) * TILE8_BYTES; off += 64)
                __builtin_prefetch(pf + off, 0, 2);
        int32x4_t s0[MR], s1[MR];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) s0[r] = s1[r] = vdupq_n_s32(0);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const int8x16_t w0 = vld1q_s8((const int8_t*)(t + 32 * j));
            const int8x16_t w1 = vld1q_s8((const int8_t*)(t + 32 * j + 16));
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const int8x16_t xv = bcast4(xb + r * K + 4 * j);
                s0[r] = vdotq_s32(s0[r], w0, xv);
                s1[r] = vdotq_s32(s1[r], w1, xv);
            }
        }
        const f8 d8 = f8_half(t + 256);
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            const f8 dd = f8_mul(d8, f8_set1(xd[r * nb + b]));
            acc[r] = f8_fma(f8_i32(s0[r], s1[r]), dd, acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) f8_store(out + r * 8, acc[r]);
}

#endif

// All M activation rows against one packed tile: out [M][8].
template <bool Q4>
static void tile_all_rows(const uint8_t* buf, int64_t nb, const QRow& x, int64_t M, int64_t K,
                          float* out, const uint8_t* pf) {
    int64_t r = 0;
    for (; r + 4 <= M; r += 4, pf = nullptr) {  // the first pass prefetches
        const int8_t* q = x.q + r * K;
        if (Q4) tile_rows<4>(buf, nb, q, x.d + r * nb, x.s + r * nb, K, out + r * 8, pf);
        else tile8_rows<4>(buf, nb, q, x.d + r * nb, x.s + r * nb, K, out + r * 8, pf);
    }
    const int rest = (int)(M - r);
    const int8_t* q = x.q + r * K;
    const float *d = x.d + r * nb, *s = x.s + r * nb;
    if (rest == 3) (Q4 ? tile_rows<3> : tile8_rows<3>)(buf, nb, q, d, s, K, out + r * 8, pf);
    if (rest == 2) (Q4 ? tile_rows<2> : tile8_rows<2>)(buf, nb, q, d, s, K, out + r * 8, pf);
    if (rest == 1) (Q4 ? tile_rows<1> : tile8_rows<1>)(buf, nb, q, d, s, K, out + r * 8, pf);
}

// One tile's 8 outputs of an activation row into o: store (mode 0), add (1), or SwiGLU (2: silu(vr)
// * gr, 8 at once; SmolLM2 at 8 rows: 368k scalar expf a step otherwise).
static inline void tile_out(float* o, const float* vr, const float* gr, int mode) {
    if (mode == 0) for (int i = 0; i < 8; i++) o[i] = vr[i];
    else if (mode == 1) for (int i = 0; i < 8; i++) o[i] += vr[i];
    else {
        const f8 a = f8_load(vr), e = exp8(f8_sub(f8_zero(), a));
        const f8 sl = f8_div(a, f8_add(f8_set1(1.0f), e));
        f8_store(o, f8_mul(sl, f8_load(gr)));
    }
}

// Output rows [n0, n1) of y = x @ W.T (epilogues as qmm_rows: 0 store, 1 add, 2 SwiGLU with the
// up rows N below the gate rows): whole 8-row tiles here, the last n1 - n0 mod 8 rows by qmm_rows.
// tiles: W in the tile layout (fluxo_q4_1_tiles), read in place; null: each tile packed per call.
// Q8_0 (Q4 false): tiles only, never packed per call.
template <bool Q4>
static void qmm_tiles(const uint8_t* w, const uint8_t* tiles, int64_t N, int64_t K, const QRow& x,
                      int64_t M, float* y, int64_t ldy, int mode, int64_t n0, int64_t n1) {
    const int64_t nb = K / 32, width = nb * (Q4 ? 20 : 34);
    std::vector<uint8_t> buf(tiles ? 0 : nb * TILE_BYTES);  // Q4_1 only
    std::vector<float> v(M * 16), g(M * 16);  // [M, 8] a tile ([2, M, 8] a pair); g: SwiGLU's up
    const uint8_t* src = tiles ? tiles : w;  // the next tile's bytes lie at the same offset in both
    int64_t n = n0;
#ifdef FLUXO_ZMM
    // Tiles packed at load, two at a time (tile_pair_all_rows) from PAIR_ROWS rows on; fewer rows,
    // an odd last tile, and tiles packed per call, one at a time below: the same bits either way.
    const bool pairs = tiles && M >= PAIR_ROWS;
    for (; pairs && n + 16 <= n1; n += 16) {
        const uint8_t* next = n + 32 <= n1 ? tiles + (n + 16) * width : nullptr;  // the next pair
        const int64_t tb = 8 * width;  // a pair's second tile, after its first
        float *va = v.data(), *vb = v.data() + M * 8, *ga = g.data(), *gb = g.data() + M * 8;
        tile_pair_all_rows<Q4>(tiles + n * width, tiles + n * width + tb, nb, x, M, K, va, vb,
                               mode == 2 ? tiles + (n + N) * width : next, tb);
        if (mode == 2)
            tile_pair_all_rows<Q4>(tiles + (n + N) * width, tiles + (n + N) * width + tb, nb, x, M, K,
                                   ga, gb, next, tb);
        for (int64_t r = 0; r < M; r++) {
            tile_out(y + r * ldy + n, va + r * 8, ga + r * 8, mode);
            tile_out(y + r * ldy + n + 8, vb + r * 8, gb + r * 8, mode);
        }
    }
#endif
    for (; n + 8 <= n1; n += 8) {
        // the tile computed next: SwiGLU's up rows after the gate rows, then the next gate rows
        const uint8_t* next = n + 16 <= n1 ? src + (n + 8) * width : nullptr;
        const uint8_t* a = tiles ? tiles + n * width : buf.data();
        if (Q4 && !tiles) pack_q4_1(w + n * width, width, nb, buf.data());
        tile_all_rows<Q4>(a, nb, x, M, K, v.data(), mode == 2 ? src + (n + N) * width : next);
        if (mode == 2) {
            const uint8_t* u = tiles ? tiles + (n + N) * width : buf.data();
            if (Q4 && !tiles) pack_q4_1(w + (n + N) * width, width, nb, buf.data());
            tile_all_rows<Q4>(u, nb, x, M, K, g.data(), next);
        }
        for (int64_t r = 0; r < M; r++)
            tile_out(y + r * ldy + n, v.data() + r * 8, g.data() + r * 8, mode);
    }
    if (n < n1) qmm_rows<Q4>(w, N, K, x, M, y, ldy, mode, n, n1);
}

// This thread's share of the output rows, split on whole tiles (the last thread takes the rest).
// Every row count runs the tiles, one row included, and the N remainder runs qmm_rows one
// activation row at a time: an output element is then the same instructions in the same order
// whatever M is (tile_rows<MR> keeps one accumulator chain per row for any MR), which is what makes
// a step's rows batch-invariant (cpu_quant_decode.cpp). One row on tiles is no longer slower than
// the one-row kernel (it was before the prefetch): the whole SmolLM2 q4 decode step at ctx 128,
// `bench kernels --against` the one-row kernel's revision, 60 pairs in turn, 2 threads, machine at
// load ~4 from other jobs (2026-12-01 14:10 UTC, AVX-512 EPYC): 1 row 3.03 -> 2.26 ms (pair
// ratios 0.71-0.78), 8 rows 8.45 -> 7.05 (0.90-0.99; logits bit for bit unchanged at 8 rows).
// tiles: W's packed copy or null (SwiGLU's up rows start a tile only where N is a multiple of 8).
static void qmm_part(const uint8_t* w, const uint8_t* tiles, bool q4, int64_t N, int64_t K,
                     const QRow& x, int64_t M, float* y, int64_t ldy, int mode, int tid, int nt) {
    const int64_t tiles_n = N / 8;
    const int64_t n0 = tiles_n * tid / nt * 8, n1 = tid + 1 == nt ? N : tiles_n * (tid + 1) / nt * 8;
    if (mode == 2 && N % 8) tiles = nullptr;
    if (q4) qmm_tiles<true>(w, tiles, N, K, x, M, y, ldy, mode, n0, n1);
    else if (tiles) qmm_tiles<false>(w, tiles, N, K, x, M, y, ldy, mode, n0, n1);
    else qmm_rows<false>(w, N, K, x, M, y, ldy, mode, n0, n1);
}

extern "C" {
// y [M, N'] = act(x [M, K] @ W.T) with x quantized to Q8_1; mode 0: y = x W^T (N' = N);
// 2: W is gate rows then up rows, y = silu(gate) * up (N' = N / 2). tiles: W in the tile layout
// (fluxo_q4_1_tiles) or null.
void fluxo_qmm(const float* x, int64_t M, int64_t K, const uint8_t* w, const uint8_t* tiles, int q4,
               int64_t N, float* y, int mode, int threads) {
    std::vector<int8_t> q(M * K);
    std::vector<float> d(M * K / 32), s(M * K / 32);
    QRow xr{q.data(), d.data(), s.data()};
    quantize_rows(x, M, K, xr);
    const int64_t n = mode == 2 ? N / 2 : N;
    #pragma omp parallel num_threads(threads)
    qmm_part(w, tiles, q4, n, K, xr, M, y, n, mode, omp_get_thread_num(), omp_get_num_threads());
}

// Q4_1 rows [N, K] -> out, same size: every whole 8-row tile in the tile layout (at the tile's own
// byte offset), the last N mod 8 rows copied as they are.
void fluxo_q4_1_tiles(const uint8_t* w, int64_t N, int64_t K, uint8_t* out) {
    const int64_t nb = K / 32, width = nb * 20;
    int64_t n = 0;
    for (; n + 8 <= N; n += 8) pack_q4_1(w + n * width, width, nb, out + n * width);
    memcpy(out + n * width, w + n * width, (N - n) * width);
}

// Q8_0 rows [N, K] -> out, same size: whole 8-row tiles in Q8_0's tile layout, the rest as is.
void fluxo_q8_0_tiles(const uint8_t* w, int64_t N, int64_t K, uint8_t* out) {
    const int64_t nb = K / 32, width = nb * 34;
    int64_t n = 0;
    for (; n + 8 <= N; n += 8) pack_q8_0(w + n * width, width, nb, out + n * width);
    memcpy(out + n * width, w + n * width, (N - n) * width);
}
}

// The tiles' own roof: tile_rows<4> (Q4_1) or tile8_rows<4> (Q8_0), the products' inner kernel at
// 2+ rows (the avx512vnni build: their pair forms on two tiles, the kernels its products run), on
// 8-row tiles of K = 576 that stay in L1, so that only its instructions bound it (unpacking,
// maddubs or vpdpbusd, adds, the per-block scaling), not memory. Multiply-adds per second of
// `threads` threads each running `iters` calls at once; *sink: a result, so none is optimized away.
extern "C" double fluxo_tile_macs_per_s(int q4, int64_t iters, int threads, int64_t* sink) {
    constexpr int64_t nb = 18, K = nb * 32, MR = 4;
#ifdef FLUXO_ZMM
    constexpr int64_t TILES = 2;
#else
    constexpr int64_t TILES = 1;
#endif
    double total = 0.0;
    int ran = 0;
    const double t0 = omp_get_wtime();
    #pragma omp parallel num_threads(threads) reduction(+ : total, ran)
    {
        const int64_t block = q4 ? TILE_BYTES : TILE8_BYTES, scales = q4 ? 128 : 256;
        std::vector<uint8_t> tile(TILES * nb * block);
        for (int64_t i = 0; i < TILES * nb * block; i++) tile[i] = (uint8_t)(i * 37 + 11);
        for (int64_t b = 0; b < TILES * nb; b++)  // every fp16 d (and m) 1.0: finite, not denormal
            for (int64_t i = scales; i < block; i += 2) {
                tile[b * block + i] = 0x00;
                tile[b * block + i + 1] = 0x3C;
            }
        std::vector<int8_t> xq(MR * K);
        for (int64_t i = 0; i < MR * K; i++) xq[i] = (int8_t)((i * 13) % 255 - 127);
        std::vector<float> xd(MR * nb, 1e-3f), xs(MR * nb, 1e-3f), out(TILES * MR * 8, 0.0f);
        const uint8_t* t = tile.data();
        for (int64_t n = 0; n < iters; n++) {
#ifdef FLUXO_ZMM
            float* o2 = out.data() + MR * 8;
            if (q4) tile_pair_rows<MR>(t, t + nb * block, nb, xq.data(), xd.data(), xs.data(), K, out.data(), o2, nullptr, 0);
            else tile8_pair_rows<MR>(t, t + nb * block, nb, xq.data(), xd.data(), xs.data(), K, out.data(), o2, nullptr, 0);
#else
            if (q4) tile_rows<MR>(t, nb, xq.data(), xd.data(), xs.data(), K, out.data(), nullptr);
            else tile8_rows<MR>(t, nb, xq.data(), xd.data(), xs.data(), K, out.data(), nullptr);
#endif
            __asm__ __volatile__("" ::: "memory");  // out is read back: every call is computed
        }
        total += out[0];
        ran += 1;
    }
    const double dt = omp_get_wtime() - t0;
    *sink = (int64_t)total;
    return (double)(TILES * MR * 8 * K) * (double)iters * (double)ran / dt;
}
