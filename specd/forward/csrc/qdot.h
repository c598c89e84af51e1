// Integer products of 4-bit weights with 8-bit activations, per instruction set (the
// companion of vec.h; the same SPECD_ISA_* defines).
//
// The weights come as a block of 16 rows by 32 values of 4-bit integers (0..15) in 256 bytes:
// chunk k (k < 4) is 64 bytes, four a row: byte c of row l at 64 k + 4 l + c, whose low
// nibble is the row's value 4 k + c and high nibble its value 16 + 4 k + c (ggml's Q4 layout,
// sixteen rows woven together). `u4x16_dot` multiplies such a block with one token's 32
// int8 activations and gives the 16 rows' sums as floats, exactly (|sum| <= 32 * 15 * 127 <
// 2^24), in one instruction per 64 products where the CPU has an int8 dot product
// (AVX-512 VNNI, AVX-VNNI, ARMv8.2's dot product), else in two or three.
//
// A block of 16 rows by 32 signed 8-bit integers comes in 512 bytes the same way (chunk k < 8
// of 64 bytes, four a row: byte c of row l at 64 k + 4 l + c is its value 4 k + c), each
// stored plus 128 (its bits xor 0x80: an unsigned byte, what VNNI's dot product takes);
// `u8x16_dot` gives the rows' sums of the signed values times the activations, exactly
// (given the activations' own sum: sum((q + 128) x) - 128 sum(x)).
//
// The sums are integers, so every build gives the same ones; what a product does with them
// afterwards (vec.h's lane-wise float arithmetic, no sum across lanes) is the same on every
// build too.

#pragma once

#include "vec.h"

namespace specd {

// One token's activations for the block it multiplies: 32 int8 values, four a word, in order
// (word(x, j): values 4 j .. 4 j + 3).
#if defined(SPECD_ISA_AVX512)
// Read where they lie: each word is broadcast from memory, a load the dot product takes as its
// operand. Copied into general registers first, each word cost a shift and a register-to-vector
// broadcast beside each dot product, on the ports the dot products use.
struct Q8x32 {
    const int8_t* p;
};
inline Q8x32 q8x32(const int8_t* p) { return {p}; }
inline int32_t word(const Q8x32& x, int j) {
    int32_t w;
    memcpy(&w, x.p + 4 * j, 4);
    return w;
}
#else
struct Q8x32 {
    int32_t w[8];
};
inline Q8x32 q8x32(const int8_t* p) {
    Q8x32 x;
    memcpy(x.w, p, 32);
    return x;
}
inline int32_t word(const Q8x32& x, int j) { return x.w[j]; }
#endif

#if defined(SPECD_ISA_AVX512)

constexpr int QDOT_TOKENS = 8;  // tokens a product's block of weights serves at once

// The block unpacked to bytes once, for every token it multiplies (eight registers).
struct U4x16 {
    __m512i w[8];  // w[k]: chunk k's low nibbles, w[4 + k] its high nibbles
};
inline void u4x16_load(const uint8_t* p, U4x16* u) {
    const __m512i low4 = _mm512_set1_epi8(15);
    for (int k = 0; k < 4; k++) {
        const __m512i v = _mm512_loadu_si512(p + 64 * k);
        u->w[k] = _mm512_and_si512(v, low4);
        u->w[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    }
}
inline V16 u4x16_dot(const U4x16& u, const Q8x32& x) {
#if defined(__AVX512VNNI__)
    // two chains, so consecutive dot products need not wait on each other
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int j = 0; j < 8; j += 2) {
        s0 = _mm512_dpbusd_epi32(s0, u.w[j], _mm512_set1_epi32(word(x, j)));
        s1 = _mm512_dpbusd_epi32(s1, u.w[j + 1], _mm512_set1_epi32(word(x, j + 1)));
    }
    return {_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1))};
#else
    // pairs of products in 16 bits, summed there (|8 * 2 * 15 * 127| < 2^15), then in 32
    __m512i s = _mm512_setzero_si512();
    for (int j = 0; j < 8; j++)
        s = _mm512_add_epi16(s, _mm512_maddubs_epi16(u.w[j], _mm512_set1_epi32(word(x, j))));
    return {_mm512_cvtepi32_ps(_mm512_madd_epi16(s, _mm512_set1_epi16(1)))};
#endif
}
// A block of signed bytes (stored plus 128), loaded once for every token.
struct U8x16 {
    __m512i w[8];
};
inline void u8x16_load(const uint8_t* p, U8x16* u) {
    for (int k = 0; k < 8; k++) u->w[k] = _mm512_loadu_si512(p + 64 * k);
}
inline V16 u8x16_dot(const U8x16& u, const Q8x32& x, int32_t xsum) {
#if defined(__AVX512VNNI__)
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int j = 0; j < 8; j += 2) {
        s0 = _mm512_dpbusd_epi32(s0, u.w[j], _mm512_set1_epi32(word(x, j)));
        s1 = _mm512_dpbusd_epi32(s1, u.w[j + 1], _mm512_set1_epi32(word(x, j + 1)));
    }
    const __m512i s = _mm512_add_epi32(s0, s1);
#else
    // the low seven bits and the top bit apart: pairs of products fit 16 bits
    const __m512i ones = _mm512_set1_epi16(1), low7 = _mm512_set1_epi8(127);
    __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
    for (int j = 0; j < 8; j++) {
        const __m512i xj = _mm512_set1_epi32(word(x, j));
        lo = _mm512_add_epi32(lo, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_and_si512(u.w[j], low7), xj), ones));
        const __m512i top = _mm512_and_si512(_mm512_srli_epi16(u.w[j], 7), _mm512_set1_epi8(1));
        hi = _mm512_add_epi32(hi, _mm512_madd_epi16(_mm512_maddubs_epi16(top, xj), ones));
    }
    const __m512i s = _mm512_add_epi32(lo, _mm512_slli_epi32(hi, 7));
#endif
    return {_mm512_cvtepi32_ps(_mm512_sub_epi32(s, _mm512_set1_epi32(128 * xsum)))};
}
// a's 16 lanes rounded to the nearest integer (ties to even) and stored as int8 (within
// +-127 by the caller's scale); returns their sum, from the registers (summed from memory,
// the bytes just stored were read back before their stores could forward them).
inline int32_t vstore_i8(int8_t* p, V16 a) {
    const __m128i b = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(a.v));
    _mm_storeu_si128((__m128i*)p, b);
    return _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(b));
}

#elif defined(SPECD_ISA_AVX2)

constexpr int QDOT_TOKENS = 4;  // tokens a product's block of weights serves at once

// Sixteen registers hold neither a whole unpacked block nor eight tokens' sums beside it, so
// the products go by quarters of a block: 32 bytes of nibbles (eight rows' values 4 k .. 4 k
// + 3 and 16 + 4 k .. 19 + 4 k) are unpacked once and multiplied with each token's
// activations, broadcast from memory (a load, no arithmetic), into the token's 16-bit sums:
// per token and block 16 multiplies and 16 adds, the unpacking shared.
#define SPECD_QDOT_BATCHED 1

inline __m256i x4_at(const int8_t* x, int k) {  // activations 4 k .. 4 k + 3 in every word
    int32_t w;
    memcpy(&w, x + 4 * k, 4);
    return _mm256_set1_epi32(w);
}

// s[i]: half h (rows 8 h .. 8 h + 7) of the Q4 block at p times token i's 32 activations
// xs[i], the rows' integer sums in 32-bit lanes.
template <int NT>
inline void u4x8_sums(const uint8_t* p, int h, const int8_t* const* xs, __m256i* s) {
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int i = 0; i < NT; i++) s[i] = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(p + 64 * k + 32 * h));
        const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        for (int i = 0; i < NT; i++) {
#if defined(__AVXVNNI__)
            s[i] = _mm256_dpbusd_avx_epi32(s[i], lo, x4_at(xs[i], k));
            s[i] = _mm256_dpbusd_avx_epi32(s[i], hi, x4_at(xs[i], 4 + k));
#else
            // pairs of products in 16 bits, summed there (|8 * 2 * 15 * 127| < 2^15)
            s[i] = _mm256_add_epi16(s[i], _mm256_maddubs_epi16(lo, x4_at(xs[i], k)));
            s[i] = _mm256_add_epi16(s[i], _mm256_maddubs_epi16(hi, x4_at(xs[i], 4 + k)));
#endif
            // each sum kept in its register: left free, the compiler regroups four tokens'
            // adds into trees of products waiting on the stack (one or two tokens' steps,
            // bound by memory, measured 3% slower held)
            if constexpr (NT > 2) __asm__("" : "+x"(s[i]));
        }
    }
#if !defined(__AVXVNNI__)
    for (int i = 0; i < NT; i++) s[i] = _mm256_madd_epi16(s[i], _mm256_set1_epi16(1));
#endif
}
// s[i]: half h of the block of signed bytes (stored plus 128) at p times token i's
// activations xs[i], whose own sum is xsums[i].
template <int NT>
inline void u8x8_sums(const uint8_t* p, int h, const int8_t* const* xs, const int32_t* xsums, __m256i* s) {
    for (int i = 0; i < NT; i++) s[i] = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        const __m256i u = _mm256_loadu_si256((const __m256i*)(p + 64 * k + 32 * h));
#if defined(__AVXVNNI__)
        for (int i = 0; i < NT; i++) s[i] = _mm256_dpbusd_avx_epi32(s[i], u, x4_at(xs[i], k));
#else
        // the signed values back (xor 0x80), then |q| times x with q's sign: a pair of such
        // products fits 16 bits (2 * 128 * 127 < 2^15), each pair summed in 32
        const __m256i q = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80)), a = _mm256_abs_epi8(q);
        for (int i = 0; i < NT; i++) {
            const __m256i pairs = _mm256_maddubs_epi16(a, _mm256_sign_epi8(x4_at(xs[i], k), q));
            s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
        }
#endif
        if constexpr (NT > 2)
            for (int i = 0; i < NT; i++) __asm__("" : "+x"(s[i]));
    }
#if defined(__AVXVNNI__)
    for (int i = 0; i < NT; i++) s[i] = _mm256_sub_epi32(s[i], _mm256_set1_epi32(128 * xsums[i]));
#else
    (void)xsums;
#endif
}
// out[i]: the block at p times token i's 32 activations xs[i], the 16 rows' sums as floats.
template <int NT>
inline void u4x16_dots(const uint8_t* p, const int8_t* const* xs, V16* out) {
    for (int h = 0; h < 2; h++) {  // rows 0-7, then 8-15
        __m256i s[NT];
        u4x8_sums<NT>(p, h, xs, s);
        for (int i = 0; i < NT; i++) (h ? out[i].hi : out[i].lo) = _mm256_cvtepi32_ps(s[i]);
    }
}
// out[i]: the block of signed bytes (stored plus 128) at p times token i's activations xs[i],
// whose own sum is xsums[i].
template <int NT>
inline void u8x16_dots(const uint8_t* p, const int8_t* const* xs, const int32_t* xsums, V16* out) {
    for (int h = 0; h < 2; h++) {
        __m256i s[NT];
        u8x8_sums<NT>(p, h, xs, xsums, s);
        for (int i = 0; i < NT; i++) (h ? out[i].hi : out[i].lo) = _mm256_cvtepi32_ps(s[i]);
    }
}
inline int32_t vstore_i8(int8_t* p, V16 a) {
    // packs work within 128-bit lanes: words 0-3, 8-11, 4-7, 12-15, put back in order
    const __m256i w = _mm256_packs_epi32(_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi));
    const __m128i b = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128((__m128i*)p, _mm_shuffle_epi32(b, _MM_SHUFFLE(3, 1, 2, 0)));
    // the sum: each half's bytes plus 128 summed by sad, less the 16 times 128 added
    const __m128i sad = _mm_sad_epu8(_mm_xor_si128(b, _mm_set1_epi8((char)0x80)), _mm_setzero_si128());
    return _mm_cvtsi128_si32(sad) + _mm_extract_epi16(sad, 4) - 16 * 128;
}

#elif defined(SPECD_ISA_NEON)

constexpr int QDOT_TOKENS = 4;

struct U4x16 {
    const uint8_t* p;
};
inline void u4x16_load(const uint8_t* p, U4x16* u) { u->p = p; }
// acc + the four-byte dot products of a and b (a's values 0..15, read as signed).
inline int32x4_t dot4(int32x4_t acc, uint8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, vreinterpretq_s8_u8(a), b);
#else
    const int8x16_t s = vreinterpretq_s8_u8(a);
    const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(s), vget_low_s8(b)));
    const int32x4_t hi = vpaddlq_s16(vmull_high_s8(s, b));
    return vaddq_s32(acc, vpaddq_s32(lo, hi));
#endif
}
inline V16 u4x16_dot(const U4x16& u, const Q8x32& x) {
    int32x4_t s[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    for (int k = 0; k < 4; k++) {
        const int8x16_t xl = vreinterpretq_s8_s32(vdupq_n_s32(word(x, k)));
        const int8x16_t xh = vreinterpretq_s8_s32(vdupq_n_s32(word(x, 4 + k)));
        for (int i = 0; i < 4; i++) {  // rows 4 i .. 4 i + 3
            const uint8x16_t v = vld1q_u8(u.p + 64 * k + 16 * i);
            s[i] = dot4(s[i], vandq_u8(v, vdupq_n_u8(15)), xl);
            s[i] = dot4(s[i], vshrq_n_u8(v, 4), xh);
        }
    }
    return {{vcvtq_f32_s32(s[0]), vcvtq_f32_s32(s[1]), vcvtq_f32_s32(s[2]), vcvtq_f32_s32(s[3])}};
}
struct U8x16 {
    const uint8_t* p;
};
inline void u8x16_load(const uint8_t* p, U8x16* u) { u->p = p; }
// acc + the four-byte dot products of signed a and b.
inline int32x4_t dot4_s8(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    const int32x4_t hi = vpaddlq_s16(vmull_high_s8(a, b));
    return vaddq_s32(acc, vpaddq_s32(lo, hi));
#endif
}
inline V16 u8x16_dot(const U8x16& u, const Q8x32& x, int32_t xsum) {
    (void)xsum;  // the signed values themselves (the stored byte xor 0x80)
    int32x4_t s[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    for (int k = 0; k < 8; k++) {
        const int8x16_t xk = vreinterpretq_s8_s32(vdupq_n_s32(word(x, k)));
        for (int i = 0; i < 4; i++) {
            const uint8x16_t v = veorq_u8(vld1q_u8(u.p + 64 * k + 16 * i), vdupq_n_u8(0x80));
            s[i] = dot4_s8(s[i], vreinterpretq_s8_u8(v), xk);
        }
    }
    return {{vcvtq_f32_s32(s[0]), vcvtq_f32_s32(s[1]), vcvtq_f32_s32(s[2]), vcvtq_f32_s32(s[3])}};
}
inline int32_t vstore_i8(int8_t* p, V16 a) {
    const int16x8_t lo = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(a.q[0])), vqmovn_s32(vcvtnq_s32_f32(a.q[1])));
    const int16x8_t hi = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(a.q[2])), vqmovn_s32(vcvtnq_s32_f32(a.q[3])));
    const int8x16_t b = vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi));
    vst1q_s8(p, b);
    return vaddlvq_s8(b);
}

#else  // SPECD_ISA_SCALAR

constexpr int QDOT_TOKENS = 4;

struct U4x16 {
    const uint8_t* p;
};
inline void u4x16_load(const uint8_t* p, U4x16* u) { u->p = p; }
inline V16 u4x16_dot(const U4x16& u, const Q8x32& x) {
    int8_t q[32];
    memcpy(q, x.w, 32);
    V16 r;
    for (int l = 0; l < 16; l++) {
        int32_t s = 0;
        for (int k = 0; k < 4; k++)
            for (int c = 0; c < 4; c++) {
                const uint8_t b = u.p[64 * k + 4 * l + c];
                s += (b & 15) * q[4 * k + c] + (b >> 4) * q[16 + 4 * k + c];
            }
        r.f[l] = (float)s;
    }
    return r;
}
struct U8x16 {
    const uint8_t* p;
};
inline void u8x16_load(const uint8_t* p, U8x16* u) { u->p = p; }
inline V16 u8x16_dot(const U8x16& u, const Q8x32& x, int32_t xsum) {
    (void)xsum;
    int8_t q[32];
    memcpy(q, x.w, 32);
    V16 r;
    for (int l = 0; l < 16; l++) {
        int32_t s = 0;
        for (int k = 0; k < 8; k++)
            for (int c = 0; c < 4; c++) s += ((int32_t)u.p[64 * k + 4 * l + c] - 128) * q[4 * k + c];
        r.f[l] = (float)s;
    }
    return r;
}
inline int32_t vstore_i8(int8_t* p, V16 a) {
    int32_t sum = 0;
    for (int i = 0; i < 16; i++) {
        const float v = nearbyintf(a.f[i]);  // the default rounding: ties to even
        p[i] = (int8_t)(v > 127.0f ? 127.0f : v < -128.0f ? -128.0f : v);
        sum += p[i];
    }
    return sum;
}

#endif

// 16 halves at p (a woven block's scales) as floats.
inline V16 vload_halves(const uint8_t* p) { return vload_kv((const uint16_t*)p); }

#if !defined(SPECD_QDOT_BATCHED)
// out[i]: the block at p times token i's 32 activations xs[i] (the block unpacked once).
template <int NT>
inline void u4x16_dots(const uint8_t* p, const int8_t* const* xs, V16* out) {
    U4x16 u;
    u4x16_load(p, &u);
    for (int i = 0; i < NT; i++) out[i] = u4x16_dot(u, q8x32(xs[i]));
}
// out[i]: the block of signed bytes at p times token i's activations xs[i], whose sum is xsums[i].
template <int NT>
inline void u8x16_dots(const uint8_t* p, const int8_t* const* xs, const int32_t* xsums, V16* out) {
    U8x16 u;
    u8x16_load(p, &u);
    for (int i = 0; i < NT; i++) out[i] = u8x16_dot(u, q8x32(xs[i]), xsums[i]);
}
#endif

}  // namespace specd
