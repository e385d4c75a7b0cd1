// A test driver for the quantized CPU kernels where Python cannot load them: an ARM64 build on an
// x86 machine (tests/test_kernel_neon.py compiles this file natively with the avx2 build's flags
// and with aarch64-linux-gnu-g++ -static with the neon build's, runs the second under
// qemu-aarch64 -cpu max, and compares the two outputs).
//
// It includes the kernel sources as the one translation unit kernels/cpu_quant_build.py compiles,
// builds deterministic inputs (fixed-seed Q4_1 / Q8_0 blocks laid out as the GGUF packs them, fp32
// activations, a paged KV cache), calls the entry points the Python side calls (fp32-activation
// products and dequantization, Q8_1 quantization, the int8 products with and without tiles in
// every epilogue, the tile packing, and fluxo_forward_step on a tiny 2-layer model with decode rows
// of different lengths beside a prompt chunk), and prints every output as raw bits:
//   <name> <count> <hex word> <hex word> ...
// one line per output (floats as their 32-bit patterns, bytes one word each). Names ending in
// "/alone" or "/t2" are the same quantities computed with a row alone or at 2 threads: the test
// holds them to the batch's and 1 thread's bits (batch invariance), on each build.
#include "../../kernels/cpu_quant.cpp"
#include "../../kernels/cpu_quant_int8.cpp"
#include "../../kernels/cpu_quant_tile.cpp"
#include "../../kernels/cpu_quant_attend.cpp"
#include "../../kernels/cpu_quant_decode.cpp"

#include <stdio.h>

#include <string>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32() {  // splitmix64: the same sequence on every machine
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}
static float uniform(float lo, float hi) {  // one fma: the same floats under any -ffp-contract
    return fmaf(hi - lo, (float)(next_u32() >> 8) * (1.0f / 16777216.0f), lo);
}
static std::vector<float> floats(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(lo, hi);
    return v;
}
// fp16 bit patterns of normal numbers: magnitude 2^(e - 15) * (1 + frac / 1024), e in [e0, e0 + 1]
static uint16_t half_bits(int e0, bool negative) {
    const uint16_t e = (uint16_t)(e0 + (next_u32() & 1)), frac = (uint16_t)(next_u32() & 0x3FF);
    return (uint16_t)((negative ? 0x8000 : 0) | (e << 10) | frac);
}
// N rows of K weights as the GGUF stores them: Q4_1 (fp16 d, fp16 m, 16 bytes of nibbles, weight
// p in byte p's low nibble and p + 16 in its high one) or Q8_0 (fp16 d, 32 int8, -128 included).
static std::vector<uint8_t> blocks(int64_t N, int64_t K, bool q4) {
    const int64_t bb = q4 ? 20 : 34;
    std::vector<uint8_t> w(N * K / 32 * bb);
    for (int64_t i = 0; i < N * K / 32; i++) {
        uint8_t* blk = w.data() + i * bb;
        const uint16_t d = half_bits(q4 ? 8 : 6, false);  // Q4_1: d ~ 2^-7, Q8_0: ~ 2^-9
        memcpy(blk, &d, 2);
        if (q4) {
            const uint16_t m = half_bits(11, true);  // m ~ -2^-4 (the block's minimum)
            memcpy(blk + 2, &m, 2);
        }
        for (int64_t j = q4 ? 4 : 2; j < bb; j++) blk[j] = (uint8_t)next_u32();
    }
    return w;
}
static std::vector<uint8_t> tiled(const std::vector<uint8_t>& w, int64_t N, int64_t K, bool q4) {
    std::vector<uint8_t> t(w.size());
    (q4 ? fluxo_q4_1_tiles : fluxo_q8_0_tiles)(w.data(), N, K, t.data());
    return t;
}

static void dump(const std::string& name, const void* p, size_t n) {  // n 32-bit words
    printf("%s %zu", name.c_str(), n);
    const uint32_t* w = (const uint32_t*)p;
    for (size_t i = 0; i < n; i++) printf(" %08x", w[i]);
    printf("\n");
}
static void dump(const std::string& name, const std::vector<float>& v) { dump(name, v.data(), v.size()); }
static void dump_bytes(const std::string& name, const void* p, size_t n) {
    printf("%s %zu", name.c_str(), n);
    for (size_t i = 0; i < n; i++) printf(" %02x", ((const uint8_t*)p)[i]);
    printf("\n");
}

// -- the products ----------------------------------------------------------------------------------
static void products() {
    const int64_t K = 96;
    for (bool q4 : {true, false}) {
        const std::string f = q4 ? "q4_1" : "q8_0";
        for (int64_t N : {16, 19}) {  // whole tiles, and 3 rows the tiles leave to qmm_rows
            const std::vector<uint8_t> w = blocks(N, K, q4), t = tiled(w, N, K, q4);
            const std::string s = f + "/n" + std::to_string(N);
            dump_bytes("tiles/" + s, t.data(), t.size());
            std::vector<float> deq(N * K);
            (q4 ? fluxo_q4_1_dequant : fluxo_q8_0_dequant)(w.data(), N, K, deq.data(), 1);
            dump("dequant/" + s, deq);
            const int64_t M = 6;
            const std::vector<float> x = floats(M * K, -2.0f, 2.0f);
            std::vector<float> y(M * N);
            (q4 ? fluxo_q4_1_mm : fluxo_q8_0_mm)(x.data(), M, K, w.data(), N, y.data(), 1);
            dump("mm/" + s, y);
            for (int tiles = 0; tiles < 2; tiles++) {
                const uint8_t* tp = tiles ? t.data() : nullptr;
                for (int mode : {0, 2}) {
                    const int64_t n_out = mode == 2 ? N / 2 : N;
                    const std::string name = "qmm/" + s + (tiles ? "/tiles" : "/blocks") +
                                             (mode == 2 ? "/swiglu" : "/store");
                    std::vector<float> all(M * n_out), one(n_out), alone(M * n_out);
                    fluxo_qmm(x.data(), M, K, w.data(), tp, q4, N, all.data(), mode, 1);
                    dump(name, all);
                    for (int64_t r = 0; r < M; r++) {  // each row by itself
                        fluxo_qmm(x.data() + r * K, 1, K, w.data(), tp, q4, N, one.data(), mode, 1);
                        memcpy(alone.data() + r * n_out, one.data(), n_out * sizeof(float));
                    }
                    dump(name + "/alone", alone);
                    fluxo_qmm(x.data(), M, K, w.data(), tp, q4, N, all.data(), mode, 2);
                    dump(name + "/t2", all);
                }
            }
        }
    }
    const int64_t M = 3;
    const std::vector<float> x = floats(M * K, -3.0f, 3.0f);
    std::vector<int8_t> q(M * K);
    std::vector<float> d(M * K / 32), s(M * K / 32);
    fluxo_quantize_q8_1(x.data(), M, K, q.data(), d.data(), s.data());
    dump_bytes("quantize/q", q.data(), q.size());
    dump("quantize/d", d);
    dump("quantize/s", s);
    std::vector<float> e = floats(64, -95.0f, 40.0f), out(64);
    for (int i = 0; i < 64; i += 8) f8_store(out.data() + i, exp8(f8_load(e.data() + i)));
    dump("exp8", out);
}

// -- the whole step on a tiny model ----------------------------------------------------------------
struct Model {
    static constexpr int64_t layers = 2, hidden = 64, heads = 2, kv_heads = 1, head_dim = 64;
    static constexpr int64_t inter = 96, vocab = 75, max_len = 160, slots = 160;
    std::vector<std::vector<uint8_t>> keep;
    std::vector<std::vector<float>> norms;
    std::vector<int64_t> desc;
    std::vector<float> cos, sin, k0, v0;  // the cache as the step finds it

    void matrix(int64_t N, int64_t K, bool q4, bool with_tiles) {
        keep.push_back(blocks(N, K, q4));
        desc.push_back((int64_t)keep.back().data());
        desc.push_back(q4);
        if (with_tiles) keep.push_back(tiled(keep.back(), N, K, q4));
        desc.push_back(with_tiles ? (int64_t)keep.back().data() : 0);
    }
    void norm() {
        norms.push_back(floats(hidden, 0.5f, 1.5f));
        desc.push_back((int64_t)norms.back().data());
    }
    Model() {
        keep.reserve(64);
        norms.reserve(8);
        const int64_t nqkv = (heads + 2 * kv_heads) * head_dim;
        // layer 0: Q4_1 with tiles (q4's serving path); layer 1 mixes Q8_0 and untiled products
        matrix(nqkv, hidden, true, true), matrix(hidden, heads * head_dim, true, true);
        matrix(2 * inter, hidden, true, true), matrix(hidden, inter, true, true);
        norm(), norm();
        matrix(nqkv, hidden, false, true), matrix(hidden, heads * head_dim, true, false);
        matrix(2 * inter, hidden, true, true), matrix(hidden, inter, false, false);
        norm(), norm();
        matrix(vocab, hidden, false, true);  // the head: 9 tiles and 3 rows
        norm();
        cos = floats(max_len * head_dim, -1.0f, 1.0f);  // any table: the kernel only reads it
        sin = floats(max_len * head_dim, -1.0f, 1.0f);
        k0 = floats(layers * slots * kv_heads * head_dim, -1.0f, 1.0f);
        v0 = floats(layers * slots * kv_heads * head_dim, -1.0f, 1.0f);
    }
};

struct Rows {  // a step's rows as FusedStep lays them out
    std::vector<float> h;
    std::vector<int64_t> pos, write, ctx, start, head;
};

// Run rows `pick` of `all` as one step; returns logits and h, and the caches as the step leaves
// them (from the model's, or with `carry` from k and v as a step before left them).
static void run_step(const Model& m, const Rows& all, const std::vector<int>& pick, int threads,
                     std::vector<float>& logits, std::vector<float>& h, std::vector<float>& k,
                     std::vector<float>& v, bool carry = false) {
    Rows r;
    for (int i : pick) {
        r.h.insert(r.h.end(), all.h.begin() + i * m.hidden, all.h.begin() + (i + 1) * m.hidden);
        r.pos.push_back(all.pos[i]);
        r.write.push_back(all.write[i]);
        r.start.push_back(all.start[i]);
    }
    for (size_t j = 0; j < pick.size(); j++)
        for (int64_t hr : all.head)
            if (hr == pick[j]) r.head.push_back((int64_t)j);
    const int64_t dims[7] = {m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.inter, m.vocab};
    const float eps_scale[2] = {1e-5f, 0.125f};
    if (!carry) k = m.k0, v = m.v0;
    logits.assign(r.head.size() * m.vocab, 0.0f);
    fluxo_forward_step(m.desc.data(), dims, eps_scale, r.h.data(), (int64_t)pick.size(), r.pos.data(),
                       m.cos.data(), m.sin.data(), k.data(), v.data(), m.slots * m.kv_heads * m.head_dim,
                       r.write.data(), all.ctx.data(), r.start.data(), r.head.data(),
                       (int64_t)r.head.size(), logits.data(), threads, nullptr);
    h = r.h;
}

static void step() {
    const Model m;
    Rows rows;
    // three decode rows (contexts of 5, 13 and 21 slots, scattered) then a 4-token prompt chunk
    // after 3 cached tokens (rows 3..6, one context list of 7)
    std::vector<int64_t> perm(m.slots);
    for (int64_t i = 0; i < m.slots; i++) perm[i] = i;
    for (int64_t i = m.slots - 1; i > 0; i--) std::swap(perm[i], perm[next_u32() % (i + 1)]);
    int64_t used = 0;
    for (int64_t n : {5, 13, 21}) {
        rows.start.push_back((int64_t)rows.ctx.size());
        for (int64_t j = 0; j < n; j++) rows.ctx.push_back(perm[used++]);
        rows.pos.push_back(n - 1);
        rows.write.push_back(rows.ctx.back());
        rows.head.push_back((int64_t)rows.pos.size() - 1);
    }
    const int64_t chunk = (int64_t)rows.ctx.size();
    for (int64_t j = 0; j < 7; j++) rows.ctx.push_back(perm[used++]);
    for (int64_t p = 3; p < 7; p++) {
        rows.start.push_back(chunk);
        rows.pos.push_back(p);
        rows.write.push_back(rows.ctx[chunk + p]);
    }
    rows.head.push_back(6);  // the chunk ends its prompt: its last row samples
    rows.h = floats(7 * m.hidden, -1.0f, 1.0f);

    std::vector<float> logits, h, k, v;
    run_step(m, rows, {0, 1, 2, 3, 4, 5, 6}, 1, logits, h, k, v);
    dump("step/logits", logits), dump("step/h", h), dump("step/k", k), dump("step/v", v);
    run_step(m, rows, {0, 1, 2, 3, 4, 5, 6}, 2, logits, h, k, v);
    dump("step/logits/t2", logits), dump("step/h/t2", h), dump("step/k/t2", k), dump("step/v/t2", v);
    // each decode row alone, then the chunk alone: the same logits, row for row
    std::vector<float> alone, part;
    for (int i = 0; i < 3; i++) {
        run_step(m, rows, {i}, 1, part, h, k, v);
        alone.insert(alone.end(), part.begin(), part.end());
    }
    run_step(m, rows, {3, 4, 5, 6}, 1, part, h, k, v);
    alone.insert(alone.end(), part.begin(), part.end());
    dump("step/logits/alone", alone);
}

// A prompt of 145 tokens after 6 cached ones: contexts of 7 to 151 keys (three key blocks), 145
// rows (eighteen attention tiles of 8 and one of 1). Whole, at 2 threads, and in four chunks with
// the cache carried from one to the next ({6..40}, {41}, {42..149}, {150}: the sampled row alone,
// through the one-row path): the same logits.
static void long_prompt() {
    const Model m;
    Rows rows;
    std::vector<int64_t> perm(m.slots);
    for (int64_t i = 0; i < m.slots; i++) perm[i] = m.slots - 1 - ((i * 37) % m.slots);
    for (int64_t j = 0; j < 151; j++) rows.ctx.push_back(perm[j]);
    for (int64_t p = 6; p < 151; p++) {
        rows.start.push_back(0);
        rows.pos.push_back(p);
        rows.write.push_back(rows.ctx[p]);
    }
    rows.head.push_back(144);
    rows.h = floats(145 * m.hidden, -1.0f, 1.0f);
    std::vector<int> all(145);
    for (int i = 0; i < 145; i++) all[i] = i;
    std::vector<float> logits, h, k, v;
    run_step(m, rows, all, 1, logits, h, k, v);
    dump("prompt/logits", logits), dump("prompt/k", k), dump("prompt/v", v);
    run_step(m, rows, all, 2, logits, h, k, v);
    dump("prompt/logits/t2", logits), dump("prompt/k/t2", k), dump("prompt/v/t2", v);
    k = m.k0, v = m.v0;
    for (auto [lo, hi] : {std::pair{0, 35}, {35, 36}, {36, 144}, {144, 145}}) {
        std::vector<int> part(all.begin() + lo, all.begin() + hi);
        run_step(m, rows, part, 1, logits, h, k, v, true);
    }
    dump("prompt/logits/alone", logits), dump("prompt/k/alone", k), dump("prompt/v/alone", v);
}

int main() {
    products();
    step();
    long_prompt();
    printf("openmp 1 %d\n", fluxo_openmp());  // the same "<name> <count> <words>" form
    return 0;
}
