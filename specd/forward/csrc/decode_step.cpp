// A decode or verify step of a Llama-style decoder (a few new tokens over a KV cache), in
// float32 over weights stored as float32, bfloat16 or GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q4_K, Q5_K and Q6_K blocks (decoded in registers as they stream in), written once over
// vec.h's 16-float vectors and built per instruction set (specd/forward/cpu_kernels.py
// builds and loads it).
//
// A step of a few tokens reads every weight once and does little else, so it runs at the
// speed the weights stream from memory. The whole step is one parallel region: each
// product's rows are split between the threads, each thread streaming a contiguous part of
// the weight and multiplying each block of rows with every new token while the block is in
// its L1 cache, with a barrier where the next product needs the whole of the last one's
// output (five a layer). Norms, rotary embeddings and the merge of the attention's parts
// are a few thousand values: every thread computes them itself rather than wait for one to.
//
// Arithmetic (as specd/fastpath.py computes it, up to the order of float32 sums), for each
// new token:
//   x = rmsnorm(h) * ln1; q, k, v = Wq x + bq, Wk x + bk, Wv x + bv; rotary on q and k;
//   the new keys and values written into the cache at positions past .. past + T - 1;
//   attention of each query head over the cached positions and the new tokens it sees;
//   h += Wo o + bo; x = rmsnorm(h) * ln2; h += Wd (silu(Wg x) * (Wu x)); after the last
//   layer, hidden = rmsnorm(h) * norm and logits = Wlm hidden + blm.
// New token i sees the new token j when j <= i (a chain) or where the [T, T] mask says so
// (a tree). Attention splits the positions into fixed chunks shared out between the threads
// (each chunk keeps its own running maximum, sum and output per token and head), and every
// thread merges the chunks' parts after a barrier. Each new token's arithmetic is its own:
// a pass of T tokens computes token i's values bit for bit as a one-token step would.

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>
#include <vector>

#include "qdot.h"
#include "vec.h"

namespace {

using namespace specd;

// Pointers of one layer's weights, in this order (biases may be null).
enum { LN1, WQ, BQ, WK, BK, WV, BV, WO, BO, LN2, WG, WU, WD, PER_LAYER };

constexpr int64_t MAX_T = 16;  // new tokens a step takes

// How a weight matrix is stored (the codes specd/forward/block_formats.py gives its
// formats): rows of K floats, or rows of blocks as GGUF files keep them (K / 32 blocks of
// 32 values, or K / 256 super-blocks of 256 for the K-quants). A format walks a row in units
// of N values (a block, or a K-quant's sub-block of 32): `unit` decodes unit b of a row into
// V vectors, `ahead` is where in the row unit b's bytes lie (for prefetching), and every
// GROUP units the walker has `header` unpack what the next GROUP share (a K-quant
// super-block's scales) into the row's Header, which `unit` reads. Each format
// decodes into floats exactly (the value a float32 copy of the weight holds), so a product
// sums the same terms in the same order whatever the storage, and a quantized step equals
// the float32 step on the de-quantized weights bit for bit.
enum Format { F32 = 0, Q4_0 = 1, Q4_1 = 2, Q8_0 = 3, BF16 = 4, Q5_0 = 5, Q5_1 = 6, Q4_K = 7, Q5_K = 8, Q6_K = 9, Q4X16 = 10, Q8X16 = 11 };

// A format of blocks of F::N values, F::BYTES each: unit b is block b; no header.
template <class F>
struct Blocks {
    struct Header {};
    static constexpr int GROUP = 1;
    static int64_t row_bytes(int64_t K) { return K / F::N * F::BYTES; }
    static const uint8_t* ahead(const uint8_t* row, int64_t b) { return row + b * F::BYTES; }
    static void header(const uint8_t*, Header*) {}
    static void unit(const uint8_t* row, int64_t b, V16* w, const Header&) { F::decode(row + b * F::BYTES, w); }
};

// A K-quant: super-blocks of 256 values, F::BYTES each, in eight sub-blocks of 32; unit b is
// sub-block b % 8 of super-block b / 8, its scales unpacked into the Header once a
// super-block (a streaming Q4_K product 1.29x faster than at each sub-block).
template <class F>
struct SuperBlocks {
    static constexpr int N = 32, V = 2, GROUP = 8;
    struct Header {
        float scale[16], low[8];
    };
    static int64_t row_bytes(int64_t K) { return K / 256 * F::BYTES; }
    static const uint8_t* ahead(const uint8_t* row, int64_t b) { return row + b * F::BYTES / 8; }
    static void unit(const uint8_t* row, int64_t b, V16* w, const Header& h) {
        F::decode(row + (b >> 3) * F::BYTES, (int)(b & 7), w, h);
    }
};

struct F32Rows : Blocks<F32Rows> {  // 16 floats a block
    static constexpr int N = 16, V = 1;
    static constexpr int64_t BYTES = 64;
    static void decode(const uint8_t* blk, V16* w) { w[0] = vload((const float*)blk); }
};
struct Q4_0Rows : Blocks<Q4_0Rows> {  // half d, 16 bytes of nibbles q: d * (q - 8)
    static constexpr int N = 32, V = 2;
    static constexpr int64_t BYTES = 18;
    static void decode(const uint8_t* blk, V16* w) {
        uint16_t h;
        memcpy(&h, blk, 2);
        const V16 d = vset1(half_to_float(h)), eight = vset1(8.0f);
        vload_u4_map(blk + 2, [&](V16 q) { return vmul(d, vsub(q, eight)); }, &w[0], &w[1]);
    }
};
struct Q4_1Rows : Blocks<Q4_1Rows> {  // half d, half m, 16 bytes of nibbles q: d * q + m
    static constexpr int N = 32, V = 2;
    static constexpr int64_t BYTES = 20;
    static void decode(const uint8_t* blk, V16* w) {
        V16 d, m;
        vset1_halves(blk, &d, &m);
        // d * q is exact: one rounding, as d * q + m
        vload_u4_map(blk + 4, [&](V16 q) { return vfma(d, q, m); }, &w[0], &w[1]);
    }
};
struct Q8_0Rows : Blocks<Q8_0Rows> {  // half d, 32 signed bytes q: d * q
    static constexpr int N = 32, V = 2;
    static constexpr int64_t BYTES = 34;
    static void decode(const uint8_t* blk, V16* w) {
        uint16_t h;
        memcpy(&h, blk, 2);
        const V16 d = vset1(half_to_float(h));
        w[0] = vmul(d, vload_i8((const int8_t*)blk + 2));
        w[1] = vmul(d, vload_i8((const int8_t*)blk + 18));
    }
};
struct BF16Rows : Blocks<BF16Rows> {  // 32 bfloat16 values
    static constexpr int N = 32, V = 2;
    static constexpr int64_t BYTES = 64;
    static void decode(const uint8_t* blk, V16* w) {
        w[0] = vload_bf16((const uint16_t*)blk);
        w[1] = vload_bf16((const uint16_t*)blk + 16);
    }
};
struct Q5_0Rows : Blocks<Q5_0Rows> {  // half d, 32 high bits, 16 bytes of nibbles: d * (q - 16)
    static constexpr int N = 32, V = 2;
    static constexpr int64_t BYTES = 22;
    static void decode(const uint8_t* blk, V16* w) {
        uint16_t h;
        uint32_t qh;
        memcpy(&h, blk, 2);
        memcpy(&qh, blk + 2, 4);
        // d * (q - 16), not d * q - 16 d: equal but for the sign of a zero
        const V16 d = vset1(half_to_float(h)), sixteen = vset1(16.0f);
        vload_u5_map(blk + 6, qh, [&](V16 q) { return vmul(d, vsub(q, sixteen)); }, &w[0], &w[1]);
    }
};
struct Q5_1Rows : Blocks<Q5_1Rows> {  // half d, half m, 32 high bits, 16 bytes: d * q + m
    static constexpr int N = 32, V = 2;
    static constexpr int64_t BYTES = 24;
    static void decode(const uint8_t* blk, V16* w) {
        uint32_t qh;
        memcpy(&qh, blk + 4, 4);
        V16 d, m;
        vset1_halves(blk, &d, &m);
        // d * q exact (a table lookup measured 6% slower here than converting each value)
        w[0] = vfma(d, vload_q_bits(blk + 8, 0, qh & 0xFFFFu), m);
        w[1] = vfma(d, vload_q_bits(blk + 8, 4, qh >> 16), m);
    }
};
// Sub-block j's 6-bit scale and min of a Q4_K or Q5_K super-block (eight pairs in 12 bytes:
// the low six bits of bytes 0-7 for sub-blocks 0-3, bytes 8-11 and the top two bits of bytes
// 0-7 for sub-blocks 4-7).
inline void scale_min(const uint8_t* q, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
// Q4_K and Q5_K: half d, half dmin, 12 bytes of scales, [Q5_K: 32 bytes of fifth bits], 128
// bytes of nibbles. Sub-block s's value is (d * sc) * q - dmin * m; d * sc and dmin * m are
// exact (11 by 6 bits) and so is (d * sc) * q, so the value rounds once, in the subtraction.
// Its nibbles are the low (s even) or high (s odd) halves of bytes 32 (s / 2) ..; its fifth
// bits, bit s of the 32 bytes.
template <class F>
struct KQuant : SuperBlocks<F> {
    using Header = typename SuperBlocks<F>::Header;
    static void header(const uint8_t* sb, Header* h) {  // d * sc and -(dmin * m) of each sub-block
        uint16_t dd[2];
        memcpy(dd, sb, 4);
        const float d = half_to_float(dd[0]), dmin = half_to_float(dd[1]);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min(sb + 4, j, &sc, &m);
            h->scale[j] = d * (float)sc;
            h->low[j] = -(dmin * (float)m);
        }
    }
    static void decode(const uint8_t* sb, int s, V16* w, const Header& h) {
        const V16 d1 = vset1(h.scale[s]), m1 = vset1(h.low[s]);
        const uint8_t* qs = sb + (F::FIVE ? 48 : 16) + 32 * (s >> 1);
        for (int v = 0; v < 2; v++)  // (d * sc) * q exact: one rounding, as the subtraction
            w[v] = vfma(d1, vload_q(qs + 16 * v, 4 * (s & 1), sb + 16 + 16 * v, s, F::FIVE ? 1 : 0), m1);
    }
};
struct Q4_KRows : KQuant<Q4_KRows> {
    static constexpr int64_t BYTES = 144;
    static constexpr bool FIVE = false;
};
struct Q5_KRows : KQuant<Q5_KRows> {
    static constexpr int64_t BYTES = 176;
    static constexpr bool FIVE = true;
};
// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 signed 8-bit scales, half d;
// a value is (d * sc) * (q - 32), exact to the product (11 by 8 by 6 bits). In each half h
// of 128 values, sub-block t (0-3) takes nibbles of bytes 64 h + 32 (t % 2) .. (low for
// t < 2), bits 2 t, 2 t + 1 of bytes 128 + 32 h .., and scales 8 h + 2 t (its first 16
// values) and 8 h + 2 t + 1.
struct Q6_KRows : SuperBlocks<Q6_KRows> {
    static constexpr int64_t BYTES = 210;
    static void header(const uint8_t* sb, Header* h) {  // d * sc of each 16 values
        uint16_t dd;
        memcpy(&dd, sb + 208, 2);
        const float d = half_to_float(dd);
        for (int j = 0; j < 16; j++) h->scale[j] = d * (float)(int8_t)sb[192 + j];
    }
    static void decode(const uint8_t* sb, int s, V16* w, const Header& h) {
        const int half = s >> 2, t = s & 3;
        const uint8_t* ql = sb + 64 * half + 32 * (t & 1);
        const uint8_t* qh = sb + 128 + 32 * half;
        for (int v = 0; v < 2; v++) {  // (d * sc) * (q - 32): a zero keeps the sign of d * sc
            const V16 q = vload_q(ql + 16 * v, 4 * (t >> 1), qh + 16 * v, 2 * t, 3, 32);
            w[v] = vmul(vset1(h.scale[8 * half + 2 * t + v]), q);
        }
    }
};

// Calls f with the format `code` names (F32 for an unknown code, which the callers never pass).
template <class Fn>
inline void with_format(int32_t code, Fn f) {
    switch (code) {
        case Q4_0: f(Q4_0Rows{}); break;
        case Q4_1: f(Q4_1Rows{}); break;
        case Q8_0: f(Q8_0Rows{}); break;
        case BF16: f(BF16Rows{}); break;
        case Q5_0: f(Q5_0Rows{}); break;
        case Q5_1: f(Q5_1Rows{}); break;
        case Q4_K: f(Q4_KRows{}); break;
        case Q5_K: f(Q5_KRows{}); break;
        case Q6_K: f(Q6_KRows{}); break;
        default: f(F32Rows{}); break;
    }
}

// Bytes of a block format's weight prefetched ahead of the unit being decoded.
constexpr int64_t PREFETCH_AHEAD = 4096;

// The prefetches of a block of R rows at w while it decodes unit b. A format whose unit is a
// cache line or more (float32, bfloat16) asks for the next block of rows' unit b: a line a
// row a unit, each once. Units of blocks are smaller (18-34 bytes): there the lines
// PREFETCH_AHEAD bytes on in one linear stream are asked for, each once (a thread's rows lie
// one after another, and the R rows' block advances through them by R units a step). On the
// EPYC, two threads over 270 MB of 612-byte rows: the linear stream reads 33 GB/s, as fast
// as a sequential sum; a prefetch a row into the next block of rows 19 GB/s (the same in the
// order the units are decoded, each line once), the hardware's prefetcher alone 17; the LM
// head's Q8_0 product 1.7x faster, the one-token step 1.10-1.17x. The linear stream made the
// float32 passes of 4 and 8 tokens 10-15% slower, and those keep the per-row prefetch. A
// prefetch never faults, past the weight's end included.
template <class F, int R>
inline void prefetch_ahead(const uint8_t* w, int64_t rb, int64_t b) {
    if constexpr ((F::GROUP > 1 ? F::BYTES / F::GROUP : F::BYTES) >= 64) {  // bytes a unit
        for (int a = 0; a < R; a++) specd::prefetch(F::ahead(w + (R + a) * rb, b));
    } else {
        const uintptr_t from = (uintptr_t)(w + PREFETCH_AHEAD + R * (F::ahead(w, b) - w));
        const uintptr_t to = (uintptr_t)(w + PREFETCH_AHEAD + R * (F::ahead(w, b + 1) - w));
        for (uintptr_t line = (from + 63) & ~(uintptr_t)63; line < to; line += 64)
            specd::prefetch((const void*)line);
    }
}

// Woven weights, for int8 products (specd/forward/interleave.py weaves them): rows 16 g ..
// 16 g + 15 and values 32 b .. 32 b + 31 of a matrix together, at (g * K / 32 + b) * BYTES.
// Q4X16 (Q4_0 or Q4_1 rows): qdot.h's 256 bytes of nibbles q, then the 16 rows' d and m as
// halves; row l's value is d[l] * q + m[l] (a Q4_0 block's m is -8 d). Q8X16 (Q8_0 rows):
// qdot.h's 512 bytes of q + 128, then the 16 d; row l's value is d[l] * q. A product
// multiplies them with each token's activations rounded to int8, a scale a block of 32, as
// llama.cpp's quantized products do: per block and row, (d * sum(q * xq)) * dx, plus m *
// (the sum of the block's activations) for Q4X16. Each token's arithmetic is its own,
// whatever the tokens beside it.
inline float half_at(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return half_to_float(h);
}

struct WovenQ4 {
    static constexpr int64_t BYTES = 320;
    template <int NT>
    static void dots(const uint8_t* p, const int8_t* const* xs, const int32_t*, V16* out) {
        u4x16_dots<NT>(p, xs, out);
    }
    static V16 scale(const uint8_t* p) { return vload_halves(p + 256); }
    static V16 low(const uint8_t* p) { return vload_halves(p + 288); }
    static constexpr bool LOW = true;  // an offset m
    // value j of row l, as a float32 copy holds it: d * q + m, one rounding
    static float value(const uint8_t* p, int l, int j) {
        const uint8_t q = p[64 * (j % 16 / 4) + 4 * l + j % 4];
        return fmaf(half_at(p + 256 + 2 * l), (float)(j < 16 ? q & 15 : q >> 4), half_at(p + 288 + 2 * l));
    }
};
struct WovenQ8 {
    static constexpr int64_t BYTES = 544;
    template <int NT>
    static void dots(const uint8_t* p, const int8_t* const* xs, const int32_t* xsums, V16* out) {
        u8x16_dots<NT>(p, xs, xsums, out);
    }
    static V16 scale(const uint8_t* p) { return vload_halves(p + 512); }
    static V16 low(const uint8_t*) { return vzero(); }
    static constexpr bool LOW = false;
    static float value(const uint8_t* p, int l, int j) {  // d * q, exact
        return half_at(p + 512 + 2 * l) * (float)((int)p[64 * (j / 4) + 4 * l + j % 4] - 128);
    }
};

// T tokens' activations as int8: token i's block b of 32 values at q + i * K + 32 b, rounded
// to the nearest of 255 steps of its largest magnitude / 127 (d), the float sum of each block
// (s) and the sum of its int8 values (n).
struct Acts {
    const int8_t* q;
    const float* d;
    const float* s;
    const int32_t* n;
    int64_t K, nb;
};

// Tokens [i0, i1) of x quantized into q (T x K), d, s and n (T x nb), as Acts describes.
inline void quantize_tokens(const float* x, int64_t ldx, int64_t i0, int64_t i1, int64_t K, int8_t* q, float* d,
                            float* s, int32_t* n) {
    const int64_t nb = K / 32;
    for (int64_t i = i0; i < i1; i++)
        for (int64_t b = 0; b < nb; b++) {
            const float* xb = x + i * ldx + 32 * b;
            int8_t* qb = q + i * K + 32 * b;
            const V16 v0 = vload(xb), v1 = vload(xb + 16);
            const float top = vhmax(vmax(vmax(v0, vsub(vzero(), v0)), vmax(v1, vsub(vzero(), v1))));
            const V16 inv = vset1(top > 0.0f ? 127.0f / top : 0.0f);
            const int32_t sum = vstore_i8(qb, vmul(v0, inv)) + vstore_i8(qb + 16, vmul(v1, inv));
            d[i * nb + b] = top / 127.0f;
            s[i * nb + b] = vhsum(vadd(v0, v1));
            n[i * nb + b] = sum;
        }
}

// Buffers for T tokens' quantized activations, grown and kept by the thread that owns them.
struct ActsBuffer {
    std::vector<int8_t> q;
    std::vector<float> f;
    std::vector<int32_t> n;
    Acts at(int64_t T, int64_t K) {
        const int64_t nb = K / 32;
        if ((int64_t)q.size() < T * K) q.resize(T * K);
        if ((int64_t)f.size() < 2 * T * nb) f.resize(2 * T * nb);
        if ((int64_t)n.size() < T * nb) n.resize(T * nb);
        return Acts{q.data(), f.data(), f.data() + T * nb, n.data(), K, nb};
    }
};

inline Acts quantize(const float* x, int64_t ldx, int64_t T, int64_t K) {
    static thread_local ActsBuffer buf;  // per thread: products run on every thread
    const Acts a = buf.at(T, K);
    quantize_tokens(x, ldx, 0, T, K, (int8_t*)a.q, (float*)a.d, (float*)a.s, (int32_t*)a.n);
    return a;
}

// acc[i] = rows 16 g .. 16 g + 15 of the woven weight at G (group g's blocks) . token i0 + i,
// for NT tokens; with `fetch`, the weight's next bytes prefetched on the way.
template <class F, int NT>
inline void woven_group(const uint8_t* G, const Acts& a, int64_t i0, V16* acc, bool fetch) {
    for (int i = 0; i < NT; i++) acc[i] = vzero();
    const uint8_t* p = G;
    for (int64_t b = 0; b < a.nb; b++, p += F::BYTES) {
        if (fetch)
            for (int64_t c = 0; c < F::BYTES; c += 64) specd::prefetch(p + PREFETCH_AHEAD + c);
        const int8_t* xs[NT];
        int32_t xsums[NT];
        for (int i = 0; i < NT; i++) {
            xs[i] = a.q + (i0 + i) * a.K + 32 * b;
            xsums[i] = a.n[(i0 + i) * a.nb + b];
        }
        V16 sums[NT];
        F::template dots<NT>(p, xs, xsums, sums);
        const V16 d = F::scale(p), m = F::low(p);
        for (int i = 0; i < NT; i++) {
            const int64_t t = (i0 + i) * a.nb + b;
            acc[i] = vfma(vmul(sums[i], d), vset1(a.d[t]), acc[i]);
            if (F::LOW) acc[i] = vfma(m, vset1(a.s[t]), acc[i]);
        }
    }
}

// f(std::integral_constant<int, n>) for 1 <= n <= N.
template <int N, class Fn>
inline void with_count(int64_t n, Fn f) {
    if (n == N) f(std::integral_constant<int, N>{});
    else if constexpr (N > 1) with_count<N - 1>(n, f);
}

#if defined(SPECD_ISA_AVX2)
constexpr bool HALVES = true;
// AVX2's registers hold a woven group's sums for four tokens only eight rows at a time: rows
// 8 h .. 8 h + 7 of group G (Q4 or Q8, as F says) times tokens i0 .. i0 + NT - 1, over every
// block, into y[i * ldy + r] (r < 8). Each lane computes what woven_group's does, in the same
// order; with `fetch`, the weight's next bytes prefetched on the way. Not inlined: inlined
// into its callers, the compiler's register allocation spilled the sums (1.3x slower).
template <class F, int NT>
__attribute__((noinline)) void woven_half(const uint8_t* G, const Acts& a, int64_t i0, int h, float* y, int64_t ldy,
                                          bool fetch) {
    constexpr bool Q8 = std::is_same<F, WovenQ8>::value;
    const float *const ad = a.d + i0 * a.nb, *const as = a.s + i0 * a.nb;  // no reloads in the loop
    const int64_t K = a.K, nb = a.nb;
    (void)as;
    __m256 acc[NT];
    for (int i = 0; i < NT; i++) acc[i] = _mm256_setzero_ps();
    const uint8_t* p = G;
    for (int64_t b = 0; b < nb; b++, p += F::BYTES) {
        if (fetch)
            for (int64_t c = 0; c < F::BYTES; c += 64) specd::prefetch(p + PREFETCH_AHEAD + c);
        const int8_t* xs[NT];
        for (int i = 0; i < NT; i++) xs[i] = a.q + (i0 + i) * K + 32 * b;
        __m256i s[NT];
        if constexpr (Q8) {
            int32_t xsums[NT];
            for (int i = 0; i < NT; i++) xsums[i] = a.n[(i0 + i) * nb + b];
            u8x8_sums<NT>(p, h, xs, xsums, s);
        } else {
            u4x8_sums<NT>(p, h, xs, s);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + (Q8 ? 512 : 256) + 16 * h)));
        for (int i = 0; i < NT; i++)
            acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s[i]), d), _mm256_set1_ps(ad[i * nb + b]), acc[i]);
        if constexpr (!Q8) {
            const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 288 + 16 * h)));
            for (int i = 0; i < NT; i++) acc[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(as[i * nb + b]), acc[i]);
        }
    }
    for (int i = 0; i < NT; i++) _mm256_storeu_ps(y + i * ldy, acc[i]);
}
#else
constexpr bool HALVES = false;  // the other instruction sets' registers hold whole groups
template <class F, int NT>
void woven_half(const uint8_t*, const Acts&, int64_t, int, float*, int64_t, bool) {}
#endif

// Tokens are taken this many at a time over every group of rows: their activations stay in
// L2 while the groups' weights pass through L1 (a prefill's thousand tokens would not).
constexpr int64_t TOKEN_TILE = 64;

// y[i * ldy + r] = W[r] . token i for rows [r0, r1) of a woven weight and the T tokens of a.
template <class F>
inline void woven_rows(const uint8_t* W, const Acts& a, int64_t T, int64_t r0, int64_t r1, float* y,
                       int64_t ldy) {
    for (int64_t t0 = 0; t0 < T; t0 += TOKEN_TILE) {
        const int64_t t1 = T - t0 < TOKEN_TILE ? T : t0 + TOKEN_TILE;
        for (int64_t g = r0 / 16; 16 * g < r1; g++) {
            const uint8_t* G = W + g * a.nb * F::BYTES;
            const int64_t lo = (r0 > 16 * g ? r0 : 16 * g) - 16 * g, hi = (r1 < 16 * g + 16 ? r1 : 16 * g + 16) - 16 * g;
            const bool whole = lo == 0 && hi == 16;
            // AVX2, three tokens or more (one or two stream the weight from memory: the halves'
            // two passes over each group measured no faster there than one over both)
            const bool halves = HALVES && t1 - t0 > 2;
            if (halves && whole) {  // each half of the rows for every token of the tile in turn
                for (int h = 0; h < 2; h++)
                    for (int64_t i0 = t0; i0 < t1; i0 += QDOT_TOKENS)
                        with_count<QDOT_TOKENS>(t1 - i0 < QDOT_TOKENS ? t1 - i0 : QDOT_TOKENS, [&](auto NT) {
                            woven_half<F, decltype(NT)::value>(G, a, i0, h, y + i0 * ldy + 16 * g + 8 * h, ldy,
                                                               i0 == 0 && h == 0);
                        });
                continue;
            }
            for (int64_t i0 = t0; i0 < t1; i0 += QDOT_TOKENS) {
                const int64_t n = t1 - i0 < QDOT_TOKENS ? t1 - i0 : QDOT_TOKENS;
                alignas(64) float part[QDOT_TOKENS][16];  // a group cut by the rows asked for
                float* out = whole ? y + i0 * ldy + 16 * g : &part[0][0];
                const int64_t ld = whole ? ldy : 16;
                if (halves) {
                    with_count<QDOT_TOKENS>(n, [&](auto NT) {
                        for (int h = 0; h < 2; h++) woven_half<F, decltype(NT)::value>(G, a, i0, h, out + 8 * h, ld, false);
                    });
                } else {
                    V16 acc[QDOT_TOKENS];
                    with_count<QDOT_TOKENS>(n, [&](auto NT) { woven_group<F, decltype(NT)::value>(G, a, i0, acc, i0 == 0); });
                    for (int64_t i = 0; i < n; i++) vstore(out + i * ld, acc[i]);
                }
                if (!whole)
                    for (int64_t i = 0; i < n; i++)
                        for (int64_t l = lo; l < hi; l++) y[(i0 + i) * ldy + 16 * g + l] = part[i][l];
            }
        }
    }
}

// The same for float activations x [T, ldx], quantized here on this thread.
template <class F>
inline void woven_rows(const uint8_t* W, int64_t K, const float* x, int64_t ldx, int64_t T,
                       int64_t r0, int64_t r1, float* y, int64_t ldy) {
    if (r0 >= r1) return;
    woven_rows<F>(W, quantize(x, ldx, T, K), T, r0, r1, y, ldy);
}

// y[i * ldy + r] = W[r] . x[i * ldx ..] for rows r in [r0, r0 + R) and NT tokens i: each
// block of the R rows decoded once, multiplied with every token while in registers; with
// `fetch`, the weight's next bytes prefetched on the way.
template <class F, int R, int NT>
inline void block(const uint8_t* W, int64_t K, const float* x, int64_t ldx, int64_t r0, float* y,
                  int64_t ldy, bool fetch) {
    const int64_t rb = F::row_bytes(K);
    V16 acc[R][NT];
    for (int a = 0; a < R; a++)
        for (int i = 0; i < NT; i++) acc[a][i] = vzero();
    const uint8_t* w = W + r0 * rb;
    typename F::Header head[R];
    for (int64_t b = 0, k = 0; k < K; b++, k += F::N) {
        if (F::GROUP > 1 && b % F::GROUP == 0)  // a K-quant's scales, once a super-block
            for (int a = 0; a < R; a++) F::header(w + a * rb + b / F::GROUP * F::BYTES, &head[a]);
        if (fetch) prefetch_ahead<F, R>(w, rb, b);
        V16 wv[R][F::V];
        for (int a = 0; a < R; a++) F::unit(w + a * rb, b, wv[a], head[a]);
        for (int i = 0; i < NT; i++)
            for (int v = 0; v < F::V; v++) {
                const V16 xv = vload(x + i * ldx + k + 16 * v);
                for (int a = 0; a < R; a++) acc[a][i] = vfma(wv[a][v], xv, acc[a][i]);
            }
    }
    for (int a = 0; a < R; a++)
        for (int i = 0; i < NT; i++) y[i * ldy + r0 + a] = vhsum(acc[a][i]);
}

// NT tokens at a time (the rows' block stays in L1 between the groups, so only the first
// group prefetches), the last few with a smaller block.
template <class F, int R, int NT = STEP_TOKENS>
inline void block_tokens(const uint8_t* W, int64_t K, const float* x, int64_t ldx, int64_t T,
                         int64_t r0, float* y, int64_t ldy, bool fetch = true) {
    int64_t i = 0;
    for (; i + NT <= T; i += NT)
        block<F, R, NT>(W, K, x + i * ldx, ldx, r0, y + i * ldy, ldy, fetch && i == 0);
    if constexpr (NT > 1)
        if (i < T)
            block_tokens<F, R, NT - 1>(W, K, x + i * ldx, ldx, T - i, r0, y + i * ldy, ldy, fetch && i == 0);
}

template <class F>
inline void rows_of(const uint8_t* W, int64_t K, const float* x, int64_t ldx, int64_t T,
                    int64_t r0, int64_t r1, float* y, int64_t ldy) {
    int64_t r = r0;
    constexpr int R = F::GROUP > 1 ? K_QUANT_ROWS : STEP_ROWS;
    for (; r + R <= r1; r += R)
        block_tokens<F, R>(W, K, x, ldx, T, r, y, ldy);
    for (; r < r1; r++) block_tokens<F, 1>(W, K, x, ldx, T, r, y, ldy);
}

// A weight matrix: its storage and where it starts.
struct Weight {
    const void* p;
    int32_t format;
};

// y[i * ldy + r] = W[r] . x[i * ldx ..] (+ b[r]) for rows [r0, r1) of W [*, K] and tokens
// i < T; K a multiple of 16 (of 32 for a block format, of 256 for a K-quant).
inline void rows(Weight W, const float* b, int64_t K, const float* x, int64_t ldx, int64_t T,
                 int64_t r0, int64_t r1, float* y, int64_t ldy) {
    const uint8_t* p = (const uint8_t*)W.p;
    if (W.format == Q4X16)
        woven_rows<WovenQ4>(p, K, x, ldx, T, r0, r1, y, ldy);
    else if (W.format == Q8X16)
        woven_rows<WovenQ8>(p, K, x, ldx, T, r0, r1, y, ldy);
    else
        with_format(W.format, [&](auto fmt) { rows_of<decltype(fmt)>(p, K, x, ldx, T, r0, r1, y, ldy); });
    if (b != nullptr)
        for (int64_t i = 0; i < T; i++)
            for (int64_t r = r0; r < r1; r++) y[i * ldy + r] += b[r];
}

// This thread's share [lo, hi) of a product's n rows, cut at multiples of 16 (a woven group
// stays on one thread).
inline void share_rows(int64_t n, int t, int nt, int64_t* lo, int64_t* hi) {
    *lo = t == 0 ? 0 : n * t / nt / 16 * 16;
    *hi = t + 1 == nt ? n : n * (t + 1) / nt / 16 * 16;
}

// out = x / sqrt(mean(x^2) + eps) * w, for x [n], n a multiple of 16.
inline void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out) {
    V16 acc = vzero();
    for (int64_t i = 0; i < n; i += 16) {
        const V16 v = vload(x + i);
        acc = vfma(v, v, acc);
    }
    const V16 s = vset1(1.0f / sqrtf(vhsum(acc) / (float)n + eps));
    for (int64_t i = 0; i < n; i += 16) vstore(out + i, vmul(vload(w + i), vmul(vload(x + i), s)));
}

// x * cos + rotate_half(x) * sin for each of `heads` heads of size D.
inline void rotary(const float* x, const float* cos, const float* sin, int64_t heads, int64_t D,
                   float* out) {
    const int64_t half = D / 2;
    for (int64_t h = 0; h < heads; h++) {
        const float* a = x + h * D;
        float* o = out + h * D;
        for (int64_t i = 0; i < half; i++) o[i] = a[i] * cos[i] - a[i + half] * sin[i];
        for (int64_t i = half; i < D; i++) o[i] = a[i] * cos[i] + a[i - half] * sin[i];
    }
}

// out[r] = silu(g[r]) * u[r] = g[r] / (1 + e^-g[r]) * u[r] for r in [lo, hi).
inline void silu_mul(const float* g, const float* u, int64_t lo, int64_t hi, float* out) {
    const V16 one = vset1(1.0f);
    auto f = [&](V16 gv, V16 uv) { return vmul(vdiv(gv, vadd(one, vexp(vsub(vzero(), gv)))), uv); };
    int64_t r = lo;
    for (; r + 16 <= hi; r += 16) vstore(out + r, f(vload(g + r), vload(u + r)));
    if (r < hi) vstore_n(out + r, f(vload_n(g + r, hi - r, 0.0f), vload_n(u + r, hi - r, 0.0f)), hi - r);
}

template <class KV>
inline float dot(const float* a, const KV* b, int64_t n) {  // b: floats, or a cache's halves
    V16 acc = vzero();
    for (int64_t i = 0; i < n; i += 16) acc = vfma(vload(a + i), vload_kv(b + i), acc);
    return vhsum(acc);
}

// The attention of one key/value head over a cache that stores its keys and values as KV:
// float (float32) or uint16_t (IEEE halves). A pass rounds its new tokens' keys and values
// to what the cache will hold before any token attends to them, so a new row reads the same
// from kn / vn as from the cache in a later step.
template <class KV>
struct Group {
    const float* q;  // rotated queries of the new tokens: token i, head h at q[i * q_t + h * D]
    int64_t q_t;
    int64_t g, rep, T, past, D;
    const KV* k;  // the cache's rows of this key/value head (stride D)
    const KV* v;
    const float* k_new;  // the new tokens' rotated keys and values: token i at [i * kv_t]
    const float* v_new;
    int64_t kv_t;
    const uint8_t* tree;  // [T, T] or null (a chain)
    float scale;
    // One node of a tree as the chain of its path: new position n is new token order[n]
    // (its ancestors and itself, in order), and the node sees the first `reach` of them.
    const int64_t* order = nullptr;
    int64_t reach = 0;
};

template <class KV>
inline bool sees(const Group<KV>& a, int64_t i, int64_t j) {
    if (j < a.past) return true;
    const int64_t n = j - a.past;
    if (a.order != nullptr) return n < a.reach;
    return a.tree == nullptr ? n <= i : a.tree[i * a.T + n] != 0;
}
// The row of new position n (of the path, for a node of a tree).
template <class KV>
inline int64_t new_row(const Group<KV>& a, int64_t n) { return a.order != nullptr ? a.order[n] : n; }

// Scores (scaled, -inf where unseen) of pairs [p0, p0 + NP) over positions [j0, j1) into
// s (row p at s + p * n), 64-wide heads: NP pairs by four keys at a time (vec.h's dots64x4).
constexpr int64_t D64 = 64;
template <int NP, class Query, class Key, class KV>
inline void score_block(const Group<KV>& a, const Query& query, const Key& key, int64_t j0, int64_t j1,
                        int64_t n, int64_t p0, float* s) {
    const float* qp[NP];
    int64_t token[NP];
    for (int x = 0; x < NP; x++) {
        qp[x] = query(p0 + x);
        token[x] = (p0 + x) / a.rep;
    }
    alignas(64) float out[4 * SCORE_PAIRS > 16 ? 4 * SCORE_PAIRS : 16];  // dots64x4 stores 4 NP (16 at least)
    // four cached keys at a time, every one seen
    const int64_t cached = a.past < j1 ? a.past : j1;
    int64_t j = j0;
    for (; j + 4 <= cached; j += 4) {
        const KV* kp[4] = {a.k + j * D64, a.k + (j + 1) * D64, a.k + (j + 2) * D64, a.k + (j + 3) * D64};
        if (PREFETCH_VALUES)  // the same rows' values, read once the chunk's scores are done
            for (int y = 0; y < 4; y++)
                for (int64_t b = 0; b < D64 * (int64_t)sizeof(KV); b += 64)
                    specd::prefetch((const char*)(a.v + (j + y) * D64) + b);
        dots64x4<NP>(qp, kp, a.scale, out);
        for (int x = 0; x < NP; x++) memcpy(s + (p0 + x) * n + (j - j0), out + 4 * x, 4 * sizeof(float));
    }
    for (; j < j1; j += 4) {
        // past the range's end, the last key again (its scores are not kept): every score is
        // summed the same way wherever the range ends
        const int64_t last = j1 - 1;
        alignas(64) float rows[4][D64];  // cached rows of halves, as floats
        const float* kp[4] = {key(j, rows[0]), key(j + 1 < last ? j + 1 : last, rows[1]),
                              key(j + 2 < last ? j + 2 : last, rows[2]), key(j + 3 < last ? j + 3 : last, rows[3])};
        dots64x4<NP>(qp, kp, a.scale, out);
        const int64_t keys = j1 - j < 4 ? j1 - j : 4;
        for (int x = 0; x < NP; x++) {
            float* row = s + (p0 + x) * n + (j - j0);
            for (int y = 0; y < keys; y++)
                row[y] = j + y < a.past || sees(a, token[x], j + y) ? out[x * 4 + y] : -INFINITY;
        }
    }
}

// o[x][c, c + 16 CV) = sum over j in [j0, j1), in that order, of sr[x][j - j0] * value row j's
// columns [c, c + 16 CV): R score rows by CV vectors of columns, every sum in a register and
// each value row read once for the R rows. Two plain loops (the cache's rows, then the new
// ones) in a function of its own: a pointer chosen per row, or the tile inlined into
// attend_group, sent every sum to the stack and back at each row (8 tokens' attention over 1k
// positions ~1.1x slower on a Zen 3, the stores the hottest instructions).
template <int R, int CV, class KV>
__attribute__((noinline)) void value_tile(const Group<KV>& a, const float* const* sr, int64_t j0, int64_t j1, int64_t c,
                                          float* const* o) {
    V16 acc[R][CV];
    for (int x = 0; x < R; x++)
        for (int y = 0; y < CV; y++) acc[x][y] = vzero();
    const int64_t cached = a.past < j1 ? a.past : j1;
    const KV* val = a.v + j0 * a.D + c;
    int64_t j = j0;
    for (; j < cached; j++, val += a.D) {
        V16 vv[CV];
        for (int y = 0; y < CV; y++) vv[y] = vload_kv(val + 16 * y);
        for (int x = 0; x < R; x++) {
            const V16 pr = vset1(sr[x][j - j0]);
            for (int y = 0; y < CV; y++) acc[x][y] = vfma(pr, vv[y], acc[x][y]);
        }
    }
    for (; j < j1; j++) {  // the new rows (a tree's in the order of its path)
        const float* nv = a.v_new + new_row(a, j - a.past) * a.kv_t + c;
        V16 vv[CV];
        for (int y = 0; y < CV; y++) vv[y] = vload(nv + 16 * y);
        for (int x = 0; x < R; x++) {
            const V16 pr = vset1(sr[x][j - j0]);
            for (int y = 0; y < CV; y++) acc[x][y] = vfma(pr, vv[y], acc[x][y]);
        }
    }
    for (int x = 0; x < R; x++)
        for (int y = 0; y < CV; y++) vstore(o[x] + c + 16 * y, acc[x][y]);
}

// The attention of the group's rep query heads of every new token over positions
// [j0, j1): per (head r, token i) the running maximum m, sum l and unnormalised output o
// [D], at part + (i * Hq + g * rep + r) * (D + 2). Each key and value row is read once for
// the whole group. s: scratch of rep * T * (j1 - j0) floats.
template <class KV>
void attend_group(const Group<KV>& a, int64_t Hq, int64_t j0, int64_t j1, float* s, float* part) {
    const int64_t n = j1 - j0 > 0 ? j1 - j0 : 0, D = a.D, pairs = a.rep * a.T;
    auto out = [&](int64_t p) {  // pair p = i * rep + r
        return part + ((p / a.rep) * Hq + a.g * a.rep + p % a.rep) * (D + 2);
    };
    for (int64_t p = 0; p < pairs; p++) {
        float* o = out(p);
        o[0] = -INFINITY;
        o[1] = 0.0f;
        for (int64_t d = 0; d < D; d++) o[2 + d] = 0.0f;
    }
    if (n == 0) return;
    // key row j as floats: a new one's, or a cached one's (converted into row, from halves)
    auto key = [&](int64_t j, float* row) -> const float* {
        if (j >= a.past) return a.k_new + new_row(a, j - a.past) * a.kv_t;
        if constexpr (std::is_same<KV, float>::value) {
            (void)row;
            return a.k + j * D;
        } else {
            for (int64_t d = 0; d < D; d += 16) vstore(row + d, vload_kv(a.k + j * D + d));
            return row;
        }
    };
    auto query = [&](int64_t p) { return a.q + (p / a.rep) * a.q_t + (a.g * a.rep + p % a.rep) * D; };
    int64_t done = 0;  // pairs scored in blocks
    if (D == 64) {
        // up to SCORE_PAIRS pairs by four keys at a time, each sum in the same order: a
        // pair's scores do not depend on the pairs and keys beside it
        for (; done < pairs; done += SCORE_PAIRS) {
            const int64_t np = pairs - done < SCORE_PAIRS ? pairs - done : SCORE_PAIRS;
            with_count<SCORE_PAIRS>(np, [&](auto NP) { score_block<decltype(NP)::value>(a, query, key, j0, j1, n, done, s); });
        }
    }
    for (int64_t j = j0; j < j1; j++)
        for (int64_t p = done; p < pairs; p++)
            s[p * n + j - j0] = !sees(a, p / a.rep, j) ? -INFINITY
                                : j >= a.past ? dot(query(p), a.k_new + new_row(a, j - a.past) * a.kv_t, D) * a.scale
                                              : dot(query(p), a.k + j * D, D) * a.scale;
    for (int64_t p = 0; p < pairs; p++) {
        float* sr = s + p * n;
        V16 top = vset1(-INFINITY);
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) top = vmax(top, vload(sr + i));
        if (i < n) top = vmax(top, vload_n(sr + i, n - i, -INFINITY));
        const float mx = vhmax(top);
        if (mx == -INFINITY) {  // this pair sees none of these positions
            for (i = 0; i < n; i++) sr[i] = 0.0f;
            continue;
        }
        const V16 mv = vset1(mx);
        V16 sum = vzero();
        for (i = 0; i + 16 <= n; i += 16) {
            const V16 e = vexp(vsub(vload(sr + i), mv));
            vstore(sr + i, e);
            sum = vadd(sum, e);
        }
        if (i < n) {  // lanes past the end: 0, whatever the exponential of -inf gives
            const V16 e = vselect(first_lanes(n - i), vexp(vsub(vload_n(sr + i, n - i, 0.0f), mv)), vzero());
            vstore_n(sr + i, e, n - i);
            sum = vadd(sum, e);
        }
        float* o = out(p);
        o[0] = mx;
        o[1] = vhsum(sum);
    }
    // outputs: each value row once per VALUE_ROWS pairs and 16 * TILE_VECS columns, the tile
    // in registers (value_tile)
    constexpr int W = 16 * TILE_VECS;
    for (int64_t p0 = 0; p0 < pairs; p0 += VALUE_ROWS) {
        const int64_t np = pairs - p0 < VALUE_ROWS ? pairs - p0 : VALUE_ROWS;
        with_count<VALUE_ROWS>(np, [&](auto NP) {
            constexpr int R = decltype(NP)::value;
            const float* sr[R];
            float* o[R];
            for (int x = 0; x < R; x++) {
                sr[x] = s + (p0 + x) * n;
                o[x] = out(p0 + x) + 2;
            }
            for (int64_t c = 0; c < D; c += W)
                with_count<TILE_VECS>(D - c < W ? (D - c) / 16 : TILE_VECS, [&](auto CV) {
                    value_tile<R, decltype(CV)::value>(a, sr, j0, j1, c, o);
                });
        });
    }
}

// Sizes of the parts of the work buffer.
struct Layout {
    int64_t shared, own, chunk;
};

// Positions a part of the attention covers: chunk c is [c * ATTN_CHUNK, (c + 1) * ATTN_CHUNK),
// the chunks shared out between the threads in runs, the parts merged in chunk order. A new token's attention
// sums the same positions in the same order whatever the pass around it (its length, the
// cache before it), as one token's step would: the tokens of plain decoding and of a verify
// pass come out alike, as they must where activations are rounded to int8 (a change in the
// last bit of one may move it a whole step).
constexpr int64_t ATTN_CHUNK = 128;

inline int64_t chunks_of(int64_t n) { return (n + ATTN_CHUNK - 1) / ATTN_CHUNK; }

// Whether thread t of nt takes item `item` of the attention: chunk item % chunks of key/value
// head item / chunks, the items in that order, each thread a run of them cut where the
// positions they cover reach its share: a chunk goes to the thread whose share holds its
// middle position. So each thread reads each of its heads' keys and values in one long stream
// (a one-token step over 1k positions 1.05-1.06x faster on the Zen 3 than with runs of chunks,
// every head in each), and the threads' positions differ by at most a chunk (cut where a
// chunk starts, 1k positions of three heads gave one thread 1,665 and the other 1,410). Which
// thread takes a chunk changes nothing in what it computes.
inline bool mine(int64_t item, int64_t chunks, int64_t n, int64_t heads, int t, int nt) {
    const int64_t c = item % chunks, start = c * ATTN_CHUNK, end = start + ATTN_CHUNK < n ? start + ATTN_CHUNK : n;
    const int64_t middle = item / chunks * n + (start + end) / 2;  // in positions over every head
    const int64_t total = heads * n;
    return middle >= total * t / nt && middle < total * (t + 1) / nt;
}

Layout layout(int64_t H, int64_t I, int64_t Hq, int64_t KV, int64_t D, int64_t T, int64_t past,
              int threads) {
    (void)threads;
    Layout l;
    l.shared = T * (H + (Hq + 2 * KV) * D + chunks_of(past + T) * Hq * (D + 2) + H + 3 * I);
    l.chunk = Hq / KV * T * (past + T < ATTN_CHUNK ? past + T : ATTN_CHUNK);  // scores of a chunk
    l.own = T * (H + Hq * D + 2 * KV * D + Hq * D) + l.chunk;
    return l;
}

}  // namespace

extern "C" {

int64_t specd_decode_step_max_tokens() { return MAX_T; }

// out [rows, K] = the float32 values of a weight stored as `format` (see Format), the
// exact values the step multiplies with: a prefill's products on a float copy, made once.
void specd_dequantize(const void* weight, int32_t format, int64_t rows, int64_t K, float* out,
                      int threads) {
    auto woven = [&](auto fmt) {  // row l of group g's block b, value j: F::value
        using F = decltype(fmt);
        const int64_t nb = K / 32;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t* p = (const uint8_t*)weight + ((r / 16) * nb + b) * F::BYTES;
                for (int j = 0; j < 32; j++) out[r * K + 32 * b + j] = F::value(p, (int)(r % 16), j);
            }
    };
    if (format == Q4X16 || format == Q8X16) {
        if (format == Q4X16)
            woven(WovenQ4{});
        else
            woven(WovenQ8{});
        return;
    }
    auto run = [&](auto fmt) {
        using F = decltype(fmt);
        const int64_t rb = F::row_bytes(K);
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t* row = (const uint8_t*)weight + r * rb;
            typename F::Header head;
            for (int64_t b = 0, k = 0; k < K; b++, k += F::N) {
                if (F::GROUP > 1 && b % F::GROUP == 0) F::header(row + b / F::GROUP * F::BYTES, &head);
                V16 w[F::V];
                F::unit(row, b, w, head);
                for (int v = 0; v < F::V; v++) vstore(out + r * K + k + 16 * v, w[v]);
            }
        }
    };
    with_format(format, run);
}

// y [T, N] = x [T, K] . W [N, K]^T (+ b [N]) for W stored as `format`: the step's own
// products (each row's blocks decoded once for all T tokens) for a drafter's small layers
// outside the step. The rows are split between the threads; K a multiple of 16 (of 32 for
// a block format, of 256 for a K-quant).
void specd_product(const void* weight, int32_t format, int64_t N, int64_t K, const float* x,
                   int64_t T, const float* b, float* y, int threads) {
    if (format == Q4X16 || format == Q8X16) {
        // the activations quantized once, each thread its share of the tokens, then shared
        static thread_local ActsBuffer buf;
        const Acts a = buf.at(T, K);
#pragma omp parallel num_threads(threads)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            quantize_tokens(x, K, T * t / nt, T * (t + 1) / nt, K, (int8_t*)a.q, (float*)a.d, (float*)a.s,
                            (int32_t*)a.n);
#pragma omp barrier
            int64_t lo, hi;
            share_rows(N, t, nt, &lo, &hi);
            if (lo < hi) {
                const uint8_t* p = (const uint8_t*)weight;
                if (format == Q4X16)
                    woven_rows<WovenQ4>(p, a, T, lo, hi, y, N);
                else
                    woven_rows<WovenQ8>(p, a, T, lo, hi, y, N);
                if (b != nullptr)
                    for (int64_t i = 0; i < T; i++)
                        for (int64_t r = lo; r < hi; r++) y[i * N + r] += b[r];
            }
        }
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        int64_t lo, hi;
        share_rows(N, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        rows(Weight{weight, format}, b, K, x, K, T, lo, hi, y, N);
    }
}

// The step's norm, rotary embedding and gated activation over many rows, on `threads`
// threads, for the lean forward's passes of many tokens (specd/forward/row_ops.py): one pass
// over the activations each, where PyTorch's operations made five to seven.
// out[i] = rmsnorm(x[i]) * w for T rows of H floats (H a multiple of 16).
void specd_rmsnorm(const float* x, const float* w, int64_t T, int64_t H, float eps, float* out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < T; i++) rmsnorm(x + i * H, w, H, eps, out + i * H);
}
// out[i] = x[i] rotated by row i of cos and sin [T, D], for T rows of `heads` heads of D floats.
void specd_rotary(const float* x, const float* cos, const float* sin, int64_t T, int64_t heads, int64_t D,
                  float* out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < T; i++) rotary(x + i * heads * D, cos + i * D, sin + i * D, heads, D, out + i * heads * D);
}
// out = silu(g) * u over n floats.
void specd_silu_mul(const float* g, const float* u, int64_t n, float* out, int threads) {
    constexpr int64_t PIECE = 4096;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t lo = 0; lo < n; lo += PIECE) silu_mul(g, u, lo, lo + PIECE < n ? lo + PIECE : n, out);
}

// The half -8 d of a half d, exactly; false where it overflows (or d is not finite).
inline bool minus_eight(uint16_t d, uint16_t* out) {
    const uint16_t sign = (uint16_t)((d ^ 0x8000u) & 0x8000u), e = (d >> 10) & 31, mant = d & 0x3FFu;
    if (e != 0) {  // normal: the exponent up by 3
        *out = (uint16_t)(sign | ((e + 3) << 10) | mant);
        return e + 3 < 31;
    }
    uint32_t v = (uint32_t)mant << 3;  // subnormal: mant * 2^-24 * 8, in units of 2^-24
    if (v < 1024) {
        *out = (uint16_t)(sign | v);
        return true;
    }
    int exp = 1;  // normalise: v * 2^-24 = (v / 2^(exp - 1)) * 2^(exp - 25), v in [1024, 2048)
    while (v >= 2048) {
        v >>= 1;  // exact: v = mant * 8 has three low zero bits
        exp++;
    }
    *out = (uint16_t)(sign | (exp << 10) | (v - 1024));
    return true;
}

// out = the woven copy (Q4X16 from Q4_0 or Q4_1 rows, Q8X16 from Q8_0 rows; see the
// formats) of `rows` rows of K values stored as `format` at `blocks`: ceil(rows / 16) groups,
// the rows past the last zeros. Returns 0, or -1 where a Q4_0 scale's -8 d overflows a half
// (the copy is then not usable).
int specd_weave(const void* blocks, int32_t format, int64_t rows, int64_t K, uint8_t* out,
                int threads) {
    const int64_t nb = K / 32, groups = (rows + 15) / 16;
    const int64_t bytes = format == Q8_0 ? WovenQ8::BYTES : WovenQ4::BYTES;
    const int64_t in = format == Q8_0 ? 34 : format == Q4_1 ? 20 : 18;
    int bad = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(| : bad)
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t* o = out + (g * nb + b) * bytes;
            memset(o, 0, bytes);
            for (int64_t l = 0; l < 16 && 16 * g + l < rows; l++) {
                const uint8_t* blk = (const uint8_t*)blocks + ((16 * g + l) * nb + b) * in;
                if (format == Q8_0) {
                    for (int k = 0; k < 8; k++)
                        for (int c = 0; c < 4; c++) o[64 * k + 4 * l + c] = blk[2 + 4 * k + c] ^ 0x80;
                    memcpy(o + 512 + 2 * l, blk, 2);
                    continue;
                }
                const uint8_t* qs = blk + (format == Q4_1 ? 4 : 2);
                for (int k = 0; k < 4; k++) memcpy(o + 64 * k + 4 * l, qs + 4 * k, 4);
                memcpy(o + 256 + 2 * l, blk, 2);
                if (format == Q4_1) {
                    memcpy(o + 288 + 2 * l, blk + 2, 2);
                } else {  // Q4_0: m = -8 d
                    uint16_t d;
                    memcpy(&d, blk, 2);
                    uint16_t m;
                    if (!minus_eight(d, &m)) bad = 1;
                    memcpy(o + 288 + 2 * l, &m, 2);
                }
            }
        }
    return bad ? -1 : 0;
}

// The instruction set this library was built for: "avx512", "avx2", "neon" or "scalar".
const char* specd_kernel_isa() { return specd::ISA; }

// out[i] = the IEEE half nearest x[i], as a half cache stores a key or value (the self-test's).
void specd_halves(const float* x, int64_t n, uint16_t* out) {
    for (int64_t i = 0; i < n; i++) out[i] = specd::float_to_half(x[i]);
}

// Floats of the `work` buffer specd_decode_step needs for T new tokens and `threads`
// threads at `past` cached positions.
int64_t specd_decode_step_work(int64_t H, int64_t I, int64_t Hq, int64_t KV, int64_t D, int64_t T,
                               int64_t past, int threads) {
    const Layout l = layout(H, I, Hq, KV, D, T, past, threads);
    return l.shared + threads * l.own;
}

// layers: L * PER_LAYER weight pointers (see the enum), formats: the Format of each (a norm's
// or a bias's is F32); caches: L * 4 values, the key and value buffers of the layer ([KV,
// capacity, D], rows of D contiguous) and the distance between their heads, in values;
// kv_half: whether those values are IEEE halves (else float32). A half cache holds each new
// key and value rounded to the nearest half (ties to even), and every new token attends to
// those rounded values, its own among them. x: the new tokens' embeddings [T, H]; cos, sin:
// [T, D] at their positions; past: positions already cached (the new tokens' keys and values go
// to positions past .. past + T - 1); tree: [T, T] bytes, nonzero where new token i sees
// new token j, or null for a chain. norm: the final norm's weight, or null for none (a
// drafter's head predicting the residual stream); lm [V, H] stored as lm_format, lm_b [V] or
// null. Writes logits [T, V] (unless logits is null) and hidden [T, H] (the final norm's
// output, or the residual stream without one). work:
// specd_decode_step_work floats. Sizes H, I, D multiples of 16 (of 32 where a product's
// input runs along blocks, of 256 along a K-quant's); Hq a multiple of KV; 1 <= T <= MAX_T.
void specd_decode_step(const void* const* layers, const int32_t* formats, int64_t L,
                       const int64_t* caches, int32_t kv_half, int64_t H, int64_t I, int64_t Hq, int64_t KV,
                       int64_t D, float eps, float scale, const float* x, const float* cos,
                       const float* sin, int64_t T, int64_t past, const uint8_t* tree,
                       const float* norm, const void* lm, int32_t lm_format, const float* lm_b,
                       int64_t V, float* logits, float* hidden, float* work, int threads) {
    const int64_t QD = Hq * D, KD = KV * D, rep = Hq / KV, QKV = QD + 2 * KD;
    const Layout lay = layout(H, I, Hq, KV, D, T, past, threads);
    float* h = work;  // the residual stream [T, H]
    float* qkv = h + T * H;  // [T, QKV]
    const int64_t chunks = chunks_of(past + T);
    float* part = qkv + T * QKV;  // per chunk of positions, token and head: m, l, o [D]
    float* mid = part + chunks * T * Hq * (D + 2);  // h after attention [T, H]
    float* gate = mid + T * H;  // [T, I]
    float* up = gate + T * I;  // [T, I]
    float* act = up + T * I;  // [T, I]
    float* own0 = act + T * I;
    memcpy(h, x, T * H * sizeof(float));
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        float* xn = own0 + t * lay.own;  // normed inputs [T, H]
        float* q = xn + T * H;  // rotated queries [T, QD]
        float* kn = q + T * QD;  // the new tokens' rotated keys [T, KD]
        float* vn = kn + T * KD;  // and values [T, KD]
        float* o = vn + T * KD;  // attention outputs [T, QD]
        float* s = o + T * QD;  // scores [chunk]
        int64_t lo, hi;
        for (int64_t layer = 0; layer < L; layer++) {
            const void* const* w = layers + layer * PER_LAYER;
            const int32_t* f = formats + layer * PER_LAYER;
            auto vec = [&](int i) { return (const float*)w[i]; };  // a norm or a bias
            auto mat = [&](int i) { return Weight{w[i], f[i]}; };
            void* const kc = (void*)caches[layer * 4];
            void* const vc = (void*)caches[layer * 4 + 1];
            const int64_t kh = caches[layer * 4 + 2], vh = caches[layer * 4 + 3];
            for (int64_t i = 0; i < T; i++) rmsnorm(h + i * H, vec(LN1), H, eps, xn + i * H);
            // q, k and v as one run of QKV rows, shared out
            share_rows(QKV, t, nt, &lo, &hi);
            if (lo < QD) rows(mat(WQ), vec(BQ), H, xn, H, T, lo, hi < QD ? hi : QD, qkv, QKV);
            if (hi > QD && lo < QD + KD) {
                const int64_t a = lo > QD ? lo - QD : 0, b = hi < QD + KD ? hi - QD : KD;
                rows(mat(WK), vec(BK), H, xn, H, T, a, b, qkv + QD, QKV);
            }
            if (hi > QD + KD) {
                const int64_t a = lo > QD + KD ? lo - QD - KD : 0, b = hi - QD - KD;
                rows(mat(WV), vec(BV), H, xn, H, T, a, b, qkv + QD + KD, QKV);
            }
#pragma omp barrier
            for (int64_t i = 0; i < T; i++) {
                const float* row = qkv + i * QKV;
                rotary(row, cos + i * D, sin + i * D, Hq, D, q + i * QD);
                rotary(row + QD, cos + i * D, sin + i * D, KV, D, kn + i * KD);
                memcpy(vn + i * KD, row + QD + KD, KD * sizeof(float));
            }
            if (kv_half)  // what the cache will hold, for every new token to attend to
                for (int64_t e = 0; e < T * KD; e++) {
                    kn[e] = half_to_float(float_to_half(kn[e]));
                    vn[e] = half_to_float(float_to_half(vn[e]));
                }
            if (t == 0)
                for (int64_t g = 0; g < KV; g++)
                    for (int64_t i = 0; i < T; i++) {
                        const float *kr = kn + i * KD + g * D, *vr = vn + i * KD + g * D;
                        const int64_t at_k = g * kh + (past + i) * D, at_v = g * vh + (past + i) * D;
                        if (kv_half) {
                            for (int64_t d = 0; d < D; d++) {
                                ((uint16_t*)kc)[at_k + d] = float_to_half(kr[d]);
                                ((uint16_t*)vc)[at_v + d] = float_to_half(vr[d]);
                            }
                        } else {
                            memcpy((float*)kc + at_k, kr, D * sizeof(float));
                            memcpy((float*)vc + at_v, vr, D * sizeof(float));
                        }
                    }
            // positions [0, past + T) in chunks (ATTN_CHUNK); the new ones read from kn, vn,
            // never the cache (thread 0 may be writing them), the cached ones as stored (KVT:
            // float or uint16_t)
            auto attend = [&](auto stored) {
                using KVT = decltype(stored);
                for (int64_t item = 0; item < KV * chunks; item++) {
                    if (!mine(item, chunks, past + T, KV, t, nt)) continue;
                    const int64_t g = item / chunks, c = item % chunks;
                    const int64_t j0 = c * ATTN_CHUNK, j1 = j0 + ATTN_CHUNK < past + T ? j0 + ATTN_CHUNK : past + T;
                    float* chunk = part + c * T * Hq * (D + 2);
                    const Group<KVT> grp{q, QD, g, rep, T, past, D, (const KVT*)kc + g * kh, (const KVT*)vc + g * vh,
                                         kn + g * D, vn + g * D, KD, tree, scale};
                    if (tree == nullptr || j1 <= past) {
                        attend_group(grp, Hq, j0, j1, s, chunk);
                        continue;
                    }
                    // a tree's new positions: each node over its path as the chain of one-token
                    // steps that decodes it would see them (its ancestors at the positions
                    // after the cache, in order), so a node's values do not depend on its
                    // siblings and cousins
                    for (int64_t i = 0; i < T; i++) {
                        int64_t order[MAX_T], reach = 0;
                        for (int64_t n = 0; n < T; n++)
                            if (tree[i * T + n]) order[reach++] = n;
                        Group<KVT> node = grp;
                        node.q = q + i * QD;
                        node.T = 1;
                        node.tree = nullptr;
                        node.order = order;
                        node.reach = reach;
                        const int64_t end = past + reach < j1 ? past + reach : j1;
                        attend_group(node, Hq, j0, end > j0 ? end : j0, s, chunk + i * Hq * (D + 2));
                    }
                }
            };
            if (kv_half) attend(uint16_t{});
            else attend(float{});
#pragma omp barrier
            // every thread merges the chunks' parts, in order, into its own copy of the outputs
            for (int64_t ih = 0; ih < T * Hq; ih++) {
                float top = -INFINITY;
                for (int64_t u = 0; u < chunks; u++) {
                    const float mu = part[(u * T * Hq + ih) * (D + 2)];
                    top = mu > top ? mu : top;
                }
                float total = 0.0f;
                float* out = o + ih * D;  // token ih / Hq, head ih % Hq
                for (int64_t d = 0; d < D; d++) out[d] = 0.0f;
                for (int64_t u = 0; u < chunks; u++) {
                    const float* p = part + (u * T * Hq + ih) * (D + 2);
                    if (p[1] == 0.0f) continue;  // none of its positions seen
                    const float f = expf(p[0] - top);
                    total += p[1] * f;
                    for (int64_t d = 0; d < D; d++) out[d] += p[2 + d] * f;
                }
                const float inv = 1.0f / total;
                for (int64_t d = 0; d < D; d++) out[d] *= inv;
            }
            share_rows(H, t, nt, &lo, &hi);
            rows(mat(WO), vec(BO), QD, o, QD, T, lo, hi, mid, H);
            for (int64_t i = 0; i < T; i++)
                for (int64_t r = lo; r < hi; r++) mid[i * H + r] += h[i * H + r];
#pragma omp barrier
            for (int64_t i = 0; i < T; i++) rmsnorm(mid + i * H, vec(LN2), H, eps, xn + i * H);
            share_rows(I, t, nt, &lo, &hi);
            rows(mat(WG), nullptr, H, xn, H, T, lo, hi, gate, I);
            rows(mat(WU), nullptr, H, xn, H, T, lo, hi, up, I);
            for (int64_t i = 0; i < T; i++) silu_mul(gate + i * I, up + i * I, lo, hi, act + i * I);
#pragma omp barrier
            share_rows(H, t, nt, &lo, &hi);
            rows(mat(WD), nullptr, I, act, I, T, lo, hi, h, H);
            for (int64_t i = 0; i < T; i++)
                for (int64_t r = lo; r < hi; r++) h[i * H + r] += mid[i * H + r];
#pragma omp barrier
        }
        const float* fin = h;  // no final norm: the residual stream itself (an EAGLE head's)
        if (norm != nullptr) {
            for (int64_t i = 0; i < T; i++) rmsnorm(h + i * H, norm, H, eps, xn + i * H);
            fin = xn;
        }
        if (t == 0) memcpy(hidden, fin, T * H * sizeof(float));
        if (logits != nullptr) {  // none for a prefill's passes: nobody reads them
            share_rows(V, t, nt, &lo, &hi);
            rows(Weight{lm, lm_format}, lm_b, H, fin, H, T, lo, hi, logits, V);
        }
    }
}

}  // extern "C"
