// Prints FP8 block-scaled GEMM vs BF16 GEMM throughput (cuBLASLt, sm_90) for the Llama-3.1-8B
// linear shapes at M = 4096 tokens, with quantization times and the FP8 result's calc_diff
// against the BF16 one. A benchmark, not a test: exits 0 with a message when there is no GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/calc_diff.h"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/formats.h"

namespace fp8rl::kernels::cuda {
namespace {

constexpr int64_t kM = 4096;
struct LinearShape {
  const char* name;
  int64_t n, k;
};
constexpr LinearShape kShapes[] = {{"attn o_proj", 4096, 4096},
                                   {"attn qkv_proj", 6144, 4096},
                                   {"mlp gate_up", 28672, 4096},
                                   {"mlp down", 4096, 14336}};
constexpr int kWarmup = 5;
constexpr int kRuns = 20;

[[noreturn]] void die(const absl::Status& st, const char* what) {
  std::fprintf(stderr, "fp8rl-bench-gemm-gpu: %s: %s\n", what, std::string(st.message()).c_str());
  std::exit(1);
}

void check(const absl::Status& st, const char* what) {
  if (!st.ok()) die(st, what);
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) die(absl::InternalError(cudaGetErrorString(err)), what);
}

// Median milliseconds of fn() over kRuns, after kWarmup calls, timed with CUDA events.
double median_ms(const std::function<void()>& fn) {
  for (int i = 0; i < kWarmup; ++i) fn();
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < kRuns; ++i) {
    check_cuda(cudaEventRecord(start, nullptr), "cudaEventRecord");
    fn();
    check_cuda(cudaEventRecord(stop, nullptr), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0;
    check_cuda(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Deterministic non-zero pseudo-normal values (sum of uniforms), fast enough for 10^8 of them.
std::vector<float> random_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&s] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<float>(s >> 40) * (1.0f / 16777216.0f);
  };
  for (size_t i = 0; i < n; ++i) {
    const float g = next() + next() + next() - 1.5f;
    v[i] = g == 0.0f ? 0.25f : g;
  }
  return v;
}

// --probe: prints the sm_90 device and exits 0, or "no GPU (<reason>)" and exits 2
// (scripts/gpu_check.sh asks this before it runs anything that needs the device).
int probe() {
  absl::StatusOr<DeviceInfo> dev = require_sm90();
  if (!dev.ok()) {
    std::printf("no GPU (%s)\n", std::string(dev.status().message()).c_str());
    return 2;
  }
  std::printf("sm_90 GPU: %s (sm_%d%d, %d SMs)\n", dev->name.c_str(), dev->major, dev->minor,
              dev->sm_count);
  return 0;
}

int run() {
  absl::StatusOr<DeviceInfo> dev = require_sm90();
  if (!dev.ok()) {
    std::printf("fp8rl-bench-gemm-gpu: skipped, no sm_90 GPU (%s)\n",
                std::string(dev.status().message()).c_str());
    return 0;
  }
  std::printf("device: %s (sm_%d%d, %d SMs); M = %ld tokens; median of %d runs after %d warmup\n",
              dev->name.c_str(), dev->major, dev->minor, dev->sm_count, long(kM), kRuns, kWarmup);

  int64_t max_x = 0, max_w = 0, max_y = 0;
  for (const LinearShape& s : kShapes) {
    max_x = std::max(max_x, kM * s.k);
    max_w = std::max(max_w, s.n * s.k);
    max_y = std::max(max_y, kM * s.n);
  }
  const std::vector<float> hx = random_values(max_x, 1);
  std::vector<float> hw = random_values(max_w, 2);
  for (float& v : hw) v *= 0.02f;
  std::vector<uint16_t> hx16(hx.size()), hw16(hw.size());
  for (size_t i = 0; i < hx.size(); ++i) hx16[i] = float_to_bf16(hx[i]);
  for (size_t i = 0; i < hw.size(); ++i) hw16[i] = float_to_bf16(hw[i]);

  auto alloc = [](size_t bytes) {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::allocate(bytes);
    if (!b.ok()) die(b.status(), "allocate");
    return *std::move(b);
  };
  DeviceBuffer dx = alloc(4 * max_x), dw = alloc(4 * max_w);
  DeviceBuffer dx16 = alloc(2 * max_x), dw16 = alloc(2 * max_w);
  DeviceBuffer dy8 = alloc(2 * max_y), dy16 = alloc(2 * max_y);
  DeviceBuffer qx = alloc(max_x), qw = alloc(max_w);
  DeviceBuffer sx = alloc(4 * gemm_scale_count(ScalingMode::kTile1x128, kM, 14336));
  DeviceBuffer sw = alloc(4 * gemm_scale_count(ScalingMode::kBlock128x128, 28672, 14336));
  check(copy_to_device(dx.data(), hx.data(), 4 * hx.size(), nullptr), "upload x");
  check(copy_to_device(dw.data(), hw.data(), 4 * hw.size(), nullptr), "upload w");
  check(copy_to_device(dx16.data(), hx16.data(), 2 * hx16.size(), nullptr), "upload x bf16");
  check(copy_to_device(dw16.data(), hw16.data(), 2 * hw16.size(), nullptr), "upload w bf16");

  absl::StatusOr<std::unique_ptr<CublasLtGemm>> gemm = CublasLtGemm::create();
  if (!gemm.ok()) die(gemm.status(), "CublasLtGemm::create");

  std::printf(
      "\n| shape | N x K | FP8 block TFLOP/s | BF16 TFLOP/s | FP8/BF16 | quant X 1x128 (us) "
      "| quant W 128x128 (us) | calc_diff FP8 vs BF16 |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const LinearShape& s : kShapes) {
    const Fp8DeviceView a{kM, s.k, ScalingMode::kTile1x128, qx.as<uint8_t>(), sx.as<float>()};
    const Fp8DeviceView b{s.n, s.k, ScalingMode::kBlock128x128, qw.as<uint8_t>(), sw.as<float>()};
    const double t_qx = median_ms([&] {
      check(quantize(dx.as<float>(), kM, s.k, ScalingMode::kTile1x128, {}, qx.as<uint8_t>(),
                     sx.as<float>(), nullptr),
            "quantize x");
    });
    const double t_qw = median_ms([&] {
      check(quantize(dw.as<float>(), s.n, s.k, ScalingMode::kBlock128x128, {}, qw.as<uint8_t>(),
                     sw.as<float>(), nullptr),
            "quantize w");
    });
    const double t_fp8 = median_ms([&] {
      check((*gemm)->gemm_fp8(a, b, dy8.data(), OutDtype::kBF16, false, nullptr), "gemm_fp8");
    });
    const double t_bf16 = median_ms([&] {
      check((*gemm)->gemm_bf16(dx16.as<uint16_t>(), dw16.as<uint16_t>(), dy16.data(), kM, s.n, s.k,
                               OutDtype::kBF16, false, nullptr),
            "gemm_bf16");
    });
    // Accuracy next to speed: the FP8 result against the BF16 one.
    const size_t count = static_cast<size_t>(kM * s.n);
    std::vector<uint16_t> y8(count), y16(count);
    check(copy_to_host(y8.data(), dy8.data(), 2 * count, nullptr), "download y fp8");
    check(copy_to_host(y16.data(), dy16.data(), 2 * count, nullptr), "download y bf16");
    std::vector<float> f8(count), f16(count);
    for (size_t i = 0; i < count; ++i) {
      f8[i] = bf16_to_float(y8[i]);
      f16[i] = bf16_to_float(y16[i]);
    }
    const double flops = 2.0 * kM * s.n * s.k;
    std::printf("| %s | %ld x %ld | %.1f | %.1f | %.2f | %.1f | %.1f | %.2e |\n", s.name, long(s.n),
                long(s.k), flops / (t_fp8 * 1e9), flops / (t_bf16 * 1e9), t_bf16 / t_fp8,
                t_qx * 1e3, t_qw * 1e3, calc_diff(f8, f16));
  }
  return 0;
}

}  // namespace
}  // namespace fp8rl::kernels::cuda

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--probe") return fp8rl::kernels::cuda::probe();
  if (argc != 1) {
    std::fprintf(stderr, "usage: fp8rl-bench-gemm-gpu [--probe]\n");
    return 1;
  }
  return fp8rl::kernels::cuda::run();
}
