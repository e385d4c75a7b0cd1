// Fluxo's quantized forward step on the CPU: every layer, the final norm and the vocabulary head
// in one call (one OpenMP region), for any rows: decode rows and prompt-chunk rows alike. Compiled
// after kernels/cpu_quant.cpp, cpu_quant_int8.cpp and cpu_quant_tile.cpp (qmm_part) into one
// library by kernels/cpu_quant_build.py.
//
// A row is a token at position pos: its K/V is written at write_slots[row], then it attends to the
// first pos + 1 slots of its context (ctx_slots from ctx_start[row]). A prompt chunk of n tokens is
// n rows sharing one context list (causal by their lengths), so a step that mixes prefill chunks
// and decode rows is one call, like a decode-only step. Every K/V of a layer is written before any
// row of that layer attends (a barrier between).
//
// Batch-invariant: a row's numbers never depend on which rows share its step. Its attention runs
// over its own length only (never the batch's longest context), and its products are computed by
// the same instructions in the same order at any row count (cpu_quant_tile.cpp's qmm_part). So a
// greedy run gives the same tokens under every policy, chunk budget, layout and runner.

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

struct Step {  // everything one step reads, as the Python side lays it out
    const int64_t* desc;  // per layer: (blocks, q4?, tiles) of qkv, o, gate_up, down; ln1, ln2;
                          // then the head's (blocks, q4?, tiles), the final norm
    int64_t layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    float eps, scale;
    float* h;  // [B, hidden] in: embeddings; out: last hidden state
    int64_t rows;
    const int64_t* pos;  // [B]
    const float *cos, *sin;  // [max_len, head_dim]
    float *kc, *vc;  // layer 0's [slots, kv_heads, head_dim]; next layer at + layer_stride
    int64_t layer_stride;
    const int64_t* write_slots;  // [B]
    const int64_t* ctx_slots;  // the rows' context lists, back to back
    const int64_t* ctx_start;  // [B] where row b's list starts; its length is pos[b] + 1
    int64_t ctx;  // the longest context, max(pos) + 1
    const int64_t* head_rows;  // [n_head] the rows whose logits are computed, in order
    int64_t n_head;
    float* logits;  // [n_head, vocab]
};

struct Scratch {  // one thread's own activations
    std::vector<float> f;
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

// Where a step's time goes, per thread: seconds added to acc[phase] (null: not measured). A lap
// reads omp_get_wtime (a vDSO clock, ~25 ns): ~15 laps a layer, ~0.1 % of an 8-row step.
enum Phase { PRODUCTS, HEAD, ATTENTION, NORMS, WAITS, PHASES };
struct Laps {
    double* acc;
    double t;
    void lap(Phase p) {
        if (!acc) return;
        const double now = omp_get_wtime();
        acc[p] += now - t;
        t = now;
    }
};
#define FLUXO_BARRIER(laps, before) \
    do {                            \
        laps.lap(before);           \
        _Pragma("omp barrier")      \
        laps.lap(WAITS);            \
    } while (0)

// Flush denormals to zero (tiny softmax weights are microcode-slow on x86): MXCSR's FTZ + DAZ, on
// ARM FPCR.FZ (denormal inputs and results of fp32 arithmetic read and written as zero, as the two
// x86 bits do). Returns the mode to restore.
#ifdef FLUXO_X86
static inline uint64_t denormals_to_zero() {
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);
    return csr;
}
static inline void restore_fp_mode(uint64_t csr) { _mm_setcsr((unsigned)csr); }
#else
static inline uint64_t denormals_to_zero() {
    uint64_t fpcr;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
    __asm__ __volatile__("msr fpcr, %0" ::"r"(fpcr | (1ull << 24)));
    return fpcr;
}
static inline void restore_fp_mode(uint64_t fpcr) { __asm__ __volatile__("msr fpcr, %0" ::"r"(fpcr)); }
#endif

static void step_thread(const Step& s, float* qkv, float* attn, float* act, int tid, int nt,
                        double* phases) {
    const int64_t B = s.rows, D = s.hidden, hd = s.head_dim;
    const int64_t nqkv = (s.heads + 2 * s.kv_heads) * hd, nattn = s.heads * hd;
    // the widest product input: hidden, the intermediate size, or heads x head_dim (the o
    // projection's, wider than hidden in some models)
    const int64_t kmax = std::max(std::max(D, s.inter), nattn);
    Scratch t;
    t.f.resize(B * kmax);
    t.xq.resize(B * kmax);
    t.xd.resize(B * kmax / 32);
    t.xs.resize(B * kmax / 32);
    const AttnPlan plan = plan_attention(B, s.heads, s.kv_heads, hd, s.pos, s.ctx_start, nt);
    Attn a{B, s.heads, s.kv_heads, hd, s.ctx, s.scale, s.pos, s.cos, s.sin, s.ctx_slots,
           s.ctx_start, qkv, nqkv, nullptr, nullptr, attn};
    AttnScratch at(a, plan.tiles);
    QRow x = t.row();
    Laps laps{phases ? phases + tid * PHASES : nullptr, omp_get_wtime()};
    const uint64_t csr = denormals_to_zero();
    for (int64_t l = 0; l < s.layers; l++) {
        const int64_t* d = s.desc + l * 14;
        float* kc = s.kc + l * s.layer_stride;
        float* vc = s.vc + l * s.layer_stride;
        rmsnorm(s.h, (const float*)d[12], B, D, s.eps, t.f.data());
        quantize_rows(t.f.data(), B, D, x);
        laps.lap(NORMS);
        qmm_part((const uint8_t*)d[0], (const uint8_t*)d[2], d[1], nqkv, D, x, B, qkv, nqkv, 0, tid,
                 nt);
        FLUXO_BARRIER(laps, PRODUCTS);
        write_kv(s, qkv, nqkv, kc, vc, tid, nt);
        FLUXO_BARRIER(laps, ATTENTION);
        a.kc = kc, a.vc = vc;
        attend(a, plan, at, tid);
        FLUXO_BARRIER(laps, ATTENTION);
        quantize_rows(attn, B, s.heads * hd, x);
        laps.lap(NORMS);
        qmm_part((const uint8_t*)d[3], (const uint8_t*)d[5], d[4], D, s.heads * hd, x, B, s.h, D, 1,
                 tid, nt);
        FLUXO_BARRIER(laps, PRODUCTS);
        rmsnorm(s.h, (const float*)d[13], B, D, s.eps, t.f.data());
        quantize_rows(t.f.data(), B, D, x);
        laps.lap(NORMS);
        qmm_part((const uint8_t*)d[6], (const uint8_t*)d[8], d[7], s.inter, D, x, B, act, s.inter, 2,
                 tid, nt);
        FLUXO_BARRIER(laps, PRODUCTS);
        quantize_rows(act, B, s.inter, x);
        laps.lap(NORMS);
        qmm_part((const uint8_t*)d[9], (const uint8_t*)d[11], d[10], D, s.inter, x, B, s.h, D, 1, tid,
                 nt);
        FLUXO_BARRIER(laps, PRODUCTS);
    }
    // The final norm and the head for the rows that sample only (a prompt chunk that does not end
    // its prompt needs no logits: the head is the step's largest matrix).
    const int64_t* hdesc = s.desc + s.layers * 14;
    const int64_t R = s.n_head;
    if (R > 0) {
        for (int64_t r = 0; r < R; r++)
            rmsnorm(s.h + s.head_rows[r] * D, (const float*)hdesc[3], 1, D, s.eps, t.f.data() + r * D);
        // The head on int8 activations too: at 8 rows 8.0 ms vs 14.6 for the fp32-activation block
        // kernel, at 1 row 4.0 vs 6.3 (49152x576 Q8_0, 1 thread, thread CPU time, medians of 60 and
        // 15, machine at load ~10, 2026-11-30).
        quantize_rows(t.f.data(), R, D, x);
        laps.lap(NORMS);
        qmm_part((const uint8_t*)hdesc[0], (const uint8_t*)hdesc[2], hdesc[1], s.vocab, D, x, R,
                 s.logits, s.vocab, 0, tid, nt);
    }
    if (laps.acc) FLUXO_BARRIER(laps, HEAD);  // timed: the threads' last wait is a wait too
    restore_fp_mode(csr);
}

static void forward_step(const int64_t* desc, const int64_t* dims, const float* eps_scale, float* h,
                         int64_t rows, const int64_t* pos, const float* cos, const float* sin,
                         float* kc, float* vc, int64_t layer_stride, const int64_t* write_slots,
                         const int64_t* ctx_slots, const int64_t* ctx_start, const int64_t* head_rows,
                         int64_t n_head, float* logits, int threads, double* phases) {
    int64_t ctx = 1;
    for (int64_t b = 0; b < rows; b++) ctx = pos[b] + 1 > ctx ? pos[b] + 1 : ctx;
    Step s{desc, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], eps_scale[0],
           eps_scale[1], h, rows, pos, cos, sin, kc, vc, layer_stride, write_slots, ctx_slots,
           ctx_start, ctx, head_rows, n_head, logits};
    std::vector<float> qkv(rows * (s.heads + 2 * s.kv_heads) * s.head_dim);
    std::vector<float> attn(rows * s.heads * s.head_dim), act(rows * s.inter);
    #pragma omp parallel num_threads(threads)
    step_thread(s, qkv.data(), attn.data(), act.data(), omp_get_thread_num(), omp_get_num_threads(),
                phases);
}

extern "C" {
// One forward step over `rows` rows (decode rows and prompt-chunk rows in any mix): logits
// [n_head, vocab] for head_rows. phases: null, or [threads, 5] to which each thread adds its
// seconds per phase: the weight products of the layers, the vocabulary head, the KV write and
// attention, the norms and the activations' quantization, and the waits at the barriers (Phase).
void fluxo_forward_step(const int64_t* desc, const int64_t* dims, const float* eps_scale, float* h,
                        int64_t rows, const int64_t* pos, const float* cos, const float* sin,
                        float* kc, float* vc, int64_t layer_stride, const int64_t* write_slots,
                        const int64_t* ctx_slots, const int64_t* ctx_start,
                        const int64_t* head_rows, int64_t n_head, float* logits, int threads,
                        double* phases) {
    forward_step(desc, dims, eps_scale, h, rows, pos, cos, sin, kc, vc, layer_stride, write_slots,
                 ctx_slots, ctx_start, head_rows, n_head, logits, threads, phases);
}
}
