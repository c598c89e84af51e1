// What rounding activations to 8 bits would buy the step's Q4_1 products on an AVX-512 VNNI CPU:
// the step kernel's float32 product (blocks decoded to their exact values) against an integer
// product of the nibbles with int8 activations (VPDPBUSD), over 66 MB of random Q4_1 blocks (the
// default model's layers), rows split between the threads, for 1, 4 and 8 tokens.
//
//   g++ -O3 -march=x86-64-v4 -mavx512vnni -mf16c -fopenmp scripts/int8_products.cpp -o /tmp/i8
//   OMP_NUM_THREADS=2 /tmp/i8              # a scale per block of 32 activations (llama.cpp's)
//   g++ ... -DPER_TOKEN ...                # one scale per token: the block products only
//
// With -DPER_TOKEN the block offsets' term (a product 1/32 the size) and the token's scale are
// left out, so its times are a bound, and its error is not printed.
#define SPECD_ISA_AVX512
#include <stdio.h>
#include <stdlib.h>

#include <chrono>

#include "../specd/forward/csrc/decode_step.cpp"  // the step's own float32 product, rows_of

using namespace specd;

// The step's product of T tokens, the rows shared out between the threads as the step does.
void f32rows(const uint8_t* W, int64_t N, int64_t K, const float* x, int64_t T, float* y) {
#pragma omp parallel
    {
        int64_t lo, hi;
        share(N, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        rows_of<Q4_1Rows>(W, K, x, K, T, lo, hi, y, N);
    }
}

// One token's activations, per pair of blocks p: 64 int8 in the order the weights' nibbles
// unpack to (block 0's values 0-15, block 1's 0-15, block 0's 16-31, block 1's 16-31), their
// scales dx[p] lane by lane (d0 x4, d1 x4, d0 x4, d1 x4), and s = d * (the sum of q) / 8 the same
// way, for the blocks' offsets m.
struct QX {
    int8_t* q;
    float* dx;
    float* sx;
};
void quantize(const float* x, int64_t K, QX o) {
    for (int64_t p = 0; p < K / 64; p++) {
        float d[2], s[2];
        for (int b = 0; b < 2; b++) {
            const float* xb = x + p * 64 + b * 32;
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
            d[b] = amax / 127;
            float id = d[b] ? 1 / d[b] : 0;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                int q = (int)nearbyintf(xb[j] * id);
                sum += q;
                int pos = (j < 16 ? b * 16 + j : 32 + b * 16 + (j - 16));
                o.q[p * 64 + pos] = (int8_t)q;
            }
            s[b] = d[b] * sum;
        }
        for (int l = 0; l < 16; l++) {
            int b = (l / 4) % 2;
            o.dx[p * 16 + l] = d[b];
            o.sx[p * 16 + l] = s[b] / 8;
        }
    }
}
template <int R, int NT>
void i8block(const uint8_t* W, int64_t K, const QX* xs, int64_t r0, float* y, int64_t N) {
    const int64_t rb = K / 32 * 20;
    __m512 acc[R][NT];
    for (int a = 0; a < R; a++)
        for (int i = 0; i < NT; i++) acc[a][i] = _mm512_setzero_ps();
    const uint8_t* w = W + r0 * rb;
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int64_t p = 0; p < K / 64; p++) {
        __m512i wq[R];
        __m512 dw[R], mw[R];
        for (int a = 0; a < R; a++) {
            const uint8_t* b0 = w + a * rb + (2 * p) * 20;
            const uint8_t* b1 = b0 + 20;
            prefetch(w + (R + a) * rb + 2 * p * 20);
            __m256i v = _mm256_set_m128i(_mm_loadu_si128((const __m128i*)(b1 + 4)),
                                         _mm_loadu_si128((const __m128i*)(b0 + 4)));
            __m256i lo = _mm256_and_si256(v, m4),
                    hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            wq[a] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            uint16_t h0[2], h1[2];
            memcpy(h0, b0, 4);
            memcpy(h1, b1, 4);
            __m128 s = _mm_cvtph_ps(
                _mm_setr_epi16(h0[0], h1[0], h0[1], h1[1], 0, 0, 0, 0));  // d0 d1 m0 m1
            __m512 s4 = _mm512_broadcast_f32x4(s);
            dw[a] = _mm512_permutexvar_ps(
                _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1), s4);
            mw[a] = _mm512_permutexvar_ps(
                _mm512_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3, 2, 2, 2, 2, 3, 3, 3, 3), s4);
        }
        for (int i = 0; i < NT; i++) {
            const __m512i xq = _mm512_loadu_si512(xs[i].q + p * 64);
#ifndef PER_TOKEN
            const __m512 dx = _mm512_loadu_ps(xs[i].dx + p * 16),
                         sx = _mm512_loadu_ps(xs[i].sx + p * 16);
#endif
            for (int a = 0; a < R; a++) {
                __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[a], xq);
#ifdef PER_TOKEN
                acc[a][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dw[a], acc[a][i]);
            }
        }
    }
#else
                acc[a][i] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw[a], dx), acc[a][i]);
                acc[a][i] = _mm512_fmadd_ps(mw[a], sx, acc[a][i]);
            }
        }
    }
#endif
    for (int a = 0; a < R; a++)
        for (int i = 0; i < NT; i++) y[i * N + r0 + a] = _mm512_reduce_add_ps(acc[a][i]);
}
template <int NT>
void run(const uint8_t* W, int64_t N, int64_t K, const float* x, const QX* xs, float* y1, float* y2,
         double* tf, double* ti) {
    auto t0 = std::chrono::steady_clock::now();
    for (int rep = 0; rep < 10; rep++) f32rows(W, N, K, x, NT, y1);
    auto t1 = std::chrono::steady_clock::now();
    for (int rep = 0; rep < 10; rep++) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < N; r += 4) i8block<4, NT>(W, K, xs, r, y2, N);
    }
    auto t2 = std::chrono::steady_clock::now();
    *tf = std::chrono::duration<double>(t1 - t0).count() / 10;
    *ti = std::chrono::duration<double>(t2 - t1).count() / 10;
}
int main() {
    int64_t K = 576;
    size_t b4 = 30 * 3.54e6 / 32 * 20;
    int64_t N = b4 / (K / 32 * 20);
    N -= N % 4;
    uint8_t* W = (uint8_t*)aligned_alloc(64, (b4 + 127) / 64 * 64);
    for (size_t i = 0; i < b4; i++) W[i] = rand();
    for (int64_t r = 0; r < N * K / 32; r++) {
        _Float16 d = (_Float16)(0.01f * (1 + rand() % 100) / 100),
                 m = (_Float16)(-0.08f * (rand() % 100) / 100);
        memcpy(W + r * 20, &d, 2);
        memcpy(W + r * 20 + 2, &m, 2);
    }
    float x[8 * 576];
    for (int i = 0; i < 8 * 576; i++) x[i] = (rand() / (float)RAND_MAX - 0.5f) * 4;
    QX xs[8];
    for (int i = 0; i < 8; i++) {
        xs[i].q = (int8_t*)aligned_alloc(64, K);
        xs[i].dx = (float*)aligned_alloc(64, K / 64 * 64);
        xs[i].sx = (float*)aligned_alloc(64, K / 64 * 64);
        quantize(x + i * K, K, xs[i]);
    }
    float *y1 = new float[N * 8], *y2 = new float[N * 8];
    for (int t = 0; t < 4; t++) {
        double f1, i1, f4, i4, f8a, i8a;
        run<1>(W, N, K, x, xs, y1, y2, &f1, &i1);
        double err = 0, ref = 0;
        for (int64_t r = 0; r < N; r++) {
            err = fmax(err, fabs(y1[r] - y2[r]));
            ref = fmax(ref, fabs(y1[r]));
        }
        run<4>(W, N, K, x, xs, y1, y2, &f4, &i4);
        run<4>(W, N, K, x + 4 * K, xs + 4, y1, y2, &f8a, &i8a);
        printf(
            "%.1f MB, ms: 1 token f32 %.2f int8 %.2f | 4 tokens f32 %.2f int8 %.2f | 8 tokens f32 "
            "%.2f int8 %.2f",
            b4 / 1e6, f1 * 1e3, i1 * 1e3, f4 * 1e3, i4 * 1e3, (f4 + f8a) * 1e3, (i4 + i8a) * 1e3);
#ifdef PER_TOKEN
        printf("\n");
        (void)err;
        (void)ref;
#else
        printf(" | largest error / largest value %.1e\n", err / ref);
#endif
    }
}
