// Measures the CPU reference FP8 GEMM against plain OpenBLAS sgemm on Llama-like linear shapes
// (scaled down to fit a small CPU), so the cost of the per-K-block promotion is visible.
//
// Usage: fp8rl-bench-gemm-cpu [--reps N]   (columns: quantize ms = activations 1x128 + weights
// 128x128; GFLOP/s counts 2*M*N*K per GEMM; wall ratio = fp8 time / sgemm time; cpu ratio = the
// same in process CPU time, which stays meaningful when other jobs share the cores).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "common/parallel.h"
#include "kernels/gemm.h"
#include "kernels/quantize.h"

namespace {

using fp8rl::kernels::Fp8Matrix;
using fp8rl::kernels::ScalingMode;

struct Shape {
  const char* name;
  int64_t n, k;
};

// Llama-3.1-8B linear shapes (N x K = 4096x4096, 6144x4096, 28672x4096, 4096x14336) divided by 4.
constexpr Shape kShapes[] = {{"o_proj/4", 1024, 1024},
                             {"qkv_proj/4", 1536, 1024},
                             {"gate_up/4", 7168, 1024},
                             {"down_proj/4", 1024, 3584}};
constexpr int64_t kTokens[] = {8, 256, 1024};  // 8: decode-like batch (small-M path)

std::vector<float> random_normal(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  return x;
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Best wall time of `reps` runs, and the process CPU time (all threads) of that run. The CPU
// time is the fairer comparison on a shared, busy machine.
struct Timing {
  double wall = 1e30;
  double cpu = 0.0;
};

template <typename Fn>
Timing best_of(int reps, Fn&& fn) {
  Timing best;
  for (int r = 0; r < reps; ++r) {
    const double c0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (wall < best.wall) best = {wall, process_cpu_seconds() - c0};
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
      if (reps < 1) {
        std::fprintf(stderr, "fp8rl-bench-gemm-cpu: --reps must be a positive integer\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "fp8rl-bench-gemm-cpu: unknown argument '%s' (usage: [--reps N])\n",
                   argv[i]);
      return 2;
    }
  }
  std::printf("CPU reference GEMM, %d threads, best of %d\n",
              fp8rl::global_thread_pool().num_threads(), reps);
  std::printf("| %-11s | %5s | %5s | %5s | %11s | %11s | %13s | %10s | %9s |\n", "shape", "M", "N",
              "K", "quantize ms", "fp8 GFLOP/s", "sgemm GFLOP/s", "wall ratio", "cpu ratio");
  std::printf(
      "|-------------|-------|-------|-------|-------------|-------------|---------------|"
      "------------|-----------|\n");
  for (int64_t m : kTokens) {
    for (const Shape& s : kShapes) {
      const std::vector<float> x = random_normal(m * s.k, 1);
      const std::vector<float> w = random_normal(s.n * s.k, 2);
      std::vector<float> y(m * s.n);
      Fp8Matrix qx, qw;
      const Timing tq = best_of(reps, [&] {
        qx = fp8rl::kernels::quantize(x.data(), m, s.k, ScalingMode::kTile1x128);
        qw = fp8rl::kernels::quantize(w.data(), s.n, s.k, ScalingMode::kBlock128x128);
      });
      bool ok = true;
      const Timing t8 =
          best_of(reps, [&] { ok = ok && fp8rl::kernels::gemm_fp8(qx, qw, y.data()).ok(); });
      if (!ok) {
        std::fprintf(stderr, "fp8rl-bench-gemm-cpu: gemm_fp8 failed on %s\n", s.name);
        return 1;
      }
      const Timing t32 = best_of(
          reps, [&] { fp8rl::kernels::gemm_f32(x.data(), w.data(), y.data(), m, s.n, s.k); });
      const double flop = 2.0 * m * s.n * s.k;
      std::printf("| %-11s | %5ld | %5ld | %5ld | %11.1f | %11.1f | %13.1f | %10.2f | %9.2f |\n",
                  s.name, static_cast<long>(m), static_cast<long>(s.n), static_cast<long>(s.k),
                  tq.wall * 1e3, flop / t8.wall / 1e9, flop / t32.wall / 1e9, t8.wall / t32.wall,
                  t8.cpu / t32.cpu);
    }
  }
  return 0;
}
