// Attention of a few to a few thousand new queries over a KV cache, float32, written once
// over vec.h's 16-float vectors and built per instruction set (specd/forward/cpu_kernels.py
// builds and loads it).
//
// Flash-attention order: each task takes one query head and a block of up to BQ queries,
// walks the keys it may see in blocks of BK with an online softmax, and writes its rows
// once. Grouped-query attention reads each key/value head for all of its query heads. Keys
// are transposed once per call, so a block's scores are a small matrix product whose
// accumulators stay in registers.
//
// Visibility: key j is seen by new query i (at position past + i) when j < past (the
// cache) or, among the new keys, when j - past <= i (a chain), or where the [T, T] mask
// says so (a tree).

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "vec.h"

namespace {

using namespace specd;

constexpr int BQ = 64;  // queries per task
constexpr int BK = 64;  // keys per block: four vectors of 16
constexpr int D = 64;   // head dimension
constexpr int RM = TILE_ROWS;  // query rows per register tile
constexpr int CV = TILE_VECS;  // vectors of 16 keys (or value columns) per register tile

// Bits [lo, hi) set, 0 <= lo <= hi <= 64.
inline uint64_t bits(int64_t lo, int64_t hi) {
    if (hi <= lo) return 0;
    const uint64_t upto = hi >= 64 ? ~0ull : ((1ull << hi) - 1);
    return upto & ~((1ull << lo) - 1);
}

struct Args {
    const float* q;  // [Hq, T, D] with strides q_h, q_t
    int64_t q_h, q_t;
    const float* kt;  // [KV, D, ldkt]: the keys, transposed
    int64_t ldkt;
    const float* v;  // [KV, S, D] with strides v_h, v_s
    int64_t v_h, v_s;
    float* out;  // [Hq, T, D] with strides o_h, o_t
    int64_t o_h, o_t;
    const uint8_t* tree;  // [T, T] or null (a chain)
    int64_t T, past, rep;
    float scale;
};

// Which keys of block [j0, j0 + nk) new query i sees, as bits from j0.
inline uint64_t visible(const Args& a, int64_t i, int64_t j0, int64_t nk) {
    const int64_t hi = j0 + nk;
    uint64_t vis = bits(0, (hi < a.past ? hi : a.past) - j0);
    if (hi <= a.past) return vis;
    const int64_t s = j0 > a.past ? j0 : a.past;  // first new key in the block
    if (a.tree == nullptr) {
        const int64_t e = a.past + i + 1 < hi ? a.past + i + 1 : hi;
        return vis | bits(s - j0, e - j0);
    }
    const uint64_t seen = nonzero_bits(a.tree + i * a.T + (s - a.past), hi - s);  // <= 64 keys
    return vis | (seen << (s - j0));
}

void task(const Args& a, int64_t h, int64_t i0, int64_t i1) {
    alignas(64) float Q[BQ][D];
    alignas(64) float P[BQ][BK];
    alignas(64) float O[BQ][D];
    float m[BQ], l[BQ];
    const int64_t rows = i1 - i0;
    const float* q = a.q + h * a.q_h;
    const float* kt = a.kt + (h / a.rep) * D * a.ldkt;
    const float* v = a.v + (h / a.rep) * a.v_h;
    const V16 scale = vset1(a.scale);
    for (int64_t r = 0; r < BQ; r++) {
        for (int d = 0; d < D; d += 16) {
            const V16 x = r < rows ? vload(q + (i0 + r) * a.q_t + d) : vzero();
            vstore(&Q[r][d], vmul(x, scale));
            vstore(&O[r][d], vzero());
        }
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    const int64_t end = a.past + (a.tree != nullptr ? a.T : i1);  // keys any row may see
    const int64_t tiles = (rows + RM - 1) / RM * RM;
    for (int64_t j0 = 0; j0 < end; j0 += BK) {
        const int64_t nk = end - j0 < BK ? end - j0 : BK;
        // scores of RM rows by 16 * CV keys at a time, in registers
        for (int64_t r0 = 0; r0 < tiles; r0 += RM) {
            for (int c0 = 0; c0 < 4; c0 += CV) {
                V16 acc[RM][CV];
                for (int i = 0; i < RM; i++)
                    for (int c = 0; c < CV; c++) acc[i][c] = vzero();
                const float* kp = kt + j0 + 16 * c0;
                for (int d = 0; d < D; d++) {
                    V16 k[CV];
                    for (int c = 0; c < CV; c++) k[c] = vload(kp + d * a.ldkt + 16 * c);
                    for (int i = 0; i < RM; i++) {
                        const V16 b = vset1(Q[r0 + i][d]);
                        for (int c = 0; c < CV; c++) acc[i][c] = vfma(b, k[c], acc[i][c]);
                    }
                }
                for (int i = 0; i < RM; i++)
                    for (int c = 0; c < CV; c++) vstore(&P[r0 + i][(c0 + c) * 16], acc[i][c]);
            }
        }
        // online softmax: scores become probabilities, earlier sums and outputs rescale
        for (int64_t r = 0; r < rows; r++) {
            const uint64_t vis = visible(a, i0 + r, j0, nk);
            if (vis == 0) {
                memset(P[r], 0, sizeof(P[r]));
                continue;
            }
            V16 s[4];
            V16 top = vset1(-INFINITY);
            for (int c = 0; c < 4; c++) {
                const unsigned mk = (unsigned)(vis >> (16 * c)) & 0xFFFFu;
                s[c] = vselect(mk, vload(&P[r][c * 16]), vset1(-INFINITY));
                top = vmax(top, s[c]);
            }
            const float block_max = vhmax(top);
            const float mx = block_max > m[r] ? block_max : m[r];
            const float alpha = expf(m[r] - mx);  // 0 for the first block a row sees
            const V16 mxv = vset1(mx);
            V16 sum = vzero();
            for (int c = 0; c < 4; c++) {
                const unsigned mk = (unsigned)(vis >> (16 * c)) & 0xFFFFu;
                const V16 p = vselect(mk, vexp(vsub(s[c], mxv)), vzero());
                sum = vadd(sum, p);
                vstore(&P[r][c * 16], p);
            }
            l[r] = l[r] * alpha + vhsum(sum);
            m[r] = mx;
            if (alpha != 1.0f) {
                const V16 av = vset1(alpha);
                for (int d = 0; d < D; d += 16) vstore(&O[r][d], vmul(vload(&O[r][d]), av));
            }
        }
        for (int64_t r = rows; r < tiles; r++) memset(P[r], 0, sizeof(P[r]));
        // outputs += probabilities x values, RM rows by 16 * CV columns at a time
        for (int64_t r0 = 0; r0 < tiles; r0 += RM) {
            for (int c0 = 0; c0 < 4; c0 += CV) {
                V16 acc[RM][CV];
                for (int i = 0; i < RM; i++)
                    for (int c = 0; c < CV; c++) acc[i][c] = vload(&O[r0 + i][(c0 + c) * 16]);
                for (int64_t n = 0; n < nk; n++) {
                    const float* vp = v + (j0 + n) * a.v_s + 16 * c0;
                    V16 vv[CV];
                    for (int c = 0; c < CV; c++) vv[c] = vload(vp + 16 * c);
                    for (int i = 0; i < RM; i++) {
                        const V16 b = vset1(P[r0 + i][n]);
                        for (int c = 0; c < CV; c++) acc[i][c] = vfma(b, vv[c], acc[i][c]);
                    }
                }
                for (int i = 0; i < RM; i++)
                    for (int c = 0; c < CV; c++) vstore(&O[r0 + i][(c0 + c) * 16], acc[i][c]);
            }
        }
    }
    float* out = a.out + h * a.o_h;
    for (int64_t r = 0; r < rows; r++) {
        const V16 inv = vset1(l[r] > 0.0f ? 1.0f / l[r] : 0.0f);  // no key: zeros
        for (int d = 0; d < D; d += 16) vstore(out + (i0 + r) * a.o_t + d, vmul(vload(&O[r][d]), inv));
    }
}

}  // namespace

extern "C" {

int specd_attention_head_dim() { return D; }

// q: [Hq, T, D] (strides q_h, q_t); k, v: [KV, past + T, D] (strides k_h, k_s and v_h, v_s);
// out: [Hq, T, D] (strides o_h, o_t); the last dimension of each contiguous. tree: [T, T]
// bytes, nonzero where query i sees new key j, or null for a chain. kt: scratch of
// KV * D * ldkt floats, ldkt >= past + T rounded up to a multiple of 64.
void specd_attention(const float* q, int64_t q_h, int64_t q_t, const float* k, int64_t k_h,
                     int64_t k_s, const float* v, int64_t v_h, int64_t v_s, float* out,
                     int64_t o_h, int64_t o_t, const uint8_t* tree, int64_t Hq, int64_t KV,
                     int64_t T, int64_t past, float scale, float* kt, int64_t ldkt, int threads) {
    const int64_t S = past + T;
    const int64_t chunks = ldkt / 16;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t c = 0; c < KV * chunks; c++) {
        const int64_t g = c / chunks, s0 = (c % chunks) * 16;
        float* dst = kt + g * D * ldkt;
        for (int64_t s = s0; s < s0 + 16; s++) {
            const float* src = k + g * k_h + s * k_s;
            for (int d = 0; d < D; d++) dst[d * ldkt + s] = s < S ? src[d] : 0.0f;
        }
    }
    const Args a{q, q_h, q_t, kt, ldkt, v, v_h, v_s, out, o_h, o_t, tree, T, past, Hq / KV, scale};
    const int64_t blocks = (T + BQ - 1) / BQ;
    // the longest tasks (the last query blocks) first
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t it = 0; it < Hq * blocks; it++) {
        const int64_t b = blocks - 1 - it / Hq, h = it % Hq;
        const int64_t i0 = b * BQ, i1 = i0 + BQ < T ? i0 + BQ : T;
        task(a, h, i0, i1);
    }
}

}  // extern "C"
