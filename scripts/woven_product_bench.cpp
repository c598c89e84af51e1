// The step kernel's int8 products alone, on synthetic woven weights (random nibbles or
// bytes, scales near 0.01): milliseconds of specd_product for passes of 1, 2, 4 and 8 tokens
// and a prefill's 64 and 1,024, nanoseconds per woven block (16 rows by 32 values) and token
// on each thread, and the bytes read per second. A matrix larger than the last-level cache
// shows the memory-bound step; the wider passes show the arithmetic.
//
//   g++ -O3 -std=c++17 -ffp-contract=off -fopenmp -mavx2 -mfma -mf16c -DSPECD_ISA_AVX2 \
//       scripts/woven_product_bench.cpp specd/forward/csrc/decode_step.cpp -o /tmp/wpb
//   /tmp/wpb 10 98304 1    # woven Q4 (code 10), 98,304 rows of 576, one thread
//   /tmp/wpb 11 49152 2    # woven Q8 (code 11): the default model's LM head, two threads
//   /tmp/wpb 10 1536 1 576 # 1,536 rows of 576 (an MLP's gate), one thread
//   /tmp/wpb maddubs       # x86-64: nanoseconds per vpmaddubsw, eight independent chains
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
// The throughput of AVX2's byte multiply-add alone: eight independent chains of vpmaddubsw
// in registers, the inputs hidden from the compiler each round (so it neither merges the
// chains nor keeps them in memory), then the same with a vpaddw after each.
static int maddubs_rate() {
    __m256i a0 = _mm256_set1_epi8(1), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3), a3 = _mm256_set1_epi8(4);
    __m256i a4 = _mm256_set1_epi8(5), a5 = _mm256_set1_epi8(6), a6 = _mm256_set1_epi8(7), a7 = _mm256_set1_epi8(8);
    __m256i x = _mm256_set1_epi8(3);
    const long n = 100000000;
    for (int add = 0; add < 2; add++) {
        auto t0 = std::chrono::steady_clock::now();
        for (long r = 0; r < n; r++) {
            __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7), "+x"(x));
            if (add) {
                a0 = _mm256_add_epi16(_mm256_maddubs_epi16(a0, x), x);
                a1 = _mm256_add_epi16(_mm256_maddubs_epi16(a1, x), x);
                a2 = _mm256_add_epi16(_mm256_maddubs_epi16(a2, x), x);
                a3 = _mm256_add_epi16(_mm256_maddubs_epi16(a3, x), x);
                a4 = _mm256_add_epi16(_mm256_maddubs_epi16(a4, x), x);
                a5 = _mm256_add_epi16(_mm256_maddubs_epi16(a5, x), x);
                a6 = _mm256_add_epi16(_mm256_maddubs_epi16(a6, x), x);
                a7 = _mm256_add_epi16(_mm256_maddubs_epi16(a7, x), x);
            } else {
                a0 = _mm256_maddubs_epi16(a0, x);
                a1 = _mm256_maddubs_epi16(a1, x);
                a2 = _mm256_maddubs_epi16(a2, x);
                a3 = _mm256_maddubs_epi16(a3, x);
                a4 = _mm256_maddubs_epi16(a4, x);
                a5 = _mm256_maddubs_epi16(a5, x);
                a6 = _mm256_maddubs_epi16(a6, x);
                a7 = _mm256_maddubs_epi16(a7, x);
            }
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        __m256i t = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(a0, a1), _mm256_add_epi16(a2, a3)),
                                     _mm256_add_epi16(_mm256_add_epi16(a4, a5), _mm256_add_epi16(a6, a7)));
        printf("%.3f ns per vpmaddubsw%s (%d)\n", s * 1e9 / (n * 8.0), add ? " + vpaddw" : "", _mm256_extract_epi16(t, 0));
    }
    return 0;
}
#endif

extern "C" void specd_product(const void* weight, int32_t format, int64_t N, int64_t K, const float* x,
                   int64_t T, const float* b, float* y, int threads);
int main(int argc, char** argv) {
#if defined(__AVX2__)
    if (argc == 2 && strcmp(argv[1], "maddubs") == 0) return maddubs_rate();
#endif
    if (argc < 4) {
        fprintf(stderr, "usage: %s 10|11 ROWS THREADS [COLS], or %s maddubs\n", argv[0], argv[0]);
        return 2;
    }
    int code = atoi(argv[1]);  // 10 woven Q4, 11 woven Q8
    int64_t N = atol(argv[2]), K = argc > 4 ? atol(argv[4]) : 576;
    int threads = atoi(argv[3]);
    int64_t bytes = (code == 10 ? 320 : 544);
    std::vector<uint8_t> w(N / 16 * (K / 32) * bytes);
    srand(1);
    for (auto& c : w) c = rand() & 255;
    // the rows' scales (and Q4's offsets): halves near 0.01
    for (int64_t blk = 0; blk < N / 16 * (K / 32); blk++) {
        uint8_t* p = w.data() + blk * bytes + (code == 10 ? 256 : 512);
        for (int l = 0; l < (code == 10 ? 32 : 16); l++) { uint16_t h = 0x2000 + (rand() & 0xff); memcpy(p + 2 * l, &h, 2); }
    }
    const int64_t most = N <= 4096 ? 1024 : 8;  // a prefill's tokens where the output stays small
    std::vector<float> x(most * K), y(most * N);
    for (auto& v : x) v = (rand() % 2000 - 1000) / 1000.0f;
    for (int T : {1, 2, 4, 8, 64, 1024}) {
        if (T > most) break;
        double best = 1e9;
        for (int r = 0; r < 15; r++) {
            auto t0 = std::chrono::steady_clock::now();
            specd_product(w.data(), code, N, K, x.data(), T, nullptr, y.data(), threads);
            double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (s < best) best = s;
        }
        double blocks = (double)N / 16 * (K / 32) * T;
        printf("code %d T=%d threads=%d: %.2f ms, %.1f ns per block-token per thread, %.1f GB/s\n", code, T, threads, best * 1e3,
               best * 1e9 * threads / blocks, w.size() / best / 1e9);
    }
}
