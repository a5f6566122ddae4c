// Kernels of engine/cuda/step_kernels.h: one thread per output element, obviously right first.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "engine/cuda/step_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/device_math/hd.h"

namespace fp8rl::engine::cuda {
namespace {

namespace dm = kernels::dm;
constexpr int kThreads = 256;

__device__ int64_t global_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

int64_t blocks_for(int64_t n) { return (n + kThreads - 1) / kThreads; }

__global__ void add_round_kernel(float* y, const float* x, int64_t n, bool rb) {
  const int64_t i = global_index();
  if (i >= n) return;
  const float v = y[i] + x[i];
  y[i] = rb ? dm::round_bf16(v) : v;
}

__global__ void round_bf16_kernel(float* x, int64_t n) {
  const int64_t i = global_index();
  if (i < n) x[i] = dm::round_bf16(x[i]);
}

__global__ void bias_round_kernel(float* y, const float* bias, int64_t rows, int64_t n, bool rb) {
  const int64_t i = global_index();
  if (i >= rows * n) return;
  float v = y[i];
  if (bias != nullptr) v += bias[i % n];
  y[i] = rb ? dm::round_bf16(v) : v;
}

__global__ void to_bf16_kernel(const float* x, int64_t n, uint16_t* out) {
  const int64_t i = global_index();
  if (i < n) out[i] = dm::float_to_bf16(x[i]);
}

__global__ void gemm_f64acc_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                   float* __restrict__ y, int64_t m, int64_t n, int64_t k) {
  const int64_t t = global_index();
  if (t >= m * n) return;
  const int64_t r = t / n, c = t % n;
  const float* xr = x + r * k;
  const float* wc = w + c * k;
  double acc = 0.0;
  for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(xr[i]) * static_cast<double>(wc[i]);
  y[t] = static_cast<float>(acc);
}

__global__ void gather_rows_kernel(const float* x, int64_t h, const int32_t* rows, int64_t n,
                                   float* out) {
  const int64_t t = global_index();
  if (t >= n * h) return;
  out[t] = x[static_cast<int64_t>(rows[t / h]) * h + t % h];
}

absl::Status launched(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": launch failed: ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

absl::Status positive(const char* what, int64_t n) {
  if (n >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": negative size ", n));
}

}  // namespace

absl::Status add_round(float* y, const float* x, int64_t n, bool rb, Stream stream) {
  if (auto s = positive("add_round", n); !s.ok() || n == 0) return s;
  add_round_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n, rb);
  return launched("add_round");
}

absl::Status round_bf16(float* x, int64_t n, Stream stream) {
  if (auto s = positive("round_bf16", n); !s.ok() || n == 0) return s;
  round_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n);
  return launched("round_bf16");
}

absl::Status bias_round(float* y, const float* bias, int64_t rows, int64_t n, bool rb,
                        Stream stream) {
  if (auto s = positive("bias_round", rows * n); !s.ok() || rows * n == 0) return s;
  if (bias == nullptr && !rb) return absl::OkStatus();
  bias_round_kernel<<<blocks_for(rows * n), kThreads, 0, stream>>>(y, bias, rows, n, rb);
  return launched("bias_round");
}

absl::Status to_bf16_bits(const float* x, int64_t n, uint16_t* out, Stream stream) {
  if (auto s = positive("to_bf16_bits", n); !s.ok() || n == 0) return s;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, out);
  return launched("to_bf16_bits");
}

absl::Status gemm_f64acc(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
                         Stream stream) {
  if (m <= 0 || n <= 0 || k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gemm_f64acc: m, n, k must be > 0, got ", m, ", ", n, ", ", k));
  }
  gemm_f64acc_kernel<<<blocks_for(m * n), kThreads, 0, stream>>>(x, w, y, m, n, k);
  return launched("gemm_f64acc");
}

absl::Status gather_rows(const float* x, int64_t h, const int32_t* rows, int64_t n, float* out,
                         Stream stream) {
  if (auto s = positive("gather_rows", n * h); !s.ok() || n * h == 0) return s;
  gather_rows_kernel<<<blocks_for(n * h), kThreads, 0, stream>>>(x, h, rows, n, out);
  return launched("gather_rows");
}

}  // namespace fp8rl::engine::cuda
