// The vector layer of specd's CPU kernels: one 16-float vector type, V16, and the handful of
// operations the kernels use, for each instruction set the kernels are built for. The build
// defines one of
//
//   SPECD_ISA_AVX512  x86-64 with AVX-512 F/BW/DQ/VL: one __m512
//   SPECD_ISA_AVX2    x86-64 with AVX2 and FMA: two __m256
//   SPECD_ISA_NEON    ARM64 (NEON is part of every AArch64 CPU): four float32x4_t
//   SPECD_ISA_SCALAR  any CPU: sixteen floats and plain loops (a reference, and a last resort)
//
// so the kernels' arithmetic is written once. Each variant also says how to block the
// kernels' loops for its registers (AVX-512 has 32 of 16 floats, AVX2 16 of 8, NEON 32 of 4):
// the rows and tokens of a product's register block, the query rows and the vectors of
// columns of an attention tile.
//
// Sums across lanes (hsum, sum16) add in an order of their own per instruction set: results
// differ between builds by float32 rounding, never more.

#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(SPECD_ISA_AVX512) || defined(SPECD_ISA_AVX2)
#include <immintrin.h>
#elif defined(SPECD_ISA_NEON)
#include <arm_neon.h>
#elif !defined(SPECD_ISA_SCALAR)
#error "define one of SPECD_ISA_AVX512, SPECD_ISA_AVX2, SPECD_ISA_NEON, SPECD_ISA_SCALAR"
#endif

namespace specd {

// Lanes [0, n) of a 16-lane mask, 0 <= n <= 16.
inline unsigned first_lanes(int64_t n) { return n >= 16 ? 0xFFFFu : (1u << n) - 1u; }

// An IEEE half's value as a float (exact: every half is a float). A quantized block's
// scales are halves: one instruction where the CPU converts them (x86-64's F16C, ARM64),
// else from the bits.
inline float half_from_bits(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    uint32_t bits;
    if (e == 0) {  // zero or subnormal: m * 2^-24, exact in a float
        const float f = (float)m * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (e == 31) {
        bits = sign | 0x7F800000u | (m << 13);  // infinity or NaN
    } else {
        bits = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#elif defined(__aarch64__)
    __fp16 x;
    memcpy(&x, &h, 2);
    return (float)x;
#else
    return half_from_bits(h);
#endif
}
// The IEEE half nearest f (ties to even; beyond the largest half, infinity), from the bits.
inline uint16_t half_bits_of(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7FFFFFFFu;
    if (x > 0x7F800000u) return sign | 0x7E00u;  // NaN
    if (x >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and up round to infinity
    if (x < 0x38800000u) {  // below 2^-14: a subnormal half, f * 2^24 (exact) to an integer
        float a;
        memcpy(&a, &x, 4);
        return sign | (uint16_t)nearbyintf(a * 16777216.0f);  // 1024 is the least normal's bits
    }
    // 13 mantissa bits dropped, rounding to nearest, ties to even; a carry moves the exponent
    return sign | (uint16_t)((x + 0xFFFu + ((x >> 13) & 1u) - 0x38000000u) >> 13);
}
// f as a half: one instruction where the CPU converts them.
inline uint16_t float_to_half(float f) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#elif defined(__aarch64__)
    const __fp16 h = (__fp16)f;
    uint16_t bits;
    memcpy(&bits, &h, 2);
    return bits;
#else
    return half_bits_of(f);
#endif
}

#if defined(SPECD_ISA_AVX512) || defined(SPECD_ISA_AVX2)
// What both x86-64 builds share, in 128-bit registers.
// The two halves at p as floats, into out[0] and out[1] (one conversion).
inline void halves_to(const uint8_t* p, float* out) {
    int32_t bits;
    memcpy(&bits, p, 4);
    _mm_storel_pi((__m64*)out, _mm_cvtph_ps(_mm_cvtsi32_si128(bits)));
}
// 16 small unsigned integers packed in bytes: value i is (lo[i] >> ls) & 15, plus
// ((hi[i] >> hs) & hm) << 4 where hm is not 0 (GGUF's 4-, 5- and 6-bit values; a shift
// may vary at run time), put together in bytes (16-bit shifts: a byte's bits that cross
// into its neighbour are masked off) for vload_q to widen once.
inline __m128i q_bytes(const uint8_t* lo, int ls, const uint8_t* hi, int hs, int hm) {
    __m128i q = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i*)lo), _mm_cvtsi32_si128(ls)),
                              _mm_set1_epi8(15));
    if (hm != 0) {
        const __m128i h = _mm_srl_epi16(_mm_loadu_si128((const __m128i*)hi), _mm_cvtsi32_si128(hs));
        q = _mm_or_si128(q, _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi8((char)hm)), 4));
    }
    return q;
}

// Attention scores by NP queries of 64 floats and four keys at a time (NP <= SCORE_PAIRS):
// out[4 x + y] = scale * q[x] . k[y], each in one eight-lane register over the row's eight
// slices in order, then across its lanes by a tree of horizontal adds, whatever NP. Both
// builds: 256-bit sums cost AVX-512 no multiply-adds (a Zen 4 splits a 512-bit one in two)
// and a quarter of the shuffles and adds of summing 16-lane ones across their lanes.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
template <int NP, class KV>
inline void dots64x4(const float* const* q, const KV* const* k, float scale, float* out) {
    __m256 acc[4 * NP];
    for (int i = 0; i < 4 * NP; i++) acc[i] = _mm256_setzero_ps();
    for (int c = 0; c < 64; c += 8) {
        __m256 kv[4];
        for (int y = 0; y < 4; y++) kv[y] = load8(k[y] + c);
        for (int x = 0; x < NP; x++)
            for (int y = 0; y < 4; y++) acc[4 * x + y] = _mm256_fmadd_ps(_mm256_loadu_ps(q[x] + c), kv[y], acc[4 * x + y]);
    }
    // lane i of hadd(hadd(a, b), hadd(c, d)) plus lane i + 4 is the sum of the i-th
    // register's lanes
    for (int i = 0; i < NP; i++) {
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[4 * i], acc[4 * i + 1]), _mm256_hadd_ps(acc[4 * i + 2], acc[4 * i + 3]));
        const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(out + 4 * i, _mm_mul_ps(sum, _mm_set1_ps(scale)));
    }
}
#define SPECD_DOTS64 1
#endif

#if defined(SPECD_ISA_AVX512)

constexpr const char* ISA = "avx512";
constexpr int STEP_ROWS = 4, STEP_TOKENS = 4;  // 16 accumulators, 4 weights, 1 input: 21 of 32
constexpr int K_QUANT_ROWS = STEP_ROWS;          // a K-quant's register block
constexpr int TILE_ROWS = 4, TILE_VECS = 4;    // 16 accumulators, 4 keys or values

struct V16 {
    __m512 v;
};
inline V16 vzero() { return {_mm512_setzero_ps()}; }
inline V16 vset1(float x) { return {_mm512_set1_ps(x)}; }
inline V16 vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V16 vload_kv(const uint16_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p))}; }
inline void vstore(float* p, V16 a) { _mm512_storeu_ps(p, a.v); }
inline V16 vadd(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V16 vsub(V16 a, V16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V16 vmul(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V16 vdiv(V16 a, V16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V16 vmax(V16 a, V16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V16 vfma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }  // a * b + c
inline float vhsum(V16 a) { return _mm512_reduce_add_ps(a.v); }
inline float vhmax(V16 a) { return _mm512_reduce_max_ps(a.v); }
// Lanes whose bit is set in m from a, the others from b.
inline V16 vselect(unsigned m, V16 a, V16 b) { return {_mm512_mask_blend_ps((__mmask16)m, b.v, a.v)}; }
// The first n lanes from p (0 <= n <= 16), the others `fill`; never reads past p + n.
inline V16 vload_n(const float* p, int64_t n, float fill) {
    return {_mm512_mask_loadu_ps(_mm512_set1_ps(fill), (__mmask16)first_lanes(n), p)};
}
inline void vstore_n(float* p, V16 a, int64_t n) {
    _mm512_mask_storeu_ps(p, (__mmask16)first_lanes(n), a.v);
}
inline void prefetch(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T0); }
// The two half scales at p (a Q4_1 or Q5_1 block's d and m) as floats in all 16 lanes each:
// converted together, then broadcast from memory, a load, where a broadcast from a register
// takes the shuffle unit the block lookups need (products of those 1.06-1.16x faster on this
// build and AVX2's; a block of one scale gained nothing, and keeps vset1).
inline V16 vbroadcast(const float* p) {
    __m512 r;
    __asm__("vbroadcastss %1, %0" : "=v"(r) : "m"(*p));
    return {r};
}
inline void vset1_halves(const uint8_t* p, V16* a, V16* b) {
    alignas(8) float f[2];
    halves_to(p, f);
    *a = vbroadcast(&f[0]);
    *b = vbroadcast(&f[1]);
}

// e^x for 16 lanes: 2^n * p(r), r = x - n ln 2 in [-ln2/2, ln2/2], p of degree 7 (about 1
// ulp); lanes far below -87 give 0, as expf does.
inline V16 vexp(V16 a) {
    const __m512 x = _mm512_max_ps(a.v, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return {_mm512_scalef_ps(p, n)};
}

// Attention: six queries by four keys (dots64x4: 24 sums and four keys of the 32 registers),
// the values by tiles of six rows and four vectors (24 sums, four value vectors, a score).
// Whole passes of the default model over 1k cached positions on a Zen 4 (two threads,
// scripts/step_kernel.py --against, both ways round), against 16-lane sums by four queries
// and tiles of four rows: two to eight new tokens 0.92-0.98x as long, one alike; asking for
// the value rows ahead of use measured no faster.
constexpr int SCORE_PAIRS = 6;
constexpr int VALUE_ROWS = 6;
constexpr bool PREFETCH_VALUES = false;

// Quantized weights, decoded to floats (exactly: small integers and bfloat16 are floats).
// The 16 bytes at p as 32 four-bit values: byte j's low nibble is value j, its high nibble
// value j + 16 (ggml's Q4 layout).
inline void vload_u4(const uint8_t* p, V16* lo, V16* hi) {
    // one widening (the shuffle port's work) for both halves
    const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
    lo->v = _mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(15)));
    hi->v = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
}
// f of the same 32 values, for an f that maps each lane on its own (a block's scale and
// offset): the 16 values a nibble can take mapped at once, then looked up (a permute reads
// an index's low four bits, so the low nibbles need no mask). One vector of f's arithmetic
// where decoding each value takes four conversions and operations; the values are f's own.
template <class F>
inline void vload_u4_map(const uint8_t* p, F f, V16* lo, V16* hi) {
    const V16 table = f(V16{_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)});
    const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
    lo->v = _mm512_permutexvar_ps(w, table.v);
    hi->v = _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), table.v);
}
// 16 signed bytes.
inline V16 vload_i8(const int8_t* p) {
    return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)))};
}
// 16 bfloat16 values (a float's upper half).
inline V16 vload_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
}
// q_bytes' 16 values as floats, less `bias` where it is not 0 (subtracted in the bytes, the
// results read as signed: Q6_K's q - 32).
inline V16 vload_q(const uint8_t* lo, int ls, const uint8_t* hi, int hs, int hm, int bias = 0) {
    const __m128i q = q_bytes(lo, ls, hi, hs, hm);
    if (bias != 0)
        return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(q, _mm_set1_epi8((char)bias))))};
    return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q))};
}
// The same with value i's fifth bit from bit i of `bits` (GGUF's Q5_0 and Q5_1).
inline V16 vload_q_bits(const uint8_t* lo, int ls, unsigned bits) {
    const __m128i fifth = _mm_maskz_mov_epi8((__mmask16)bits, _mm_set1_epi8(16));
    return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_or_si128(q_bytes(lo, ls, nullptr, 0, 0), fifth)))};
}
// f of a block of 32 five-bit values (16 bytes of nibbles as vload_u4's, value j's fifth bit
// bit j of qh), for an f that maps each lane on its own: the 32 values a value can take
// mapped at once and looked up (a two-table permute reads an index's low five bits).
template <class F>
inline void vload_u5_map(const uint8_t* qs, uint32_t qh, F f, V16* lo, V16* hi) {
    const V16 t0 = f(V16{_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)});
    const V16 t1 = f(V16{_mm512_setr_ps(16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)});
    const __m128i b = _mm_loadu_si128((const __m128i*)qs), sixteen = _mm_set1_epi8(16), low4 = _mm_set1_epi8(15);
    const __m128i q0 = _mm_or_si128(_mm_and_si128(b, low4), _mm_maskz_mov_epi8((__mmask16)qh, sixteen));
    const __m128i q1 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(b, 4), low4), _mm_maskz_mov_epi8((__mmask16)(qh >> 16), sixteen));
    lo->v = _mm512_permutex2var_ps(t0.v, _mm512_cvtepu8_epi32(q0), t1.v);
    hi->v = _mm512_permutex2var_ps(t0.v, _mm512_cvtepu8_epi32(q1), t1.v);
}

// Bit i set where p[i] != 0, for i < n <= 64; never reads past p + n.
inline uint64_t nonzero_bits(const uint8_t* p, int64_t n) {
    const __mmask64 load = n >= 64 ? ~0ull : ((1ull << n) - 1);
    const __m512i row = _mm512_maskz_loadu_epi8(load, p);
    return _mm512_test_epi8_mask(row, row);
}

#elif defined(SPECD_ISA_AVX2)

constexpr const char* ISA = "avx2";
// Measured on an EPYC (the AVX2 build on an AVX-512 host; fastest and first-quartile times
// of 40-50 steps at 1k cached tokens, one thread): a one-row block of four tokens beat 2x2,
// 4x1, 3x2, 4x2 and 2x4 by 10-40% at one token and matched the best at eight; attention tiles
// of four rows by one vector beat 2x2 by 30%, 1x2 and 2x1 by 3x.
constexpr int STEP_ROWS = 1, STEP_TOKENS = 4;  // 8 accumulators, 2 weights, 2 input: 12 of 16
// A K-quant's rows two at a time: 1.05-1.13x faster than one at a time at one token, even at
// four (Q4_K, Q5_K, Q6_K products, the two builds alternating in one process).
constexpr int K_QUANT_ROWS = 2;
constexpr int TILE_ROWS = 4, TILE_VECS = 1;    // 8 accumulators, 2 keys or values

struct V16 {
    __m256 lo, hi;
};
inline V16 vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 vset1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V16 vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline V16 vload_kv(const uint16_t* p) {  // 16 halves
    return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)))};
}
inline void vstore(float* p, V16 a) {
    _mm256_storeu_ps(p, a.lo);
    _mm256_storeu_ps(p + 8, a.hi);
}
inline V16 vadd(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V16 vsub(V16 a, V16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V16 vmul(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V16 vdiv(V16 a, V16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline V16 vmax(V16 a, V16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline V16 vfma(V16 a, V16 b, V16 c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline float hsum8(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float vhsum(V16 a) { return hsum8(_mm256_add_ps(a.lo, a.hi)); }
inline float vhmax(V16 a) {
    const __m256 m = _mm256_max_ps(a.lo, a.hi);
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
// Lanes whose bit is set in m from a, the others from b: each lane tests its own bit.
inline V16 vselect(unsigned m, V16 a, V16 b) {
    const __m256i bl = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i bh = _mm256_slli_epi32(bl, 8);
    const __m256i mm = _mm256_set1_epi32((int)m);
    const __m256 kl = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(mm, bl), bl));
    const __m256 kh = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(mm, bh), bh));
    return {_mm256_blendv_ps(b.lo, a.lo, kl), _mm256_blendv_ps(b.hi, a.hi, kh)};
}
inline V16 vload_n(const float* p, int64_t n, float fill) {
    alignas(32) float t[16];
    for (int i = 0; i < 16; i++) t[i] = i < n ? p[i] : fill;
    return vload(t);
}
inline void vstore_n(float* p, V16 a, int64_t n) {
    alignas(32) float t[16];
    vstore(t, a);
    for (int i = 0; i < n && i < 16; i++) p[i] = t[i];
}
inline void prefetch(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T0); }
// As AVX-512's: half scales converted together, broadcast from memory.
inline V16 vbroadcast(const float* p) {
    __m256 r;
    __asm__("vbroadcastss %1, %0" : "=x"(r) : "m"(*p));
    return {r, r};
}
inline void vset1_halves(const uint8_t* p, V16* a, V16* b) {
    alignas(8) float f[2];
    halves_to(p, f);
    *a = vbroadcast(&f[0]);
    *b = vbroadcast(&f[1]);
}

// e^x as AVX-512's vexp, 2^n built in the exponent bits (so x is held to [-87, 88], where n
// stays a normal float's exponent); lanes below -87 give 0.
inline __m256 exp8(__m256 a) {
    const __m256 x = _mm256_min_ps(_mm256_max_ps(a, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_and_ps(y, _mm256_cmp_ps(a, _mm256_set1_ps(-87.0f), _CMP_GE_OQ));
}
inline V16 vexp(V16 a) { return {exp8(a.lo), exp8(a.hi)}; }

// Lane i of the eight: the sum of the lanes of s[i].
inline __m256 sum8(const __m256* s) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(s[4], s[5]), _mm256_hadd_ps(s[6], s[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
inline V16 vsum16(const V16* v) {
    __m256 s[16];
    for (int i = 0; i < 16; i++) s[i] = _mm256_add_ps(v[i].lo, v[i].hi);
    return {sum8(s), sum8(s + 8)};
}

// Attention scores: dots64x4 above, three queries by four keys (twelve sums and four keys in
// the 16 registers, the queries read from memory by the multiply-adds; four queries' V16
// sums, as AVX-512 kept them, took 32 and spilled).
constexpr int SCORE_PAIRS = 3;
constexpr int VALUE_ROWS = TILE_ROWS;
// The step's attention asks for each cached key's value row as it scores the key: over 1k
// positions on a Zen 3, one new token 1.2-1.35x faster, eight 1.1-1.15x (one thread, the
// keys and values in memory; runs of scripts/attention_step_bench.cpp alternating).
constexpr bool PREFETCH_VALUES = true;

// Quantized weights, decoded to floats (as AVX-512's).
inline void vload_u4(const uint8_t* p, V16* lo, V16* hi) {
    // one widening per eight bytes for both halves
    const __m128i b = _mm_loadu_si128((const __m128i*)p);
    const __m256i w0 = _mm256_cvtepu8_epi32(b), w1 = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
    const __m256i mask = _mm256_set1_epi32(15);
    *lo = {_mm256_cvtepi32_ps(_mm256_and_si256(w0, mask)), _mm256_cvtepi32_ps(_mm256_and_si256(w1, mask))};
    *hi = {_mm256_cvtepi32_ps(_mm256_srli_epi32(w0, 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(w1, 4))};
}
// f of the same 32 values (f maps each lane on its own).
template <class F>
inline void vload_u4_map(const uint8_t* p, F f, V16* lo, V16* hi) {
    vload_u4(p, lo, hi);
    *lo = f(*lo);
    *hi = f(*hi);
}
inline V16 vload_i8(const int8_t* p) {
    const __m128i b = _mm_loadu_si128((const __m128i*)p);
    return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))};
}
inline V16 vload_bf16(const uint16_t* p) {
    const __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
    const __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p + 8)));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(b, 16))};
}
inline V16 u8x16(__m128i b) {
    return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)))};
}
inline V16 vload_q(const uint8_t* lo, int ls, const uint8_t* hi, int hs, int hm, int bias = 0) {
    const __m128i q = q_bytes(lo, ls, hi, hs, hm);
    if (bias == 0) return u8x16(q);
    const __m128i b = _mm_sub_epi8(q, _mm_set1_epi8((char)bias));
    return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))};
}
inline V16 vload_q_bits(const uint8_t* lo, int ls, unsigned bits) {
    // bit i of bits to byte i: each byte takes the byte of bits holding its bit, tests it
    const __m128i spread = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)bits), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m128i select = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    const __m128i set = _mm_cmpeq_epi8(_mm_and_si128(spread, select), select);
    return u8x16(_mm_or_si128(q_bytes(lo, ls, nullptr, 0, 0), _mm_and_si128(set, _mm_set1_epi8(16))));
}
// f of a block of 32 five-bit values (f maps each lane on its own).
template <class F>
inline void vload_u5_map(const uint8_t* qs, uint32_t qh, F f, V16* lo, V16* hi) {
    *lo = f(vload_q_bits(qs, 0, qh & 0xFFFFu));
    *hi = f(vload_q_bits(qs, 4, qh >> 16));
}

inline uint64_t nonzero_bits(const uint8_t* p, int64_t n) {
    uint64_t bits = 0;
    for (int64_t i = 0; i < n; i++) bits |= (uint64_t)(p[i] != 0) << i;
    return bits;
}

#elif defined(SPECD_ISA_NEON)

constexpr const char* ISA = "neon";
// AVX2's blocking (not measured on ARM64 hardware; a checked choice that fits the registers)
constexpr int STEP_ROWS = 1, STEP_TOKENS = 4;  // 16 accumulators, 4 weights, 4 input: 24 of 32
constexpr int K_QUANT_ROWS = STEP_ROWS;
constexpr int TILE_ROWS = 4, TILE_VECS = 1;    // 16 accumulators, 4 keys or values

struct V16 {
    float32x4_t q[4];
};
inline V16 vzero() { return {{vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}}; }
inline V16 vset1(float x) { return {{vdupq_n_f32(x), vdupq_n_f32(x), vdupq_n_f32(x), vdupq_n_f32(x)}}; }
inline V16 vload(const float* p) {
    return {{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}};
}
inline float32x4_t load4(const float* p) { return vld1q_f32(p); }
inline float32x4_t load4(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
inline V16 vload_kv(const uint16_t* p) { return {{load4(p), load4(p + 4), load4(p + 8), load4(p + 12)}}; }
inline void vstore(float* p, V16 a) {
    for (int i = 0; i < 4; i++) vst1q_f32(p + 4 * i, a.q[i]);
}
#define SPECD_BINARY(name, op) \
    inline V16 name(V16 a, V16 b) { \
        return {{op(a.q[0], b.q[0]), op(a.q[1], b.q[1]), op(a.q[2], b.q[2]), op(a.q[3], b.q[3])}}; \
    }
SPECD_BINARY(vadd, vaddq_f32)
SPECD_BINARY(vsub, vsubq_f32)
SPECD_BINARY(vmul, vmulq_f32)
SPECD_BINARY(vdiv, vdivq_f32)
SPECD_BINARY(vmax, vmaxq_f32)
#undef SPECD_BINARY
inline V16 vfma(V16 a, V16 b, V16 c) {
    return {{vfmaq_f32(c.q[0], a.q[0], b.q[0]), vfmaq_f32(c.q[1], a.q[1], b.q[1]),
             vfmaq_f32(c.q[2], a.q[2], b.q[2]), vfmaq_f32(c.q[3], a.q[3], b.q[3])}};
}
inline float vhsum(V16 a) {
    return vaddvq_f32(vaddq_f32(vaddq_f32(a.q[0], a.q[1]), vaddq_f32(a.q[2], a.q[3])));
}
inline float vhmax(V16 a) {
    return vmaxvq_f32(vmaxq_f32(vmaxq_f32(a.q[0], a.q[1]), vmaxq_f32(a.q[2], a.q[3])));
}
inline V16 vselect(unsigned m, V16 a, V16 b) {
    const uint32_t lanes[4] = {1, 2, 4, 8};
    const uint32x4_t bits = vld1q_u32(lanes);
    V16 r;
    for (int i = 0; i < 4; i++) {
        const uint32x4_t keep = vtstq_u32(vdupq_n_u32(m >> (4 * i)), bits);
        r.q[i] = vbslq_f32(keep, a.q[i], b.q[i]);
    }
    return r;
}
inline V16 vload_n(const float* p, int64_t n, float fill) {
    float t[16];
    for (int i = 0; i < 16; i++) t[i] = i < n ? p[i] : fill;
    return vload(t);
}
inline void vstore_n(float* p, V16 a, int64_t n) {
    float t[16];
    vstore(t, a);
    for (int i = 0; i < n && i < 16; i++) p[i] = t[i];
}
inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

// e^x as AVX-512's vexp, 2^n built in the exponent bits (so x is held to [-87, 88]); lanes
// below -87 give 0.
inline float32x4_t exp4(float32x4_t a) {
    const float32x4_t x = vminq_f32(vmaxq_f32(a, vdupq_n_f32(-87.0f)), vdupq_n_f32(88.0f));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    const uint32x4_t seen = vcgeq_f32(a, vdupq_n_f32(-87.0f));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(y), seen));
}
inline V16 vexp(V16 a) { return {{exp4(a.q[0]), exp4(a.q[1]), exp4(a.q[2]), exp4(a.q[3])}}; }

inline V16 vsum16(const V16* v) {
    float32x4_t s[16];
    for (int i = 0; i < 16; i++) s[i] = vaddq_f32(vaddq_f32(v[i].q[0], v[i].q[1]), vaddq_f32(v[i].q[2], v[i].q[3]));
    V16 r;
    for (int i = 0; i < 4; i++)  // pairwise adds: lanes 4i .. 4i + 3 hold the sums of s[4i ..]
        r.q[i] = vpaddq_f32(vpaddq_f32(s[4 * i], s[4 * i + 1]), vpaddq_f32(s[4 * i + 2], s[4 * i + 3]));
    return r;
}

// Attention scores by NP queries of 64 floats (NP <= SCORE_PAIRS) and four keys at a time:
// out[4 x + y] = scale * q[x] . k[y], each in one four-lane register over the row's sixteen
// slices in order, then across its lanes by pairs, whatever NP. Sixteen sums, four keys and a
// query take 21 of the 32 registers; four queries' V16 sums (64 registers) went to the stack.
constexpr int SCORE_PAIRS = 4;
constexpr int VALUE_ROWS = TILE_ROWS;
#define SPECD_DOTS64 1
constexpr bool PREFETCH_VALUES = false;  // not timed on ARM64 hardware
template <int NP, class KV>
inline void dots64x4(const float* const* q, const KV* const* k, float scale, float* out) {
    float32x4_t acc[4 * NP];
    for (int i = 0; i < 4 * NP; i++) acc[i] = vdupq_n_f32(0.0f);
    for (int c = 0; c < 64; c += 4) {
        float32x4_t kv[4];
        for (int y = 0; y < 4; y++) kv[y] = load4(k[y] + c);
        for (int x = 0; x < NP; x++) {
            const float32x4_t qv = vld1q_f32(q[x] + c);
            for (int y = 0; y < 4; y++) acc[4 * x + y] = vfmaq_f32(acc[4 * x + y], qv, kv[y]);
        }
    }
    for (int i = 0; i < 4 * NP; i++) out[i] = vaddvq_f32(acc[i]) * scale;
}

// Quantized weights, decoded to floats (as AVX-512's).
inline V16 u8x16(uint8x16_t b) {
    const uint16x8_t l = vmovl_u8(vget_low_u8(b)), h = vmovl_u8(vget_high_u8(b));
    return {{vcvtq_f32_u32(vmovl_u16(vget_low_u16(l))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(l))),
             vcvtq_f32_u32(vmovl_u16(vget_low_u16(h))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(h)))}};
}
inline void vload_u4(const uint8_t* p, V16* lo, V16* hi) {
    const uint8x16_t b = vld1q_u8(p);
    *lo = u8x16(vandq_u8(b, vdupq_n_u8(15)));
    *hi = u8x16(vshrq_n_u8(b, 4));
}
// f of the same 32 values (f maps each lane on its own).
template <class F>
inline void vload_u4_map(const uint8_t* p, F f, V16* lo, V16* hi) {
    vload_u4(p, lo, hi);
    *lo = f(*lo);
    *hi = f(*hi);
}
inline V16 vload_i8(const int8_t* p) {
    const int8x16_t b = vld1q_s8(p);
    const int16x8_t l = vmovl_s8(vget_low_s8(b)), h = vmovl_s8(vget_high_s8(b));
    return {{vcvtq_f32_s32(vmovl_s16(vget_low_s16(l))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(l))),
             vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(h)))}};
}
inline V16 vload_bf16(const uint16_t* p) {
    const uint16x8_t a = vld1q_u16(p), b = vld1q_u16(p + 8);
    return {{vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(a), 16)),
             vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(a), 16)),
             vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(b), 16)),
             vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(b), 16))}};
}
inline V16 vload_q(const uint8_t* lo, int ls, const uint8_t* hi, int hs, int hm, int bias = 0) {
    uint8x16_t q = vandq_u8(vshlq_u8(vld1q_u8(lo), vdupq_n_s8((int8_t)-ls)), vdupq_n_u8(15));
    if (hm != 0) {
        const uint8x16_t top = vandq_u8(vshlq_u8(vld1q_u8(hi), vdupq_n_s8((int8_t)-hs)), vdupq_n_u8((uint8_t)hm));
        q = vorrq_u8(q, vshlq_n_u8(top, 4));
    }
    if (bias == 0) return u8x16(q);
    int8_t b[16];
    vst1q_s8(b, vreinterpretq_s8_u8(vsubq_u8(q, vdupq_n_u8((uint8_t)bias))));
    return vload_i8(b);
}

inline V16 vload_q_bits(const uint8_t* lo, int ls, unsigned bits) {
    static const uint8_t select[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t spread = vcombine_u8(vdup_n_u8((uint8_t)bits), vdup_n_u8((uint8_t)(bits >> 8)));
    const uint8x16_t fifth = vandq_u8(vtstq_u8(spread, vld1q_u8(select)), vdupq_n_u8(16));
    const uint8x16_t q = vandq_u8(vshlq_u8(vld1q_u8(lo), vdupq_n_s8((int8_t)-ls)), vdupq_n_u8(15));
    return u8x16(vorrq_u8(q, fifth));
}
// f of a block of 32 five-bit values (f maps each lane on its own).
template <class F>
inline void vload_u5_map(const uint8_t* qs, uint32_t qh, F f, V16* lo, V16* hi) {
    *lo = f(vload_q_bits(qs, 0, qh & 0xFFFFu));
    *hi = f(vload_q_bits(qs, 4, qh >> 16));
}

inline uint64_t nonzero_bits(const uint8_t* p, int64_t n) {
    uint64_t bits = 0;
    for (int64_t i = 0; i < n; i++) bits |= (uint64_t)(p[i] != 0) << i;
    return bits;
}

#else  // SPECD_ISA_SCALAR

constexpr const char* ISA = "scalar";
constexpr int STEP_ROWS = 1, STEP_TOKENS = 4;
constexpr int K_QUANT_ROWS = STEP_ROWS;
constexpr int TILE_ROWS = 4, TILE_VECS = 1;

struct V16 {
    float f[16];
};
#define SPECD_LANES(expr)                      \
    V16 r;                                     \
    for (int i = 0; i < 16; i++) r.f[i] = expr; \
    return r
inline V16 vzero() { SPECD_LANES(0.0f); }
inline V16 vset1(float x) { SPECD_LANES(x); }
inline V16 vload(const float* p) { SPECD_LANES(p[i]); }
inline V16 vload_kv(const uint16_t* p) {
    uint16_t h[16];
    memcpy(h, p, sizeof(h));
    SPECD_LANES(half_to_float(h[i]));
}
inline void vstore(float* p, V16 a) { memcpy(p, a.f, sizeof(a.f)); }
inline V16 vadd(V16 a, V16 b) { SPECD_LANES(a.f[i] + b.f[i]); }
inline V16 vsub(V16 a, V16 b) { SPECD_LANES(a.f[i] - b.f[i]); }
inline V16 vmul(V16 a, V16 b) { SPECD_LANES(a.f[i] * b.f[i]); }
inline V16 vdiv(V16 a, V16 b) { SPECD_LANES(a.f[i] / b.f[i]); }
inline V16 vmax(V16 a, V16 b) { SPECD_LANES(a.f[i] > b.f[i] ? a.f[i] : b.f[i]); }
inline V16 vfma(V16 a, V16 b, V16 c) { SPECD_LANES(fmaf(a.f[i], b.f[i], c.f[i])); }
inline V16 vselect(unsigned m, V16 a, V16 b) { SPECD_LANES((m >> i) & 1u ? a.f[i] : b.f[i]); }
inline V16 vload_n(const float* p, int64_t n, float fill) { SPECD_LANES(i < n ? p[i] : fill); }
inline V16 vexp(V16 a) { SPECD_LANES(expf(a.f[i])); }
#undef SPECD_LANES
inline void vstore_n(float* p, V16 a, int64_t n) {
    for (int i = 0; i < n && i < 16; i++) p[i] = a.f[i];
}
inline float vhsum(V16 a) {
    float s = 0.0f;
    for (int i = 0; i < 16; i++) s += a.f[i];
    return s;
}
inline float vhmax(V16 a) {
    float m = a.f[0];
    for (int i = 1; i < 16; i++) m = a.f[i] > m ? a.f[i] : m;
    return m;
}
inline V16 vsum16(const V16* v) {
    V16 r;
    for (int i = 0; i < 16; i++) r.f[i] = vhsum(v[i]);
    return r;
}
inline void prefetch(const void* p) {
#if defined(__GNUC__)
    __builtin_prefetch(p, 0, 3);
#else
    (void)p;
#endif
}
// Quantized weights, decoded to floats (as AVX-512's).
inline void vload_u4(const uint8_t* p, V16* lo, V16* hi) {
    for (int i = 0; i < 16; i++) {
        lo->f[i] = (float)(p[i] & 15);
        hi->f[i] = (float)(p[i] >> 4);
    }
}
// f of the same 32 values (f maps each lane on its own).
template <class F>
inline void vload_u4_map(const uint8_t* p, F f, V16* lo, V16* hi) {
    vload_u4(p, lo, hi);
    *lo = f(*lo);
    *hi = f(*hi);
}
inline V16 vload_i8(const int8_t* p) {
    V16 r;
    for (int i = 0; i < 16; i++) r.f[i] = (float)p[i];
    return r;
}
inline V16 vload_bf16(const uint16_t* p) {
    V16 r;
    for (int i = 0; i < 16; i++) {
        const uint32_t bits = (uint32_t)p[i] << 16;
        memcpy(&r.f[i], &bits, 4);
    }
    return r;
}
inline V16 vload_q(const uint8_t* lo, int ls, const uint8_t* hi, int hs, int hm, int bias = 0) {
    V16 r;
    for (int i = 0; i < 16; i++) {
        const int top = hm != 0 ? ((hi[i] >> hs) & hm) << 4 : 0;
        r.f[i] = (float)((((lo[i] >> ls) & 15) | top) - bias);
    }
    return r;
}

inline V16 vload_q_bits(const uint8_t* lo, int ls, unsigned bits) {
    V16 r;
    for (int i = 0; i < 16; i++) r.f[i] = (float)(((lo[i] >> ls) & 15) | (((bits >> i) & 1u) << 4));
    return r;
}
// f of a block of 32 five-bit values (f maps each lane on its own).
template <class F>
inline void vload_u5_map(const uint8_t* qs, uint32_t qh, F f, V16* lo, V16* hi) {
    *lo = f(vload_q_bits(qs, 0, qh & 0xFFFFu));
    *hi = f(vload_q_bits(qs, 4, qh >> 16));
}

inline uint64_t nonzero_bits(const uint8_t* p, int64_t n) {
    uint64_t bits = 0;
    for (int64_t i = 0; i < n; i++) bits |= (uint64_t)(p[i] != 0) << i;
    return bits;
}

#endif

// A cached key or value row's 16 values from a float32 cache (or, above, a float16 one).
inline V16 vload_kv(const float* p) { return vload(p); }

#if !defined(SPECD_DOTS64)
constexpr bool PREFETCH_VALUES = false;
constexpr int VALUE_ROWS = TILE_ROWS;
// Attention scores by NP queries of 64 floats (NP <= SCORE_PAIRS) and four keys at a time:
// out[4 x + y] = scale * q[x] . k[y], sixteen V16 sums in registers, summed across their lanes
// together (vsum16: each sum in the same order, whatever NP; out holds 16 floats).
constexpr int SCORE_PAIRS = 4;
template <int NP, class KV>
inline void dots64x4(const float* const* q, const KV* const* k, float scale, float* out) {
    V16 acc[16];
    for (int x = 0; x < 16; x++) acc[x] = vzero();
    for (int c = 0; c < 64; c += 16) {
        V16 kv[4];
        for (int y = 0; y < 4; y++) kv[y] = vload_kv(k[y] + c);
        for (int x = 0; x < NP; x++) {
            const V16 qv = vload(q[x] + c);
            for (int y = 0; y < 4; y++) acc[x * 4 + y] = vfma(qv, kv[y], acc[x * 4 + y]);
        }
    }
    vstore(out, vmul(vsum16(acc), vset1(scale)));
}
#endif

#if defined(SPECD_ISA_NEON) || defined(SPECD_ISA_SCALAR)
// The two half scales at p as floats in all 16 lanes each (as x86-64's, without its
// broadcast concern).
inline void vset1_halves(const uint8_t* p, V16* a, V16* b) {
    uint16_t h[2];
    memcpy(h, p, 4);
    *a = vset1(half_to_float(h[0]));
    *b = vset1(half_to_float(h[1]));
}
#endif

}  // namespace specd
