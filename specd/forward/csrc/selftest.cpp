// A self-test of specd's CPU kernels as built for one instruction set, against a plain
// scalar reference in double precision: the step kernel (decode_step.cpp) over a tiny
// Llama-shaped stack of layers with random weights, chains and trees of 1 to 16 new tokens
// over caches of several lengths, with and without biases, 16- and 64-wide heads, one to
// three threads, with and without a final norm; the same step over weights stored as blocks
// of each of GGUF's formats the kernel reads (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
// BF16) against its run over their float32 values (equal bit for bit); and the attention kernel
// (attention.cpp) at shapes that cross its blocks of 64 queries and keys, chains and trees.
// The step's checks run over caches of float32, and again at fewer shapes over caches of IEEE
// halves.
//
// Built together with the kernels (scripts/check_kernels.sh ISA), run natively or under an
// emulator. Prints the largest error of each part relative to the largest magnitude of the
// reference (at least 1) and exits 1 when one is over the tolerance, 2 on bad usage.
//
//   selftest [tolerance]        (default 1e-4)

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <random>
#include <vector>

extern "C" {
const char* specd_kernel_isa();
int64_t specd_decode_step_max_tokens();
int64_t specd_decode_step_work(int64_t H, int64_t I, int64_t Hq, int64_t KV, int64_t D, int64_t T,
                               int64_t past, int threads);
void specd_decode_step(const void* const* layers, const int32_t* formats, int64_t L,
                       const int64_t* caches, int32_t kv_half, int64_t H, int64_t I, int64_t Hq, int64_t KV,
                       int64_t D, float eps, float scale, const float* x, const float* cos,
                       const float* sin, int64_t T, int64_t past, const uint8_t* tree,
                       const float* norm, const void* lm, int32_t lm_format, const float* lm_b,
                       int64_t V, float* logits, float* hidden, float* work, int threads);
void specd_product(const void* weight, int32_t format, int64_t N, int64_t K, const float* x,
                   int64_t T, const float* b, float* y, int threads);
void specd_dequantize(const void* weight, int32_t format, int64_t rows, int64_t K, float* out,
                      int threads);
void specd_halves(const float* x, int64_t n, uint16_t* out);
int specd_attention_head_dim();
void specd_attention(const float* q, int64_t q_h, int64_t q_t, const float* k, int64_t k_h,
                     int64_t k_s, const float* v, int64_t v_h, int64_t v_s, float* out,
                     int64_t o_h, int64_t o_t, const uint8_t* tree, int64_t Hq, int64_t KV,
                     int64_t T, int64_t past, float scale, float* kt, int64_t ldkt, int threads);
}

namespace {

using Vec = std::vector<float>;
std::mt19937 rng(1234);

Vec randn(size_t n, float scale, float mean = 0.0f) {
    std::normal_distribution<float> dist(mean, scale);
    Vec v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

// The largest |got - want| relative to the largest |want| (at least 1).
double rel_err(const float* got, const double* want, size_t n) {
    double diff = 0.0, top = 1.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        diff = d > diff || d != d ? d : diff;  // NaN counts as the worst
        top = fabs(want[i]) > top ? fabs(want[i]) : top;
    }
    return diff / top;
}

// A random tree of T nodes in breadth-first order: node i sees itself and its ancestors.
std::vector<uint8_t> random_tree(int64_t T, std::vector<int64_t>* depth) {
    std::vector<uint8_t> tree(T * T, 0);
    depth->assign(T, 0);
    for (int64_t i = 0; i < T; i++) {
        tree[i * T + i] = 1;
        if (i == 0) continue;
        const int64_t parent = (int64_t)(rng() % i);
        (*depth)[i] = (*depth)[parent] + 1;
        for (int64_t j = 0; j < T; j++) tree[i * T + j] |= tree[parent * T + j];
    }
    return tree;
}

bool sees(const uint8_t* tree, int64_t T, int64_t past, int64_t i, int64_t j) {
    if (j < past) return true;
    return tree == nullptr ? j - past <= i : tree[i * T + (j - past)] != 0;
}

// Softmax attention of one query over n keys (rows of D, stride ks) where `seen`, in double.
void attend(const double* q, const float* k, const float* v, int64_t ks, int64_t n, int64_t D,
            double scale, const std::vector<bool>& seen, double* out) {
    std::vector<double> s(n);
    double top = -INFINITY, total = 0.0;
    for (int64_t j = 0; j < n; j++) {
        if (!seen[j]) continue;
        double dot = 0.0;
        for (int64_t d = 0; d < D; d++) dot += q[d] * k[j * ks + d];
        s[j] = dot * scale;
        top = s[j] > top ? s[j] : top;
    }
    for (int64_t d = 0; d < D; d++) out[d] = 0.0;
    for (int64_t j = 0; j < n; j++) {
        if (!seen[j]) continue;
        const double p = exp(s[j] - top);
        total += p;
        for (int64_t d = 0; d < D; d++) out[d] += p * v[j * ks + d];
    }
    for (int64_t d = 0; d < D; d++) out[d] = total > 0.0 ? out[d] / total : 0.0;
}

// y[r] = W[r] . x (+ b[r]), W [n, K], in double.
void matvec(const float* W, const float* b, const double* x, int64_t n, int64_t K, double* y) {
    for (int64_t r = 0; r < n; r++) {
        double acc = b != nullptr ? b[r] : 0.0;
        for (int64_t k = 0; k < K; k++) acc += (double)W[r * K + k] * x[k];
        y[r] = acc;
    }
}

void rmsnorm(const double* x, const float* w, int64_t n, double eps, double* out) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

void rotary(double* x, const float* cos, const float* sin, int64_t D) {
    std::vector<double> a(x, x + D);
    const int64_t half = D / 2;
    for (int64_t i = 0; i < D; i++)
        x[i] = a[i] * cos[i] + (i < half ? -a[i + half] : a[i - half]) * sin[i];
}

struct Model {
    int64_t L, H, I, Hq, KV, D, V;
    bool biases;
    std::vector<Vec> w;  // per layer, 13 tensors in decode_step.cpp's order (empty: none)
    Vec norm, lm, lm_b;
};

enum { LN1, WQ, BQ, WK, BK, WV, BV, WO, BO, LN2, WG, WU, WD, PER_LAYER };

Model make_model(int64_t L, int64_t H, int64_t I, int64_t Hq, int64_t KV, int64_t D, int64_t V,
                 bool biases) {
    Model m{L, H, I, Hq, KV, D, V, biases, {}, {}, {}, {}};
    const float sh = 1.0f / sqrtf((float)H), sq = 1.0f / sqrtf((float)(Hq * D));
    const float si = 1.0f / sqrtf((float)I);
    for (int64_t l = 0; l < L; l++) {
        m.w.push_back(randn(H, 0.1f, 1.0f));
        m.w.push_back(randn(Hq * D * H, sh));
        m.w.push_back(biases ? randn(Hq * D, 0.5f) : Vec());
        m.w.push_back(randn(KV * D * H, sh));
        m.w.push_back(biases ? randn(KV * D, 0.5f) : Vec());
        m.w.push_back(randn(KV * D * H, sh));
        m.w.push_back(biases ? randn(KV * D, 0.5f) : Vec());
        m.w.push_back(randn(H * Hq * D, sq));
        m.w.push_back(Vec());
        m.w.push_back(randn(H, 0.1f, 1.0f));
        m.w.push_back(randn(I * H, sh));
        m.w.push_back(randn(I * H, sh));
        m.w.push_back(randn(H * I, si));
    }
    m.norm = randn(H, 0.1f, 1.0f);
    m.lm = randn(V * H, 4.0f * sh);
    if (biases) m.lm_b = randn(V, 0.5f);
    return m;
}

const float* ptr(const Vec& v) { return v.empty() ? nullptr : v.data(); }

// The caches the checks give the step: float32 (0), or IEEE halves (1).
int32_t kv_half = 0;

// v rounded to the nearest IEEE half (ties to even), by arithmetic in double: its quantum
// (2^-24 below 2^-14, else 2^(e - 10) for v in [2^e, 2^(e+1))) times the nearest integer.
double half_round(double v) {
    if (v != v || v == INFINITY || v == -INFINITY) return v;
    const double a = fabs(v);
    const int e = a < 0x1p-14 ? -14 : (int)floor(log2(a));
    const double quantum = ldexp(1.0, e - 10), r = nearbyint(a / quantum) * quantum;
    return copysign(r >= 65520.0 ? INFINITY : r, v);
}
// The bits of a half value (one half_round gave).
uint16_t half_bits(double h) {
    const uint16_t sign = signbit(h) ? 0x8000 : 0;
    const double a = fabs(h);
    if (a != a) return 0x7E00;
    if (a == INFINITY) return sign | 0x7C00;
    if (a < 0x1p-14) return sign | (uint16_t)(a * 0x1p24);  // subnormal: a multiple of 2^-24
    const int e = (int)floor(log2(a));
    return sign | (uint16_t)((e + 15) << 10) | (uint16_t)(a * ldexp(1.0, 10 - e) - 1024.0);
}
// The library's rounding to halves against half_round: edge cases (ties to even among normal
// and subnormal halves, the largest half and the first value past it, zeros, infinities)
// and floats of every magnitude a half holds. The count of values rounded otherwise.
int64_t check_halves() {
    Vec x = {0.0f, -0.0f, 1.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -(1.0f + 0x1p-11f), 65504.0f, 65519.996f,
             65520.0f, -65520.0f, 1e9f, INFINITY, -INFINITY, 0x1p-14f, 0x1p-24f, 0x1p-25f, 3 * 0x1p-25f, 0x1p-26f,
             1e-8f, -3e-6f, 0x1p-14f - 0x1p-25f, 0x1p-14f - 0x1p-26f, 2047.0f + 0.5f, 2048.0f + 1.0f, 1e-30f};
    std::uniform_real_distribution<float> mag(-27.0f, 17.0f);
    for (int i = 0; i < 100000; i++) x.push_back((i % 2 ? -1.0f : 1.0f) * exp2f(mag(rng)));
    std::vector<uint16_t> got(x.size());
    specd_halves(x.data(), (int64_t)x.size(), got.data());
    int64_t wrong = 0;
    for (size_t i = 0; i < x.size(); i++) {
        const uint16_t want = half_bits(half_round(x[i]));
        if (got[i] != want && wrong++ < 3) printf("half of %a: %04x, expected %04x\n", x[i], got[i], want);
    }
    return wrong;
}
// A cache holding `values` as the step stores them: the floats, or each one's nearest half
// (their bits in the first half of the buffer's bytes).
Vec cache_of(const Vec& values) {
    if (!kv_half) return values;
    Vec c(values.size(), 0.0f);
    uint16_t* h = (uint16_t*)c.data();
    for (size_t i = 0; i < values.size(); i++) h[i] = half_bits(half_round(values[i]));
    return c;
}
// The first n values a cache holds, as floats.
Vec cached_values(const Vec& c, size_t n) {
    if (!kv_half) return Vec(c.begin(), c.begin() + n);
    Vec v(n);
    const uint16_t* h = (const uint16_t*)c.data();
    for (size_t i = 0; i < n; i++) {
        const int e = (h[i] >> 10) & 31, frac = h[i] & 1023;
        const double a = e == 31 ? (frac ? NAN : INFINITY) : e == 0 ? ldexp(frac, -24) : ldexp(1024 + frac, e - 25);
        v[i] = (float)((h[i] & 0x8000) ? -a : a);
    }
    return v;
}

// The step's cache table for keys kc and values vc, [L][KV][cap][D] each (floats or halves).
std::vector<int64_t> cache_table(const Model& m, Vec& kc, Vec& vc, int64_t cap) {
    std::vector<int64_t> caches;
    const int64_t size = kv_half ? 2 : 4;
    for (int64_t l = 0; l < m.L; l++) {
        caches.push_back((int64_t)((char*)kc.data() + l * m.KV * cap * m.D * size));
        caches.push_back((int64_t)((char*)vc.data() + l * m.KV * cap * m.D * size));
        caches.push_back(cap * m.D);
        caches.push_back(cap * m.D);
    }
    return caches;
}

// One pass of T new tokens over the reference's own caches kc, vc ([L][KV][cap][D], the
// first `past` positions filled), which it extends: logits [T, V] and hidden [T, H] (the
// final norm's output, or with `final_norm` false the residual stream, as a drafter's head).
void reference_step(const Model& m, const Vec& x, const Vec& cos, const Vec& sin, int64_t T,
                    int64_t past, const uint8_t* tree, int64_t cap, Vec& kc, Vec& vc,
                    std::vector<double>& logits, std::vector<double>& hidden, bool final_norm = true) {
    const int64_t H = m.H, D = m.D, QD = m.Hq * D, KD = m.KV * D, rep = m.Hq / m.KV;
    const double eps = 1e-5, scale = 1.0 / sqrt((double)D);
    std::vector<double> h(x.begin(), x.end()), xn(H), q(T * QD), k(KD), v(KD), o(QD), y(H);
    std::vector<double> g(m.I), u(m.I);
    for (int64_t l = 0; l < m.L; l++) {
        const std::vector<Vec>& w = m.w;
        const int64_t b = l * PER_LAYER;
        float* lk = kc.data() + l * m.KV * cap * D;
        float* lv = vc.data() + l * m.KV * cap * D;
        for (int64_t i = 0; i < T; i++) {
            rmsnorm(&h[i * H], w[b + LN1].data(), H, eps, xn.data());
            matvec(w[b + WQ].data(), ptr(w[b + BQ]), xn.data(), QD, H, &q[i * QD]);
            matvec(w[b + WK].data(), ptr(w[b + BK]), xn.data(), KD, H, k.data());
            matvec(w[b + WV].data(), ptr(w[b + BV]), xn.data(), KD, H, v.data());
            for (int64_t hd = 0; hd < m.Hq; hd++) rotary(&q[i * QD + hd * D], &cos[i * D], &sin[i * D], D);
            for (int64_t g2 = 0; g2 < m.KV; g2++) {
                rotary(&k[g2 * D], &cos[i * D], &sin[i * D], D);
                for (int64_t d = 0; d < D; d++) {
                    lk[(g2 * cap + past + i) * D + d] = (float)(kv_half ? half_round(k[g2 * D + d]) : k[g2 * D + d]);
                    lv[(g2 * cap + past + i) * D + d] = (float)(kv_half ? half_round(v[g2 * D + d]) : v[g2 * D + d]);
                }
            }
        }
        for (int64_t i = 0; i < T; i++) {
            std::vector<bool> seen(past + T);
            for (int64_t j = 0; j < past + T; j++) seen[j] = sees(tree, T, past, i, j);
            for (int64_t hd = 0; hd < m.Hq; hd++) {
                const int64_t g2 = hd / rep;
                attend(&q[i * QD + hd * D], lk + g2 * cap * D, lv + g2 * cap * D, D, past + T, D,
                       scale, seen, &o[hd * D]);
            }
            matvec(w[b + WO].data(), ptr(w[b + BO]), o.data(), H, QD, y.data());
            for (int64_t r = 0; r < H; r++) h[i * H + r] += y[r];
            rmsnorm(&h[i * H], w[b + LN2].data(), H, eps, xn.data());
            matvec(w[b + WG].data(), nullptr, xn.data(), m.I, H, g.data());
            matvec(w[b + WU].data(), nullptr, xn.data(), m.I, H, u.data());
            for (int64_t r = 0; r < m.I; r++) g[r] = g[r] / (1.0 + exp(-g[r])) * u[r];
            matvec(w[b + WD].data(), nullptr, g.data(), H, m.I, y.data());
            for (int64_t r = 0; r < H; r++) h[i * H + r] += y[r];
        }
    }
    logits.assign(T * m.V, 0.0);
    hidden.assign(T * H, 0.0);
    for (int64_t i = 0; i < T; i++) {
        if (final_norm) rmsnorm(&h[i * H], m.norm.data(), H, eps, &hidden[i * H]);
        else
            for (int64_t r = 0; r < H; r++) hidden[i * H + r] = h[i * H + r];
        matvec(m.lm.data(), ptr(m.lm_b), &hidden[i * H], m.V, H, &logits[i * m.V]);
    }
}

// The step kernel over m against the reference: passes of 1-16 tokens, chains and trees, on
// caches of several lengths. The largest relative error of logits, hidden states and the
// keys and values it wrote.
double check_step(const Model& m, int* passes) {
    const int64_t cap = 160, D = m.D, H = m.H;
    const float eps = 1e-5f, scale = 1.0f / sqrtf((float)D);
    std::vector<const void*> table;
    for (int64_t l = 0; l < m.L; l++)
        for (int n = 0; n < PER_LAYER; n++) table.push_back(ptr(m.w[l * PER_LAYER + n]));
    const std::vector<int32_t> formats(table.size(), 0);
    double worst = 0.0;
    for (int64_t past : {0, 5, 37, 100}) {
        // a cache of `past` random positions, the same for the kernel and the reference
        const Vec k0 = randn(m.L * m.KV * cap * D, 1.0f), v0 = randn(m.L * m.KV * cap * D, 1.0f);
        for (int64_t T = 1; T <= specd_decode_step_max_tokens(); T++) {
            // over halves, what differs from floats (the cache's reads and writes) at a few
            // shapes: the emulated ARM64 build's run stays under a minute
            if (kv_half && (past % 5 != 0 || past == 0 || (T != 1 && T != 3 && T != 8 && T != 16))) continue;
            for (int shape = 0; shape < 2; shape++) {  // a chain, a tree
                std::vector<int64_t> depth(T);
                std::vector<uint8_t> tree;
                if (shape == 1) tree = random_tree(T, &depth);
                else
                    for (int64_t i = 0; i < T; i++) depth[i] = i;
                const uint8_t* tp = shape == 1 ? tree.data() : nullptr;
                const Vec x = randn(T * H, 1.0f);
                Vec cos(T * D), sin(T * D);
                for (int64_t i = 0; i < T; i++)
                    for (int64_t d = 0; d < D; d++) {
                        const double f = pow(10000.0, -2.0 * (d % (D / 2)) / D);
                        cos[i * D + d] = (float)::cos((past + depth[i]) * f);
                        sin[i * D + d] = (float)::sin((past + depth[i]) * f);
                    }
                Vec kc = cache_of(k0), vc = cache_of(v0), rk = cached_values(kc, k0.size()),
                    rv = cached_values(vc, v0.size());
                const std::vector<int64_t> caches = cache_table(m, kc, vc, cap);
                const int threads = 1 + (int)((T + past) % 3);
                Vec work(specd_decode_step_work(H, m.I, m.Hq, m.KV, D, T, past, threads));
                Vec logits(T * m.V), hidden(T * H);
                specd_decode_step(table.data(), formats.data(), m.L, caches.data(), kv_half, H, m.I, m.Hq,
                                  m.KV, D, eps, scale, x.data(), cos.data(), sin.data(), T, past,
                                  tp, m.norm.data(), m.lm.data(), 0, ptr(m.lm_b), m.V,
                                  logits.data(), hidden.data(), work.data(), threads);
                std::vector<double> want_logits, want_hidden;
                reference_step(m, x, cos, sin, T, past, tp, cap, rk, rv, want_logits, want_hidden);
                std::vector<double> want_k(rk.begin(), rk.end()), want_v(rv.begin(), rv.end());
                const double errs[] = {
                    rel_err(logits.data(), want_logits.data(), logits.size()),
                    rel_err(hidden.data(), want_hidden.data(), hidden.size()),
                    rel_err(cached_values(kc, k0.size()).data(), want_k.data(), k0.size()),
                    rel_err(cached_values(vc, v0.size()).data(), want_v.data(), v0.size()),
                };
                for (double e : errs) worst = e > worst || e != e ? e : worst;
                (*passes)++;
                if (shape == 0 && T % 4 == 1) {  // no final norm (null): the residual stream
                    Vec k2 = cache_of(k0), v2 = cache_of(v0), rk2 = cached_values(k2, k0.size()),
                        rv2 = cached_values(v2, v0.size()), l2(T * m.V), h2(T * H);
                    const std::vector<int64_t> c2 = cache_table(m, k2, v2, cap);
                    specd_decode_step(table.data(), formats.data(), m.L, c2.data(), kv_half, H, m.I, m.Hq,
                                      m.KV, D, eps, scale, x.data(), cos.data(), sin.data(), T, past,
                                      nullptr, nullptr, m.lm.data(), 0, ptr(m.lm_b), m.V, l2.data(),
                                      h2.data(), work.data(), threads);
                    reference_step(m, x, cos, sin, T, past, nullptr, cap, rk2, rv2, want_logits,
                                   want_hidden, false);
                    for (double e : {rel_err(l2.data(), want_logits.data(), l2.size()),
                                     rel_err(h2.data(), want_hidden.data(), h2.size())})
                        worst = e > worst || e != e ? e : worst;
                    (*passes)++;
                }
            }
        }
    }
    return worst;
}

// A chain pass of T tokens against T one-token steps over copies of the same cache: each
// token's logits, hidden state and cached keys and values equal bit for bit (what makes
// plain decoding and speculation emit the same tokens); and a tree pass, each node's logits
// and hidden state against the one-token steps along its path (the rotary angles given per
// node, as a tree's depths set them). The number of values, or rows of a node, that differ.
int64_t check_consistent(const Model& m, int* passes) {
    const int64_t cap = 420, D = m.D, H = m.H;
    const float eps = 1e-5f, scale = 1.0f / sqrtf((float)D);
    std::vector<const void*> table;
    for (int64_t l = 0; l < m.L; l++)
        for (int n = 0; n < PER_LAYER; n++) table.push_back(ptr(m.w[l * PER_LAYER + n]));
    const std::vector<int32_t> formats(table.size(), 0);
    int64_t differ = 0;
    for (int64_t past : {0, 9, 121, 250})
        for (int64_t T : {2, 5, 16})
            for (int threads : {2, 3}) {
                if (kv_half && (past % 2 == 0 || T * threads == 15)) continue;  // fewer over halves
                const Vec k0 = randn(m.L * m.KV * cap * D, 1.0f), v0 = randn(m.L * m.KV * cap * D, 1.0f);
                const Vec x = randn(T * H, 1.0f), cos = randn(T * D, 0.5f), sin = randn(T * D, 0.5f);
                Vec kc[2] = {cache_of(k0), cache_of(k0)}, vc[2] = {cache_of(v0), cache_of(v0)}, logits[2], hidden[2];
                for (int way = 0; way < 2; way++) {  // the pass, then the steps
                    logits[way].assign(T * m.V, 0.0f);
                    hidden[way].assign(T * H, 0.0f);
                    const std::vector<int64_t> caches = cache_table(m, kc[way], vc[way], cap);
                    const int64_t step = way == 0 ? T : 1;
                    for (int64_t i = 0; i < T; i += step) {
                        Vec work(specd_decode_step_work(H, m.I, m.Hq, m.KV, D, step, past + i, threads));
                        specd_decode_step(table.data(), formats.data(), m.L, caches.data(), kv_half, H, m.I,
                                          m.Hq, m.KV, D, eps, scale, x.data() + i * H, cos.data() + i * D,
                                          sin.data() + i * D, step, past + i, nullptr, m.norm.data(),
                                          m.lm.data(), 0, ptr(m.lm_b), m.V, logits[way].data() + i * m.V,
                                          hidden[way].data() + i * H, work.data(), threads);
                    }
                }
                for (const auto* pair : {logits, hidden, kc, vc})
                    for (size_t j = 0; j < pair[0].size(); j++)
                        differ += memcmp(&pair[0][j], &pair[1][j], sizeof(float)) != 0;
                (*passes)++;
                // a tree of T nodes against, for each node, the one-token steps along its path
                std::vector<int64_t> depth;
                const std::vector<uint8_t> tree = random_tree(T, &depth);
                Vec tk = cache_of(k0), tv = cache_of(v0), tl(T * m.V), th(T * H);
                const std::vector<int64_t> tc = cache_table(m, tk, tv, cap);
                Vec work(specd_decode_step_work(H, m.I, m.Hq, m.KV, D, T, past, threads));
                specd_decode_step(table.data(), formats.data(), m.L, tc.data(), kv_half, H, m.I, m.Hq, m.KV,
                                  D, eps, scale, x.data(), cos.data(), sin.data(), T, past, tree.data(),
                                  m.norm.data(), m.lm.data(), 0, ptr(m.lm_b), m.V, tl.data(), th.data(),
                                  work.data(), threads);
                for (int64_t i = 0; i < T; i++) {
                    Vec pk = cache_of(k0), pv = cache_of(v0), pl(m.V), ph(H);
                    const std::vector<int64_t> pc = cache_table(m, pk, pv, cap);
                    int64_t at = past;
                    for (int64_t n = 0; n <= i; n++) {  // its ancestors and itself, in order
                        if (!tree[i * T + n]) continue;
                        Vec w1(specd_decode_step_work(H, m.I, m.Hq, m.KV, D, 1, at, threads));
                        specd_decode_step(table.data(), formats.data(), m.L, pc.data(), kv_half, H, m.I, m.Hq,
                                          m.KV, D, eps, scale, x.data() + n * H, cos.data() + n * D,
                                          sin.data() + n * D, 1, at, nullptr, m.norm.data(), m.lm.data(),
                                          0, ptr(m.lm_b), m.V, pl.data(), ph.data(), w1.data(), threads);
                        at++;
                    }
                    differ += memcmp(pl.data(), tl.data() + i * m.V, m.V * sizeof(float)) != 0;
                    differ += memcmp(ph.data(), th.data() + i * H, H * sizeof(float)) != 0;
                }
                (*passes)++;
            }
    return differ;
}

// Weights stored as blocks (decode_step.cpp's Format): random blocks of each format, their
// values decoded here independently of the kernel (a half's value from its fields, each
// format's loops as ggml's reference de-quantizers run them, in double precision).
enum { F32 = 0, Q4_0 = 1, Q4_1 = 2, Q8_0 = 3, BF16 = 4, Q5_0 = 5, Q5_1 = 6, Q4_K = 7, Q5_K = 8, Q6_K = 9 };
const int64_t BLOCK_BYTES[] = {0, 18, 20, 34, 64, 22, 24, 144, 176, 210};
const char* const NAMES[] = {"F32", "Q4_0", "Q4_1", "Q8_0", "BF16", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"};
int64_t block_values(int f) { return f >= Q4_K ? 256 : 32; }

double half_value(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp((double)m, -24) : ldexp(1.0 + m / 1024.0, e - 15);
    return h & 0x8000 ? -v : v;
}

// A random half of magnitude in [2^lo, 2^hi), either sign.
uint16_t random_half(int lo, int hi) {
    const uint32_t e = (uint32_t)(lo + 15 + (int)(rng() % (uint32_t)(hi - lo)));
    return (uint16_t)(((rng() & 1u) << 15) | (e << 10) | (rng() & 1023u));
}

// The eight 6-bit scales and mins of a Q4_K or Q5_K super-block: bytes 0-3 hold scales 0-3
// (low six bits) and the top bits of scales 4-7, bytes 4-7 the mins likewise, bytes 8-11
// the low four bits of scales (low nibble) and mins (high nibble) 4-7.
void scales_mins(const uint8_t* p, int sc[8], int mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = p[j] & 63;
        mn[j] = p[4 + j] & 63;
        sc[4 + j] = (p[8 + j] & 15) | ((p[j] >> 6) << 4);
        mn[4 + j] = (p[8 + j] >> 4) | ((p[4 + j] >> 6) << 4);
    }
}

// One block of format f at blk (random bytes, sane scales) and its values into out.
void random_block(int f, uint8_t* blk, float* out) {
    for (int64_t j = 0; j < BLOCK_BYTES[f]; j++) blk[j] = (uint8_t)rng();
    if (f == BF16) {
        for (int j = 0; j < 32; j++) {
            const uint16_t h = (uint16_t)(((rng() & 1u) << 15) | ((118u + rng() % 8u) << 7) | (rng() & 127u));
            memcpy(blk + 2 * j, &h, 2);
            const uint32_t bits = (uint32_t)h << 16;
            memcpy(&out[j], &bits, 4);
        }
        return;
    }
    if (f == Q4_K || f == Q5_K) {
        const uint16_t d = random_half(-14, -9), dmin = random_half(-12, -8);
        memcpy(blk, &d, 2);
        memcpy(blk + 2, &dmin, 2);
        int sc[8], mn[8];
        scales_mins(blk + 4, sc, mn);
        const uint8_t* qh = blk + 16;
        const uint8_t* q = blk + (f == Q5_K ? 48 : 16);
        for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32)
            for (int l = 0; l < 32; l++) {
                const int lo = (q[l] & 15) + (f == Q5_K && (qh[l] >> is) & 1 ? 16 : 0);
                const int hi = (q[l] >> 4) + (f == Q5_K && (qh[l] >> (is + 1)) & 1 ? 16 : 0);
                out[j + l] = (float)(half_value(d) * sc[is] * lo - half_value(dmin) * mn[is]);
                out[j + 32 + l] = (float)(half_value(d) * sc[is + 1] * hi - half_value(dmin) * mn[is + 1]);
            }
        return;
    }
    if (f == Q6_K) {
        const uint16_t d = random_half(-14, -10);
        memcpy(blk + 208, &d, 2);
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t* sc = (const int8_t*)(blk + 192);
        for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8)
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                out[n + l] = (float)(half_value(d) * sc[is] * q1);
                out[n + l + 32] = (float)(half_value(d) * sc[is + 2] * q2);
                out[n + l + 64] = (float)(half_value(d) * sc[is + 4] * q3);
                out[n + l + 96] = (float)(half_value(d) * sc[is + 6] * q4);
            }
        return;
    }
    const uint16_t d = random_half(-9, -5), mn = random_half(-6, -3);
    memcpy(blk, &d, 2);
    const bool with_min = f == Q4_1 || f == Q5_1;
    if (with_min) memcpy(blk + 2, &mn, 2);
    const uint8_t* q = blk + (with_min ? 4 : 2);
    uint32_t qh = 0;
    if (f == Q5_0 || f == Q5_1) {
        memcpy(&qh, q, 4);
        q += 4;
    }
    for (int j = 0; j < 32; j++) {
        double v;
        if (f == Q8_0) v = half_value(d) * (int8_t)q[j];
        else {
            int nib = j < 16 ? q[j] & 15 : q[j - 16] >> 4;
            if (f == Q5_0 || f == Q5_1) nib |= ((qh >> j) & 1) << 4;
            if (f == Q4_0) v = half_value(d) * (nib - 8);
            else if (f == Q5_0) v = half_value(d) * (nib - 16);
            else v = half_value(d) * nib + half_value(mn);
        }
        out[j] = (float)v;  // d * q is exact; + m rounds once, as a float sum does
    }
}

// rows x K values of format f: the blocks (into `bytes`) and their values (returned).
Vec random_blocks(int f, int64_t rows, int64_t K, std::vector<uint8_t>* bytes) {
    const int64_t per = block_values(f), nb = K / per;
    bytes->assign(rows * nb * BLOCK_BYTES[f], 0);
    Vec values(rows * K);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++)
            random_block(f, bytes->data() + (r * nb + b) * BLOCK_BYTES[f], &values[r * K + b * per]);
    return values;
}

// The step over weights stored as blocks of format f against the same step over their
// values as float32: they must agree bit for bit (the kernel decodes each block exactly and
// sums in the same order). The count of differing values of logits, hidden states and cache.
int64_t check_blocks(const Model& base, int f, int* passes) {
    Model m = base;  // float32 values of the blocks
    std::vector<std::vector<uint8_t>> store;
    std::vector<const void*> table;
    std::vector<int32_t> formats;
    const int64_t QD = m.Hq * m.D, KD = m.KV * m.D;
    const int64_t rows_of[] = {0, QD, 0, KD, 0, KD, 0, m.H, 0, 0, m.I, m.I, m.H};
    const int64_t cols_of[] = {0, m.H, 0, m.H, 0, m.H, 0, QD, 0, 0, m.H, m.H, m.I};
    store.reserve(m.L * PER_LAYER + 1);
    for (int64_t l = 0; l < m.L; l++)
        for (int n = 0; n < PER_LAYER; n++) {
            Vec& w = m.w[l * PER_LAYER + n];
            if (rows_of[n] == 0) {  // a norm or a bias
                table.push_back(ptr(w));
                formats.push_back(F32);
                continue;
            }
            store.emplace_back();
            w = random_blocks(f, rows_of[n], cols_of[n], &store.back());
            table.push_back(store.back().data());
            formats.push_back(f);
        }
    store.emplace_back();
    m.lm = random_blocks(f, m.V, m.H, &store.back());
    const void* lm = store.back().data();
    std::vector<const void*> plain;
    for (const Vec& w : m.w) plain.push_back(ptr(w));
    const std::vector<int32_t> f32(plain.size(), F32);
    const int64_t cap = 64, D = m.D, H = m.H;
    int64_t differ = 0;
    for (int64_t past : {0, 9}) {
        const Vec k0 = randn(m.L * m.KV * cap * D, 1.0f), v0 = randn(m.L * m.KV * cap * D, 1.0f);
        for (int64_t T = 1; T <= specd_decode_step_max_tokens(); T += 3) {
            const Vec x = randn(T * H, 1.0f), cos = randn(T * D, 0.5f), sin = randn(T * D, 0.5f);
            Vec out[2][4];
            for (int run = 0; run < 2; run++) {
                Vec kc = k0, vc = v0;
                const std::vector<int64_t> caches = cache_table(m, kc, vc, cap);
                const int threads = 1 + (int)(T % 2);
                Vec work(specd_decode_step_work(H, m.I, m.Hq, m.KV, D, T, past, threads));
                Vec logits(T * m.V), hidden(T * H);
                specd_decode_step(run == 0 ? table.data() : plain.data(),
                                  run == 0 ? formats.data() : f32.data(), m.L, caches.data(), kv_half, H,
                                  m.I, m.Hq, m.KV, D, 1e-5f, 0.125f, x.data(), cos.data(),
                                  sin.data(), T, past, nullptr, m.norm.data(),
                                  run == 0 ? lm : (const void*)m.lm.data(), run == 0 ? f : F32,
                                  ptr(m.lm_b), m.V, logits.data(), hidden.data(), work.data(),
                                  threads);
                out[run][0] = logits, out[run][1] = hidden, out[run][2] = kc, out[run][3] = vc;
            }
            for (int i = 0; i < 4; i++)
                for (size_t j = 0; j < out[0][i].size(); j++) differ += out[0][i][j] != out[1][i][j];
            (*passes)++;
        }
    }
    return differ;
}

// The attention kernel against the reference at one shape.
double check_attention(int64_t T, int64_t past, int64_t Hq, int64_t KV, bool with_tree) {
    const int64_t D = specd_attention_head_dim(), S = past + T, ld = (S + 63) / 64 * 64;
    const Vec q = randn(Hq * T * D, 2.0f), k = randn(KV * S * D, 1.0f), v = randn(KV * S * D, 1.0f);
    std::vector<int64_t> depth;
    std::vector<uint8_t> tree;
    if (with_tree) tree = random_tree(T, &depth);
    const uint8_t* tp = with_tree ? tree.data() : nullptr;
    Vec out(Hq * T * D), kt(KV * D * ld);
    const float scale = 0.125f;
    specd_attention(q.data(), T * D, D, k.data(), S * D, D, v.data(), S * D, D, out.data(), T * D,
                    D, tp, Hq, KV, T, past, scale, kt.data(), ld, 3);
    std::vector<double> want(Hq * T * D), qd(D);
    for (int64_t h = 0; h < Hq; h++)
        for (int64_t i = 0; i < T; i++) {
            std::vector<bool> seen(S);
            for (int64_t j = 0; j < S; j++) seen[j] = sees(tp, T, past, i, j);
            for (int64_t d = 0; d < D; d++) qd[d] = q[(h * T + i) * D + d];
            const int64_t g = h / (Hq / KV);
            attend(qd.data(), &k[g * S * D], &v[g * S * D], D, S, D, scale, seen,
                   &want[(h * T + i) * D]);
        }
    return rel_err(out.data(), want.data(), out.size());
}

}  // namespace

// The products over rows woven 16 together (format 10: Q4_1's nibbles, d and m; 11: Q8_0's
// bytes plus 128 and d; qdot.h's layouts) with int8 activations, against the same arithmetic
// here in double: activations rounded as decode_step.cpp's `quantize` rounds them (a scale
// per 32), the integer sums exact, the weight's values from its fields; and the kernel's
// de-quantization of the woven weight. The worst error relative to the largest value over
// N rows (cut groups included), T tokens (past a tile of 64 too), 1-3 threads; `unlike`
// counts the values that differ from each token's product alone (one-token steps).
double check_woven(int format, int64_t N, int64_t K, int* passes, int64_t* unlike) {
    const bool q8 = format == 11;
    const int64_t G = (N + 15) / 16, nb = K / 32, bytes = q8 ? 544 : 320, nq = q8 ? 512 : 256;
    std::vector<uint8_t> w(G * nb * bytes);
    std::vector<int32_t> qv(G * 16 * K);  // row r, column k: the integer value
    for (int64_t g = 0; g < G; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t* p = w.data() + (g * nb + b) * bytes;
            for (int64_t j = 0; j < nq; j++) p[j] = (uint8_t)rng();
            for (int l = 0; l < 16; l++) {
                const uint16_t d = random_half(-9, -5), m = random_half(-6, -3);
                memcpy(p + nq + 2 * l, &d, 2);
                if (!q8) memcpy(p + nq + 32 + 2 * l, &m, 2);
                int32_t* row = qv.data() + (g * 16 + l) * K + 32 * b;
                for (int k = 0; k < (q8 ? 8 : 4); k++)
                    for (int c = 0; c < 4; c++) {
                        const uint8_t q = p[64 * k + 4 * l + c];
                        if (q8) {
                            row[4 * k + c] = (int32_t)q - 128;
                        } else {
                            row[4 * k + c] = q & 15;
                            row[16 + 4 * k + c] = q >> 4;
                        }
                    }
            }
        }
    auto scales = [&](int64_t r, int64_t b, double* d, double* m) {
        const uint8_t* p = w.data() + ((r / 16) * nb + b) * bytes;
        uint16_t h[2] = {0, 0};
        memcpy(&h[0], p + nq + 2 * (r % 16), 2);
        if (!q8) memcpy(&h[1], p + nq + 32 + 2 * (r % 16), 2);
        *d = half_value(h[0]);
        *m = q8 ? 0.0 : half_value(h[1]);
    };
    double worst = 0.0;
    Vec values(N * K);
    specd_dequantize(w.data(), format, N, K, values.data(), 2);
    for (int64_t r = 0; r < N; r++)
        for (int64_t k = 0; k < K; k++) {  // one rounding: d * q + m
            double d, m;
            scales(r, k / 32, &d, &m);
            if (values[r * K + k] != (float)(d * qv[r * K + k] + m)) worst = 1.0;
        }
    for (int64_t T : {1, 3, 8, 16, 70})
        for (int threads = 1; threads <= 3; threads++) {
            const Vec x = randn(T * K, 1.0f);
            Vec y(T * N), alone(N);
            specd_product(w.data(), format, N, K, x.data(), T, nullptr, y.data(), threads);
            for (int64_t i = 0; i < T; i++) {
                specd_product(w.data(), format, N, K, x.data() + i * K, 1, nullptr, alone.data(), threads);
                for (int64_t r = 0; r < N; r++) *unlike += y[i * N + r] != alone[r];
            }
            std::vector<double> want(T * N, 0.0);
            for (int64_t i = 0; i < T; i++)
                for (int64_t b = 0; b < nb; b++) {
                    const float* xb = x.data() + i * K + 32 * b;
                    float top = 0.0f;
                    double sum = 0.0;
                    for (int j = 0; j < 32; j++) {
                        top = fabsf(xb[j]) > top ? fabsf(xb[j]) : top;
                        sum += xb[j];
                    }
                    const float inv = top > 0.0f ? 127.0f / top : 0.0f, dx = top / 127.0f;
                    for (int64_t r = 0; r < N; r++) {
                        double d, m;
                        scales(r, b, &d, &m);
                        int64_t isum = 0;
                        for (int j = 0; j < 32; j++)
                            isum += (int64_t)qv[r * K + 32 * b + j] * (int64_t)nearbyintf(xb[j] * inv);
                        want[i * N + r] += d * isum * dx + m * sum;
                    }
                }
            const double e = rel_err(y.data(), want.data(), T * N);
            worst = e > worst || e != e ? e : worst;
            (*passes)++;
        }
    return worst;
}

int main(int argc, char** argv) {
    double tolerance = 1e-4;
    if (argc > 2 || (argc == 2 && (tolerance = atof(argv[1])) <= 0.0)) {
        fprintf(stderr, "usage: %s [tolerance > 0]\n", argv[0]);
        return 2;
    }
    int passes = 0;
    const Model wide = make_model(2, 128, 192, 6, 2, 64, 100, false);  // blocked scores
    const Model narrow = make_model(2, 64, 96, 4, 1, 16, 77, true);    // biases, 16-wide heads
    double step = check_step(wide, &passes);
    const double step_narrow = check_step(narrow, &passes);
    step = step_narrow > step || step_narrow != step_narrow ? step_narrow : step;
    // over caches of halves: the reference rounds each new key and value from double, the
    // kernel from float32, so one may land on the next half where the two straddle a midpoint
    // (2^-11 of the value at most)
    const int64_t rounded_otherwise = check_halves();
    kv_half = 1;
    int half_passes = 0;
    const double half_tolerance = tolerance > 1e-3 ? tolerance : 1e-3;
    double half_step = check_step(wide, &half_passes);
    const double half_narrow = check_step(narrow, &half_passes);
    half_step = half_narrow > half_step || half_narrow != half_narrow ? half_narrow : half_step;
    int half_same = 0;
    const int64_t half_unlike = check_consistent(wide, &half_same) + check_consistent(narrow, &half_same);
    kv_half = 0;
    const struct {
        int64_t T, past, Hq, KV;
        bool tree;
    } shapes[] = {{1, 40, 2, 1, false}, {3, 0, 2, 2, false}, {16, 0, 9, 3, false},
                  {65, 0, 4, 4, false}, {130, 0, 4, 2, false}, {37, 5, 9, 3, false},
                  {100, 150, 6, 2, false}, {20, 0, 6, 2, true}, {20, 50, 6, 2, true},
                  {70, 100, 4, 2, true}};
    double attention = 0.0;
    for (const auto& s : shapes) {
        const double e = check_attention(s.T, s.past, s.Hq, s.KV, s.tree);
        attention = e > attention || e != e ? e : attention;
    }
    int block_passes = 0;
    int64_t differ = 0;
    const Model kq = make_model(1, 256, 512, 4, 2, 64, 40, false);  // whole super-blocks of 256
    for (int f = Q4_0; f <= Q6_K; f++) {
        const int64_t d = f >= Q4_K ? check_blocks(kq, f, &block_passes)
                                    : check_blocks(wide, f, &block_passes) + check_blocks(narrow, f, &block_passes);
        if (d != 0) printf("%s blocks: %lld values differ from the float32 step's\n", NAMES[f], (long long)d);
        differ += d;
    }
    int same_passes = 0;
    const int64_t unlike = check_consistent(wide, &same_passes) + check_consistent(narrow, &same_passes);
    int woven_passes = 0;
    double woven = 0.0;
    int64_t woven_unlike = 0;
    for (int format : {10, 11})
        for (int64_t n : {40, 64}) {
            const double e = check_woven(format, n, n == 40 ? 96 : 576, &woven_passes, &woven_unlike);
            woven = e > woven || e != e ? e : woven;
        }
    const bool ok = step <= tolerance && attention <= tolerance && differ == 0 && woven <= tolerance && unlike == 0 &&
                    woven_unlike == 0 && half_step <= half_tolerance && half_unlike == 0 &&
                    rounded_otherwise == 0;
    printf("specd kernels, %s: step %.2e over %d passes, attention %.2e over %d shapes "
           "(largest error relative to the largest value; tolerance %.0e); weights as Q4_0, "
           "Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K and BF16 blocks against their float32 "
           "values: %lld values differ over %d passes; woven Q4_1 and Q8_0 rows' int8 products %.2e over "
           "%d (%lld values differ from each token's alone); passes against one-token steps: %lld values "
           "differ over %d; floats rounded to halves otherwise than to the nearest: %lld; over caches of "
           "halves: step %.2e over %d passes (tolerance %.0e), passes against one-token steps: %lld values "
           "differ over %d: %s\n",
           specd_kernel_isa(), step, passes, attention, (int)(sizeof(shapes) / sizeof(shapes[0])),
           tolerance, (long long)differ, block_passes, woven, woven_passes, (long long)woven_unlike, (long long)unlike,
           same_passes, (long long)rounded_otherwise, half_step, half_passes, half_tolerance, (long long)half_unlike, half_same,
           ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
