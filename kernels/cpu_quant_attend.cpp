// Fluxo's attention for the fused CPU step (kernels/cpu_quant_decode.cpp): softmax(q k^T * scale) v
// for every (row, query head), each row over its own pos + 1 context slots. Compiled after
// cpu_quant.cpp (f8, exp8) and before cpu_quant_decode.cpp, into one library.
//
// Two shapes of work, one arithmetic:
// - a row alone (a decode row, a one-token chunk): one unit per query head, as it always was;
// - the rows of a prompt chunk (consecutive rows sharing one context list): tiles of TILE_ROWS rows
//   and the rep query heads of one KV head, against blocks of KEY_BLOCK keys, so each K and V row
//   is read from memory once per tile instead of once per (row, head). Before tiles, a 1,900-token
//   prompt spent 1.7 ms a token in attention and 0.9 more waiting at the barrier behind it (the
//   threads split (row, head) units by count while later rows attend to more keys; avx2 build,
//   2 threads, 2026-12-03); units are now split by their keys.
// Every score is the same dot product (dot4 for the row's first n & ~3 keys, dot8 after), every
// row's softmax and its sum of p v run over its keys in the same order, whichever shape ran it. So
// a row's bits do not depend on its neighbours: a prompt gives the same tokens prefilled in one
// chunk or many (tests/kernels/kernel_check.cpp holds the bits).

// transformers' rotate_half rotary: x[i] pairs with x[i + d/2]; c, s: the position's table rows.
// The fused multiply-adds are spelled out (here and in rmsnorm): left to contraction, g++ fused
// a * c - b * s as fma(a, c, -(b * s)) on x86 and fma(-b, s, a * c) on ARM, 1 ulp apart.
static inline void rope(float* x, const float* c, const float* s, int64_t d) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = fmaf(a, c[i], -(b * s[i]));
        x[i + half] = fmaf(b, c[i + half], a * s[i + half]);
    }
}

// q . k over d floats (d a multiple of 8), two fma chains.
static inline float dot8(const float* a, const float* b, int64_t d) {
    f8 s0 = f8_zero(), s1 = f8_zero();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        s0 = f8_fma(f8_load(a + i), f8_load(b + i), s0);
        s1 = f8_fma(f8_load(a + i + 8), f8_load(b + i + 8), s1);
    }
    if (i < d) s0 = f8_fma(f8_load(a + i), f8_load(b + i), s0);
    return f8_hsum(f8_add(s0, s1));
}

// q . k for four keys at once: four fma chains, one horizontal reduction for all four.
static inline void dot4(const float* q, const float* k0, const float* k1, const float* k2,
                        const float* k3, int64_t d, float* out) {
    f8 a0 = f8_zero(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < d; i += 8) {
        const f8 qv = f8_load(q + i);
        a0 = f8_fma(qv, f8_load(k0 + i), a0);
        a1 = f8_fma(qv, f8_load(k1 + i), a1);
        a2 = f8_fma(qv, f8_load(k2 + i), a2);
        a3 = f8_fma(qv, f8_load(k3 + i), a3);
    }
    f8_hsum4(a0, a1, a2, a3, out);
}

// dot4 for two queries at once: each K row loaded once for both (8 chains, 14 of 16 registers);
// each query's four sums are dot4's, bit for bit.
static inline void dot2x4(const float* qa, const float* qb, const float* const* k, int64_t d,
                          float* oa, float* ob) {
    f8 a0 = f8_zero(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t i = 0; i < d; i += 8) {
        const f8 x = f8_load(qa + i), y = f8_load(qb + i);
        const f8 k0 = f8_load(k[0] + i), k1 = f8_load(k[1] + i);
        const f8 k2 = f8_load(k[2] + i), k3 = f8_load(k[3] + i);
        a0 = f8_fma(x, k0, a0), b0 = f8_fma(y, k0, b0);
        a1 = f8_fma(x, k1, a1), b1 = f8_fma(y, k1, b1);
        a2 = f8_fma(x, k2, a2), b2 = f8_fma(y, k2, b2);
        a3 = f8_fma(x, k3, a3), b3 = f8_fma(y, k3, b3);
    }
    f8_hsum4(a0, a1, a2, a3, oa);
    f8_hsum4(b0, b1, b2, b3, ob);
}

// Scores sc[j] = q . k[slot[j]] for keys [j0, j1) of a row whose keys before n4 (its length
// rounded down to 4) go four at a time. j0 is a multiple of 4.
static inline void scores(const float* q, const float* k, int64_t ks, const int64_t* slot,
                          int64_t j0, int64_t j1, int64_t n4, int64_t d, float* sc) {
    const int64_t e4 = j1 < n4 ? j1 : n4;
    for (int64_t j = j0; j + 4 <= e4; j += 4)
        dot4(q, k + slot[j] * ks, k + slot[j + 1] * ks, k + slot[j + 2] * ks, k + slot[j + 3] * ks,
             d, sc + j);
    for (int64_t j = j0 > n4 ? j0 : n4; j < j1; j++) sc[j] = dot8(q, k + slot[j] * ks, d);
}

// scores() for two (row, head) pairs of one tile, keys [j0, ja) and [j0, jb): the keys both take
// four at a time go through dot2x4, the rest through scores().
static inline void scores2(const float* qa, const float* qb, const float* k, int64_t ks,
                           const int64_t* slot, int64_t j0, int64_t ja, int64_t jb, int64_t n4a,
                           int64_t n4b, int64_t d, float* sa, float* sb) {
    int64_t e4 = ja < jb ? ja : jb, j = j0;
    e4 = e4 < n4a ? e4 : n4a, e4 = e4 < n4b ? e4 : n4b;
    for (; j + 4 <= e4; j += 4) {
        const float* kr[4] = {k + slot[j] * ks, k + slot[j + 1] * ks, k + slot[j + 2] * ks,
                              k + slot[j + 3] * ks};
        dot2x4(qa, qb, kr, d, sa + j, sb + j);
    }
    if (j < ja) scores(qa, k, ks, slot, j, ja, n4a, d, sa);
    if (j < jb) scores(qb, k, ks, slot, j, jb, n4b, d, sb);
}

// The n scores, scaled, to exp(score - max) in place; returns their sum. Exponentials 8 at a
// time, the tail with expf. With SwiGLU's exp8 (cpu_quant_tile.cpp), 2026-11-30 15:28 UTC, load
// 6-15, SmolLM2 q4, 8 rows, 1 thread, thread CPU ms, medians of 15, two A/B pairs x 2: ctx 128
// 36.6 36.9 36.9 36.9 -> 35.7 33.7 30.2 32.5; ctx 8 26.5 26.5 26.5 25.9 -> 27.3 25.8 23.2 24.2.
// Not bit for bit expf's (within 1.2e-7 relative): q4 decode perplexity, accuracy text, 45.238
// -> 45.227.
static inline float softmax_exp(float* sc, int64_t n, float scale) {
    // scaled 8 at a time (each product as before) and the max taken as 8 running maxima: a max
    // is exact in any order, so the bits are the scalar loop's
    f8 vmax8 = f8_set1(-INFINITY);
    const f8 vscale = f8_set1(scale);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const f8 x = f8_mul(f8_load(sc + j), vscale);
        f8_store(sc + j, x);
        vmax8 = f8_max(vmax8, x);
    }
    float lanes[8], mx = -INFINITY;
    f8_store(lanes, vmax8);
    for (int i = 0; i < 8; i++) mx = lanes[i] > mx ? lanes[i] : mx;
    for (; j < n; j++) {
        sc[j] *= scale;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    f8 vsum = f8_zero();
    const f8 vmx = f8_set1(mx);
    for (j = 0; j + 8 <= n; j += 8) {
        const f8 e = exp8(f8_sub(f8_load(sc + j), vmx));
        f8_store(sc + j, e);
        vsum = f8_add(vsum, e);
    }
    float sum = f8_hsum(vsum);
    for (; j < n; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    return sum;
}

// acc += sum_{j in [j0, j1)} p[j] v[slot[j]], the NV x 8 sums in registers (a chain through
// memory per key made this loop 3x slower); acc is read from and written back to memory around
// the block (start: zeros instead), which leaves each lane's chain of fmas unchanged.
template <int NV>
static inline void pv_block(const float* p, const int64_t* slot, int64_t j0, int64_t j1,
                            const float* v, int64_t vstride, float* acc_mem, bool start) {
    f8 acc[NV];
#pragma GCC unroll 16
    for (int i = 0; i < NV; i++) acc[i] = start ? f8_zero() : f8_load(acc_mem + 8 * i);
    for (int64_t j = j0; j < j1; j++) {
        const f8 pp = f8_set1(p[j]);
        const float* vr = v + slot[j] * vstride;
#pragma GCC unroll 16
        for (int i = 0; i < NV; i++) acc[i] = f8_fma(pp, f8_load(vr + 8 * i), acc[i]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < NV; i++) f8_store(acc_mem + 8 * i, acc[i]);
}

template <int NV>
static inline void scale_out(const float* acc, float inv, float* o) {
    const f8 iv = f8_set1(inv);
#pragma GCC unroll 16
    for (int i = 0; i < NV; i++) f8_store(o + 8 * i, f8_mul(f8_load(acc + 8 * i), iv));
}

struct Attn {  // what attention reads of a step (cpu_quant_decode.cpp's Step)
    int64_t rows, heads, kv_heads, head_dim, ctx;  // ctx: the longest row's length
    float scale;
    const int64_t* pos;  // [rows]
    const float *cos, *sin;  // [max_len, head_dim]
    const int64_t *ctx_slots, *ctx_start;  // the rows' context lists, back to back; [rows]
    const float* qkv;  // [rows, ldq] the rows' q, k, v (k and v already in the cache)
    int64_t ldq;
    const float *kc, *vc;  // this layer's [slots, kv_heads, head_dim]
    float* out;  // [rows, heads * head_dim]
};

constexpr int64_t TILE_ROWS = 8, KEY_BLOCK = 64;

struct Unit {  // rows [b, b + nrows) against one head: a row's query head, or a tile's KV head
    int64_t b, nrows, head;
    bool tile;
};

// The step's units, in row order, and where each thread's share starts: by keys attended (plus a
// unit's fixed cost), so the threads meet at the barrier together however long the rows are.
struct AttnPlan {
    std::vector<Unit> units;
    std::vector<int64_t> first;  // [threads + 1] thread t runs units [first[t], first[t + 1])
    bool tiles = false;
};

static AttnPlan plan_attention(int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim,
                               const int64_t* pos, const int64_t* ctx_start, int nt) {
    AttnPlan p;
    std::vector<int64_t> cost;
    const bool tiled_dim = head_dim == 16 || head_dim == 64 || head_dim == 128;
    const int64_t rep = heads / kv_heads;
    for (int64_t b = 0; b < rows;) {
        int64_t e = b + 1;  // a run of rows over one context list: a prompt chunk
        while (tiled_dim && e < rows && ctx_start[e] == ctx_start[b]) e++;
        if (e - b == 1) {
            for (int64_t h = 0; h < heads; h++) {
                p.units.push_back({b, 1, h, false});
                cost.push_back(pos[b] + 1 + 16);
            }
        }
        for (int64_t t = b; e - b > 1 && t < e; t += TILE_ROWS) {
            const int64_t nr = e - t < TILE_ROWS ? e - t : TILE_ROWS;
            int64_t keys = 0;
            for (int64_t r = t; r < t + nr; r++) keys += pos[r] + 1;
            for (int64_t g = 0; g < kv_heads; g++) {
                p.units.push_back({t, nr, g, true});
                cost.push_back(rep * (keys + 16 * nr));
            }
            p.tiles = true;
        }
        b = e;
    }
    int64_t total = 0;
    for (int64_t c : cost) total += c;
    p.first.assign(nt + 1, (int64_t)p.units.size());
    p.first[0] = 0;
    int64_t seen = 0;  // a unit goes to the thread its middle falls in
    for (size_t u = 0, t = 1; u < p.units.size(); u++) {
        const int64_t mid2 = 2 * seen + cost[u];  // twice the middle, in cost
        while ((int64_t)t < nt && mid2 * nt >= 2 * total * (int64_t)t) p.first[t++] = (int64_t)u;
        seen += cost[u];
    }
    return p;
}

struct AttnScratch {  // one thread's own
    std::vector<float> q, scores, acc, sums;
    AttnScratch(const Attn& a, bool tiles) {
        const int64_t m = tiles ? TILE_ROWS * (a.heads / a.kv_heads) : 1;
        q.resize(m * a.head_dim), acc.resize(m * a.head_dim), sums.resize(m);
        scores.resize(m * (a.ctx + 8));
    }
};

// Query head h of row b, rotated to its position, into q.
static inline void query(const Attn& a, int64_t b, int64_t h, float* q) {
    const int64_t hd = a.head_dim;
    memcpy(q, a.qkv + b * a.ldq + h * hd, hd * sizeof(float));
    rope(q, a.cos + a.pos[b] * hd, a.sin + a.pos[b] * hd, hd);
}

// One row, one query head (head_dim a multiple of 8).
static void attend_row(const Attn& a, int64_t b, int64_t hh, AttnScratch& t) {
    const int64_t hd = a.head_dim, g = hh / (a.heads / a.kv_heads), n = a.pos[b] + 1;
    const int64_t ks = a.kv_heads * hd;
    const int64_t* sl = a.ctx_slots + a.ctx_start[b];
    float *q = t.q.data(), *sc = t.scores.data(), *acc = t.acc.data();
    query(a, b, hh, q);
    scores(q, a.kc + g * hd, ks, sl, 0, n, n & ~(int64_t)3, hd, sc);
    const float sum = softmax_exp(sc, n, a.scale), inv = 1.0f / sum;
    float* o = a.out + b * a.heads * hd + hh * hd;
    const float* vg = a.vc + g * hd;
    if (hd == 64) pv_block<8>(sc, sl, 0, n, vg, ks, acc, true), scale_out<8>(acc, inv, o);
    else if (hd == 128) pv_block<16>(sc, sl, 0, n, vg, ks, acc, true), scale_out<16>(acc, inv, o);
    else if (hd == 16) pv_block<2>(sc, sl, 0, n, vg, ks, acc, true), scale_out<2>(acc, inv, o);
    else {
        for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < hd; i++) o[i] += sc[j] * vg[sl[j] * ks + i];
        for (int64_t i = 0; i < hd; i++) o[i] /= sum;
    }
}

// Rows [b0, b0 + nr) of one prompt chunk and the rep query heads of KV head g: scores block by
// block of keys, each row's softmax, then p v block by block. m = nr * rep (row, head) pairs.
template <int NV>
static void attend_tile(const Attn& a, const Unit& u, AttnScratch& t) {
    const int64_t hd = a.head_dim, rep = a.heads / a.kv_heads, m = u.nrows * rep;
    const int64_t ks = a.kv_heads * hd, stride = a.ctx + 8;
    const int64_t* sl = a.ctx_slots + a.ctx_start[u.b];
    const float *kg = a.kc + u.head * hd, *vg = a.vc + u.head * hd;
    float *q = t.q.data(), *sc = t.scores.data(), *acc = t.acc.data();
    int64_t nmax = 0;
    for (int64_t i = 0; i < m; i++) query(a, u.b + i / rep, u.head * rep + i % rep, q + i * hd);
    for (int64_t r = 0; r < u.nrows; r++) nmax = a.pos[u.b + r] + 1 > nmax ? a.pos[u.b + r] + 1 : nmax;
    for (int64_t k0 = 0; k0 < nmax; k0 += KEY_BLOCK)
        for (int64_t i = 0; i < m; i += 2) {
            const int64_t n = a.pos[u.b + i / rep] + 1, k1 = k0 + KEY_BLOCK < n ? k0 + KEY_BLOCK : n;
            if (i + 1 == m) {
                if (n > k0) scores(q + i * hd, kg, ks, sl, k0, k1, n & ~(int64_t)3, hd, sc + i * stride);
                continue;
            }
            const int64_t n2 = a.pos[u.b + (i + 1) / rep] + 1;
            const int64_t k2 = k0 + KEY_BLOCK < n2 ? k0 + KEY_BLOCK : n2;
            scores2(q + i * hd, q + (i + 1) * hd, kg, ks, sl, k0, n > k0 ? k1 : k0, n2 > k0 ? k2 : k0,
                    n & ~(int64_t)3, n2 & ~(int64_t)3, hd, sc + i * stride, sc + (i + 1) * stride);
        }
    for (int64_t i = 0; i < m; i++)
        t.sums[i] = 1.0f / softmax_exp(sc + i * stride, a.pos[u.b + i / rep] + 1, a.scale);
    for (int64_t k0 = 0; k0 < nmax; k0 += KEY_BLOCK)
        for (int64_t i = 0; i < m; i++) {
            const int64_t n = a.pos[u.b + i / rep] + 1, k1 = k0 + KEY_BLOCK < n ? k0 + KEY_BLOCK : n;
            if (n > k0) pv_block<NV>(sc + i * stride, sl, k0, k1, vg, ks, acc + i * hd, k0 == 0);
        }
    for (int64_t i = 0; i < m; i++) {
        const int64_t b = u.b + i / rep, hh = u.head * rep + i % rep;
        scale_out<NV>(acc + i * hd, t.sums[i], a.out + b * a.heads * hd + hh * hd);
    }
}

// This thread's units of the plan.
static void attend(const Attn& a, const AttnPlan& p, AttnScratch& t, int tid) {
    for (int64_t k = p.first[tid]; k < p.first[tid + 1]; k++) {
        const Unit& u = p.units[k];
        if (!u.tile) attend_row(a, u.b, u.head, t);
        else if (a.head_dim == 64) attend_tile<8>(a, u, t);
        else if (a.head_dim == 128) attend_tile<16>(a, u, t);
        else attend_tile<2>(a, u, t);
    }
}
