// Host side of the CUDA quantization path: device discovery, device memory, the documented scale
// layouts (fp8_cuda.h) and argument checking around the kernels in quantize_kernels.cu.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/cuda/quantize_launch.h"

namespace fp8rl::kernels::cuda {
namespace {

cudaStream_t to_cuda(Stream s) { return s; }

constexpr int64_t kMaxDim = int64_t{1} << 31;

absl::Status check_dims(const char* fn, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0 || rows >= kMaxDim || cols >= kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(fn, ": rows and cols must be in [1, 2^31), got [", rows, ", ", cols, "]"));
  }
  return absl::OkStatus();
}

absl::Status check_ptr(const char* fn, const char* name, const void* p) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(fn, ": ", name, " is null"));
  return absl::OkStatus();
}

}  // namespace

// ---- Device -----------------------------------------------------------------------------------

absl::StatusOr<DeviceInfo> require_sm90() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are not confused
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable CUDA device: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device present");
  DeviceInfo info;
  FP8RL_CUDA_RETURN_IF_ERROR(cudaGetDevice(&info.device));
  cudaDeviceProp prop{};
  FP8RL_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, info.device));
  info.major = prop.major;
  info.minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.name = prop.name;
  if (info.major != 9) {
    return absl::FailedPreconditionError(absl::StrCat("device ", info.device, " (", info.name,
                                                      ") has compute capability ", info.major, ".",
                                                      info.minor, ", need 9.x (sm_90)"));
  }
  return info;
}

// ---- Scale layouts ----------------------------------------------------------------------------

int64_t gemm_scale_ld(ScalingMode mode, int64_t rows, int64_t cols) {
  switch (mode) {
    case ScalingMode::kPerTensor:
      return 1;
    case ScalingMode::kTile1x128:
      return round_up(rows, kScaleLdAlign);
    case ScalingMode::kBlock128x128:
      return round_up(ceil_div(cols, kBlock), kScaleLdAlign);
  }
  return 1;
}

int64_t gemm_scale_count(ScalingMode mode, int64_t rows, int64_t cols) {
  switch (mode) {
    case ScalingMode::kPerTensor:
      return 1;
    case ScalingMode::kTile1x128:
      return ceil_div(cols, kBlock) * gemm_scale_ld(mode, rows, cols);
    case ScalingMode::kBlock128x128:
      return ceil_div(rows, kBlock) * gemm_scale_ld(mode, rows, cols);
  }
  return 1;
}

int64_t gemm_scale_index(ScalingMode mode, int64_t rows, int64_t cols, int64_t r, int64_t c) {
  const int64_t ld = gemm_scale_ld(mode, rows, cols);
  switch (mode) {
    case ScalingMode::kPerTensor:
      return 0;
    case ScalingMode::kTile1x128:
      return (c / kBlock) * ld + r;
    case ScalingMode::kBlock128x128:
      return (r / kBlock) * ld + c / kBlock;
  }
  return 0;
}

namespace {

// Calls f(cpu_index, gemm_index) for every real scale of a [rows, cols] matrix.
template <typename F>
void for_each_scale(ScalingMode mode, int64_t rows, int64_t cols, F&& f) {
  const int64_t kbs = ceil_div(cols, kBlock);
  switch (mode) {
    case ScalingMode::kPerTensor:
      f(0, 0);
      return;
    case ScalingMode::kTile1x128:
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t kb = 0; kb < kbs; ++kb) {
          f(r * kbs + kb, gemm_scale_index(mode, rows, cols, r, kb * kBlock));
        }
      }
      return;
    case ScalingMode::kBlock128x128:
      for (int64_t rb = 0; rb < ceil_div(rows, kBlock); ++rb) {
        for (int64_t kb = 0; kb < kbs; ++kb) {
          f(rb * kbs + kb, gemm_scale_index(mode, rows, cols, rb * kBlock, kb * kBlock));
        }
      }
      return;
  }
}

int64_t cpu_scale_count(ScalingMode mode, int64_t rows, int64_t cols) {
  switch (mode) {
    case ScalingMode::kPerTensor:
      return 1;
    case ScalingMode::kTile1x128:
      return rows * ceil_div(cols, kBlock);
    case ScalingMode::kBlock128x128:
      return ceil_div(rows, kBlock) * ceil_div(cols, kBlock);
  }
  return 1;
}

}  // namespace

absl::StatusOr<std::vector<float>> scales_to_gemm_layout(const Fp8Matrix& m) {
  const int64_t want = cpu_scale_count(m.mode, m.rows, m.cols);
  if (static_cast<int64_t>(m.scale_inv.size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("scales_to_gemm_layout: scale_inv has ", m.scale_inv.size(), " entries, ",
                     scaling_mode_name(m.mode), " [", m.rows, ", ", m.cols, "] needs ", want));
  }
  std::vector<float> out(gemm_scale_count(m.mode, m.rows, m.cols), 1.0f);
  for_each_scale(m.mode, m.rows, m.cols,
                 [&](int64_t cpu, int64_t gemm) { out[gemm] = m.scale_inv[cpu]; });
  return out;
}

absl::StatusOr<std::vector<float>> scales_from_gemm_layout(ScalingMode mode, int64_t rows,
                                                           int64_t cols,
                                                           const std::vector<float>& gemm) {
  const int64_t want = gemm_scale_count(mode, rows, cols);
  if (static_cast<int64_t>(gemm.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat("scales_from_gemm_layout: got ", gemm.size(),
                                                   " scales, ", scaling_mode_name(mode), " [", rows,
                                                   ", ", cols, "] needs ", want));
  }
  std::vector<float> out(cpu_scale_count(mode, rows, cols));
  for_each_scale(mode, rows, cols, [&](int64_t cpu, int64_t g) { out[cpu] = gemm[g]; });
  return out;
}

// ---- Device memory ----------------------------------------------------------------------------

absl::StatusOr<DeviceBuffer> DeviceBuffer::allocate(size_t bytes) {
  DeviceBuffer buf;
  if (bytes == 0) return buf;
  FP8RL_CUDA_RETURN_IF_ERROR(cudaMalloc(&buf.ptr_, bytes));
  buf.bytes_ = bytes;
  return buf;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::Status copy_to_device(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  FP8RL_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, to_cuda(stream)));
  FP8RL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(to_cuda(stream)));
  return absl::OkStatus();
}

absl::Status copy_to_host(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  FP8RL_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, to_cuda(stream)));
  FP8RL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(to_cuda(stream)));
  return absl::OkStatus();
}

absl::Status synchronize(Stream stream) {
  FP8RL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(to_cuda(stream)));
  return absl::OkStatus();
}

// ---- FP8 matrices -----------------------------------------------------------------------------

absl::StatusOr<Fp8DeviceMatrix> Fp8DeviceMatrix::allocate(int64_t rows, int64_t cols,
                                                          ScalingMode mode) {
  if (absl::Status st = check_dims("Fp8DeviceMatrix::allocate", rows, cols); !st.ok()) return st;
  Fp8DeviceMatrix m;
  m.rows_ = rows;
  m.cols_ = cols;
  m.mode_ = mode;
  absl::StatusOr<DeviceBuffer> data = DeviceBuffer::allocate(static_cast<size_t>(rows * cols));
  if (!data.ok()) return data.status();
  absl::StatusOr<DeviceBuffer> scales =
      DeviceBuffer::allocate(sizeof(float) * gemm_scale_count(mode, rows, cols));
  if (!scales.ok()) return scales.status();
  m.data_ = *std::move(data);
  m.scales_ = *std::move(scales);
  return m;
}

absl::StatusOr<Fp8DeviceMatrix> upload(const Fp8Matrix& host, Stream stream) {
  if (absl::Status st = check_fp8_matrix(host); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("upload: ", st.message()));
  }
  absl::StatusOr<std::vector<float>> scales = scales_to_gemm_layout(host);
  if (!scales.ok()) return scales.status();
  absl::StatusOr<Fp8DeviceMatrix> m = Fp8DeviceMatrix::allocate(host.rows, host.cols, host.mode);
  if (!m.ok()) return m.status();
  if (absl::Status st = copy_to_device(m->data(), host.data.data(), host.data.size(), stream);
      !st.ok()) {
    return st;
  }
  if (absl::Status st =
          copy_to_device(m->scale_inv(), scales->data(), sizeof(float) * scales->size(), stream);
      !st.ok()) {
    return st;
  }
  return m;
}

absl::StatusOr<Fp8Matrix> download(const Fp8DeviceView& device, Stream stream) {
  if (absl::Status st = check_dims("download", device.rows, device.cols); !st.ok()) return st;
  if (device.data == nullptr || device.scale_inv == nullptr) {
    return absl::InvalidArgumentError("download: data or scale_inv is null");
  }
  Fp8Matrix host;
  host.rows = device.rows;
  host.cols = device.cols;
  host.mode = device.mode;
  host.data.resize(static_cast<size_t>(device.rows * device.cols));
  std::vector<float> gemm(gemm_scale_count(device.mode, device.rows, device.cols));
  if (absl::Status st = copy_to_host(host.data.data(), device.data, host.data.size(), stream);
      !st.ok()) {
    return st;
  }
  if (absl::Status st =
          copy_to_host(gemm.data(), device.scale_inv, sizeof(float) * gemm.size(), stream);
      !st.ok()) {
    return st;
  }
  absl::StatusOr<std::vector<float>> cpu =
      scales_from_gemm_layout(device.mode, device.rows, device.cols, gemm);
  if (!cpu.ok()) return cpu.status();
  host.scale_inv = *std::move(cpu);
  return host;
}

// ---- Quantization -----------------------------------------------------------------------------

absl::Status quantize(const float* x, int64_t rows, int64_t cols, ScalingMode mode,
                      QuantOptions options, uint8_t* q, float* scale_inv, Stream stream) {
  constexpr const char* kFn = "cuda::quantize";
  if (absl::Status st = check_dims(kFn, rows, cols); !st.ok()) return st;
  if (absl::Status st = check_ptr(kFn, "x", x); !st.ok()) return st;
  if (absl::Status st = check_ptr(kFn, "q", q); !st.ok()) return st;
  if (absl::Status st = check_ptr(kFn, "scale_inv", scale_inv); !st.ok()) return st;
  const int64_t ld = gemm_scale_ld(mode, rows, cols);
  switch (mode) {
    case ScalingMode::kTile1x128:
      FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_quantize_tile1x128(
          x, rows, cols, options.pow2_scales, q, scale_inv, ld, to_cuda(stream)));
      break;
    case ScalingMode::kBlock128x128:
      FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_quantize_block128x128(
          x, rows, cols, options.pow2_scales, q, scale_inv, ld, to_cuda(stream)));
      break;
    case ScalingMode::kPerTensor:
      FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_quantize_per_tensor(
          x, rows * cols, options.pow2_scales, q, scale_inv, to_cuda(stream)));
      break;
  }
  return absl::OkStatus();
}

absl::Status quantize(const float* x, QuantOptions options, Fp8DeviceMatrix& out, Stream stream) {
  return quantize(x, out.rows(), out.cols(), out.mode(), options, out.data(), out.scale_inv(),
                  stream);
}

absl::Status dequantize(const Fp8DeviceView& q, float* out, Stream stream) {
  constexpr const char* kFn = "cuda::dequantize";
  if (absl::Status st = check_dims(kFn, q.rows, q.cols); !st.ok()) return st;
  if (absl::Status st = check_ptr(kFn, "q.data", q.data); !st.ok()) return st;
  if (absl::Status st = check_ptr(kFn, "q.scale_inv", q.scale_inv); !st.ok()) return st;
  if (absl::Status st = check_ptr(kFn, "out", out); !st.ok()) return st;
  const int mode = q.mode == ScalingMode::kTile1x128      ? 1
                   : q.mode == ScalingMode::kBlock128x128 ? 2
                                                          : 0;
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_dequantize(q.data, q.rows, q.cols, mode, q.scale_inv,
                                                         gemm_scale_ld(q.mode, q.rows, q.cols), out,
                                                         to_cuda(stream)));
  return absl::OkStatus();
}

absl::Status transpose_blocks(const Fp8DeviceView& w, Fp8DeviceMatrix& out, Stream stream) {
  constexpr const char* kFn = "cuda::transpose_blocks";
  if (absl::Status st = check_dims(kFn, w.rows, w.cols); !st.ok()) return st;
  if (w.mode != ScalingMode::kBlock128x128 || out.mode() != ScalingMode::kBlock128x128) {
    return absl::InvalidArgumentError(absl::StrCat(kFn, ": w and out must be block_128x128, got ",
                                                   scaling_mode_name(w.mode), " and ",
                                                   scaling_mode_name(out.mode())));
  }
  if (out.rows() != w.cols || out.cols() != w.rows) {
    return absl::InvalidArgumentError(absl::StrCat(kFn, ": out is [", out.rows(), ", ", out.cols(),
                                                   "], must be [", w.cols, ", ", w.rows, "]"));
  }
  if (ceil_div(w.rows, 32) > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": w.rows = ", w.rows, " exceeds the kernel's grid (2,097,120)"));
  }
  if (absl::Status st = check_ptr(kFn, "w.data", w.data); !st.ok()) return st;
  if (absl::Status st = check_ptr(kFn, "w.scale_inv", w.scale_inv); !st.ok()) return st;
  FP8RL_CUDA_RETURN_IF_ERROR(internal::launch_transpose_blocks(
      w.data, w.scale_inv, w.rows, w.cols, gemm_scale_ld(w.mode, w.rows, w.cols), out.data(),
      out.scale_inv(), gemm_scale_ld(out.mode(), out.rows(), out.cols()), to_cuda(stream)));
  return absl::OkStatus();
}

absl::Status quantize_with_scale(const float* x, int64_t n, float scale, uint8_t* out,
                                 Stream stream) {
  constexpr const char* kFn = "cuda::quantize_with_scale";
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(kFn, ": n is negative (", n, ")"));
  if (!(scale > 0.0f) || !std::isfinite(scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": scale must be finite and > 0, got ", scale));
  }
  if (n == 0) return absl::OkStatus();
  if (absl::Status st = check_ptr(kFn, "x", x); !st.ok()) return st;
  if (absl::Status st = check_ptr(kFn, "out", out); !st.ok()) return st;
  FP8RL_CUDA_RETURN_IF_ERROR(
      internal::launch_quantize_with_scale(x, n, scale, out, to_cuda(stream)));
  return absl::OkStatus();
}

absl::Status dequantize_with_scale(const uint8_t* q, int64_t n, float scale, float* out,
                                   Stream stream) {
  constexpr const char* kFn = "cuda::dequantize_with_scale";
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(kFn, ": n is negative (", n, ")"));
  if (!(scale > 0.0f) || !std::isfinite(scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": scale must be finite and > 0, got ", scale));
  }
  if (n == 0) return absl::OkStatus();
  if (absl::Status st = check_ptr(kFn, "q", q); !st.ok()) return st;
  if (absl::Status st = check_ptr(kFn, "out", out); !st.ok()) return st;
  FP8RL_CUDA_RETURN_IF_ERROR(
      internal::launch_dequantize_with_scale(q, n, scale, out, to_cuda(stream)));
  return absl::OkStatus();
}

}  // namespace fp8rl::kernels::cuda
