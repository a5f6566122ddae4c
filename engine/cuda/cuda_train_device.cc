// The CUDA TrainDevice: cudaMalloc'd buffers owned by the device object, the optimizer kernels of
// kernels/cuda/optim_cuda.h and the quantization kernels of kernels/cuda/fp8_cuda.h on one
// stream. Ran on an H200 (tests/gpu/train_state_cuda_test.cc compares it with the host
// mirror when an sm_90 device is present).
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/train_state.h"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/cuda/optim_cuda.h"

namespace fp8rl::engine {
namespace {

namespace kc = kernels::cuda;
using kernels::ScalingMode;

class CudaTrainDevice : public TrainDevice {
 public:
  explicit CudaTrainDevice(kc::Stream stream) : stream_(stream) {}

  absl::Status init() {
    auto ws = allocate(kc::kSumSquaresWorkspaceBytes, "grad-norm workspace");
    if (!ws.ok()) return ws.status();
    workspace_ = *ws;
    return absl::OkStatus();
  }

  std::string_view name() const override { return "cuda"; }
  CUstream_st* stream() const override { return stream_; }

  absl::StatusOr<void*> allocate(int64_t bytes, const std::string& what) override {
    if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative size"));
    auto buf = kc::DeviceBuffer::allocate(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    if (!buf.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("GPU memory: ", what, " needs ", bytes, " bytes: ", buf.status().message()));
    }
    void* p = buf->data();
    buffers_.push_back(*std::move(buf));
    if (auto s = kc::fill_zero(p, std::max<int64_t>(bytes, 1), stream_); !s.ok()) return s;
    return p;
  }
  void release(void* p) override {
    if (p == nullptr) return;
    // Kernels queued on the stream may still read it: wait for them first (an error here shows
    // again at the next call that waits).
    kc::synchronize(stream_).IgnoreError();
    std::erase_if(buffers_, [p](const kc::DeviceBuffer& b) { return b.data() == p; });
  }
  absl::Status fill_zero(void* dst, int64_t bytes) override {
    return kc::fill_zero(dst, bytes, stream_);
  }
  absl::Status upload(void* dst, const void* src, int64_t bytes) override {
    return kc::copy_to_device(dst, src, static_cast<size_t>(bytes), stream_);
  }
  absl::Status download(void* dst, const void* src, int64_t bytes) const override {
    return kc::copy_to_host(dst, src, static_cast<size_t>(bytes), stream_);
  }
  absl::StatusOr<double> scale_and_sum_squares(float* g, int64_t n, float scale) override {
    return kc::scale_and_sum_squares(g, n, scale, workspace_, stream_);
  }
  absl::Status adamw(float* p, float* m, float* v, float* g, int64_t n, float clip, bool decay,
                     const kernels::dm::AdamWCoeffs& c) override {
    return kc::adamw_step(p, m, v, g, n, clip, decay, c, stream_);
  }
  int64_t block_scale_count(int64_t rows, int64_t cols) const override {
    return kc::gemm_scale_count(ScalingMode::kBlock128x128, rows, cols);
  }
  absl::Status quantize_block128(const float* x, int64_t rows, int64_t cols, bool pow2,
                                 uint8_t* codes, float* scales) override {
    return kc::quantize(x, rows, cols, ScalingMode::kBlock128x128, {.pow2_scales = pow2}, codes,
                        scales, stream_);
  }
  absl::Status transpose_block128(const uint8_t* codes, const float* scales, int64_t rows,
                                  int64_t cols, uint8_t* t_codes, float* t_scales) override {
    return kc::transpose_blocks_into({rows, cols, ScalingMode::kBlock128x128, codes, scales},
                                     t_codes, t_scales, stream_);
  }
  absl::Status upload_block128(const kernels::Fp8Matrix& host, uint8_t* codes,
                               float* scales) override {
    if (host.mode != ScalingMode::kBlock128x128) {
      return absl::InvalidArgumentError("upload_block128: not a 128x128-block matrix");
    }
    auto gemm = kc::scales_to_gemm_layout(host);
    if (!gemm.ok()) return gemm.status();
    if (auto s = upload(codes, host.data.data(), static_cast<int64_t>(host.data.size())); !s.ok()) {
      return s;
    }
    return upload(scales, gemm->data(), 4 * static_cast<int64_t>(gemm->size()));
  }
  absl::StatusOr<kernels::Fp8Matrix> download_block128(const uint8_t* codes, const float* scales,
                                                       int64_t rows, int64_t cols) const override {
    return kc::download({rows, cols, ScalingMode::kBlock128x128, codes, scales}, stream_);
  }
  absl::Status round_bf16(const float* x, int64_t n, uint16_t* out) const override {
    return kc::round_bf16(x, n, out, stream_);
  }
  absl::Status amax_into(const float* x, int64_t n, float* slot) override {
    return kc::amax_into(x, n, slot, stream_);
  }
  absl::Status amax_into_bf16(const uint16_t* x, int64_t n, float* slot) override {
    return kc::amax_into_bf16(x, n, slot, stream_);
  }
  absl::Status synchronize() const override { return kc::synchronize(stream_); }

 private:
  kc::Stream stream_;
  void* workspace_ = nullptr;
  std::vector<kc::DeviceBuffer> buffers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainDevice>> make_cuda_train_device(CUstream_st* stream) {
  if (auto dev = kc::require_sm90(); !dev.ok()) return dev.status();
  auto device = std::make_unique<CudaTrainDevice>(stream);
  if (auto s = device->init(); !s.ok()) return s;
  return device;
}

}  // namespace fp8rl::engine
