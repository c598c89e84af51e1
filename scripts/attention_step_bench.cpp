// The step kernel's attention alone (decode_step.cpp's attend_group), on one thread: T new
// tokens of the default model's shape (9 query heads, 3 key/value heads of 64) over P cached
// positions in chunks of 128, for 30 layers' worth of key/value heads, each with keys and
// values of its own (30 x 3 x P x 64 x 2 values: 45 MiB at 1k positions as float32, half that
// as float16; in memory, not in cache, as in a step: each round first reads 128 MiB). Prints
// the best of 30 rounds and the bytes of keys and values read per second. Build two versions
// of the source and run them in turn to compare them:
//
//   g++ -O3 -std=c++17 -ffp-contract=off -fopenmp -mavx2 -mfma -mf16c -DSPECD_ISA_AVX2 \
//       -Ispecd/forward/csrc scripts/attention_step_bench.cpp -o /tmp/asb
//   /tmp/asb 1 1024          # one new token over 1,024 cached positions, a float32 cache
//   /tmp/asb 8 1024          # a verify pass of 8
//   /tmp/asb 8 1024 float16  # the same over a cache of halves
#include "../specd/forward/csrc/decode_step.cpp"

#include <chrono>
#include <cstdio>
#include <random>

template <class KV>
int run(int64_t T, int64_t past, const char* kind) {
    const int64_t D = 64, rep = 3, Hq = 9, KV_HEADS = 3, heads = 30 * KV_HEADS;
    std::mt19937 gen(1);
    std::normal_distribution<float> normal;
    std::vector<float> q(T * Hq * D), kn(T * KV_HEADS * D), vn(T * KV_HEADS * D);
    std::vector<KV> k(heads * past * D), v(heads * past * D);
    for (auto* x : {&q, &kn, &vn})
        for (auto& f : *x) f = normal(gen);
    for (auto* x : {&k, &v})
        for (auto& e : *x) {
            if constexpr (std::is_same<KV, float>::value) e = normal(gen);
            else e = float_to_half(normal(gen));
        }
    std::vector<float> s(rep * T * ATTN_CHUNK), part(T * Hq * (D + 2));
    Group<KV> a{};
    a.q = q.data();
    a.q_t = Hq * D;
    a.rep = rep;
    a.T = T;
    a.past = past;
    a.D = D;
    a.k_new = kn.data();
    a.v_new = vn.data();
    a.kv_t = KV_HEADS * D;
    a.scale = 0.125f;
    // Each round starts with the keys and values out of the caches, as a step finds them after
    // its weights have streamed through: 128 MiB read in between (more than any L3 here).
    std::vector<float> flush(32 << 20, 1.0f);
    float sink = 0.0f;
    double best = 1e9;
    for (int round = 0; round < 30; round++) {
        for (size_t i = 0; i < flush.size(); i += 16) sink += flush[i];
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t h = 0; h < heads; h++) {
            a.g = h % KV_HEADS;
            a.k = k.data() + h * past * D;
            a.v = v.data() + h * past * D;
            for (int64_t j0 = 0; j0 < past + T; j0 += ATTN_CHUNK) {
                const int64_t j1 = j0 + ATTN_CHUNK < past + T ? j0 + ATTN_CHUNK : past + T;
                attend_group(a, Hq, j0, j1, s.data(), part.data());
            }
        }
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = t < best ? t : best;
    }
    printf("%s, %lld new tokens over %lld positions, %s cache: %.2f ms, %.1f GB/s of keys and values (%.3f)\n",
           ISA, (long long)T, (long long)past, kind, best * 1e3, heads * past * D * 2.0 * sizeof(KV) / best / 1e9,
           part[2] + 0.0f * sink);
    return 0;
}

int main(int argc, char** argv) {
    const int64_t T = argc > 1 ? atoll(argv[1]) : 1, past = argc > 2 ? atoll(argv[2]) : 1024;
    const char* kind = argc > 3 ? argv[3] : "float32";
    const bool half = strcmp(kind, "float16") == 0;
    if (T < 1 || T > 16 || past < 0 || past > 8192 || (!half && strcmp(kind, "float32") != 0)) {
        fprintf(stderr, "usage: %s T (1-16) POSITIONS (0-8192) [float32|float16]\n", argv[0]);
        return 2;
    }
    return half ? run<uint16_t>(T, past, kind) : run<float>(T, past, kind);
}
