// The CPU mirror of the trainer's device (TrainDevice on host memory): the same kernels::dm
// arithmetic as the CUDA kernels, the sequential grad-norm sum of model::AdamW, kernels::quantize
// for the 128x128 blocks. It makes DeviceTrainState testable without a GPU and bit-identical to
// model::AdamW + Model::refresh.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/train_state.h"
#include "kernels/device_math/adamw.h"
#include "kernels/device_math/hd.h"
#include "kernels/quantize.h"

namespace fp8rl::engine {
namespace {

constexpr std::align_val_t kHostAlign{256};

struct AlignedFree {
  void operator()(std::byte* p) const { ::operator delete[](p, kHostAlign); }
};

class HostTrainDevice : public TrainDevice {
 public:
  std::string_view name() const override { return "host"; }
  CUstream_st* stream() const override { return nullptr; }

  absl::StatusOr<void*> allocate(int64_t bytes, const std::string& what) override {
    if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative size"));
    auto* p = static_cast<std::byte*>(
        ::operator new[](std::max<int64_t>(bytes, 1), kHostAlign, std::nothrow));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host memory: ", what, " needs ", bytes, " bytes"));
    }
    std::memset(p, 0, std::max<int64_t>(bytes, 1));
    blocks_.emplace_back(p);
    return static_cast<void*>(p);
  }
  void release(void* p) override {
    std::erase_if(blocks_, [p](const auto& b) { return b.get() == p; });
  }
  absl::Status fill_zero(void* dst, int64_t bytes) override {
    std::memset(dst, 0, bytes);
    return absl::OkStatus();
  }
  absl::Status upload(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status download(void* dst, const void* src, int64_t bytes) const override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }

  // model::AdamW::step's loop: sequential, each square exact in double.
  absl::StatusOr<double> scale_and_sum_squares(float* g, int64_t n, float scale) override {
    double sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      g[i] *= scale;
      sq += static_cast<double>(g[i]) * g[i];
    }
    return sq;
  }
  absl::Status adamw(float* p, float* m, float* v, float* g, int64_t n, float clip, bool decay,
                     const kernels::dm::AdamWCoeffs& c) override {
    for (int64_t i = 0; i < n; ++i) {
      g[i] = g[i] * clip;
      kernels::dm::adamw_update(g[i], decay, c, p[i], m[i], v[i]);
    }
    return absl::OkStatus();
  }

  int64_t block_scale_count(int64_t rows, int64_t cols) const override {
    return kernels::ceil_div(rows, kernels::kBlock) * kernels::ceil_div(cols, kernels::kBlock);
  }
  absl::Status quantize_block128(const float* x, int64_t rows, int64_t cols, bool pow2,
                                 uint8_t* codes, float* scales) override {
    const kernels::Fp8Matrix q = kernels::quantize(
        x, rows, cols, kernels::ScalingMode::kBlock128x128, {.pow2_scales = pow2});
    return upload_block128(q, codes, scales);
  }
  absl::Status transpose_block128(const uint8_t* codes, const float* scales, int64_t rows,
                                  int64_t cols, uint8_t* t_codes, float* t_scales) override {
    auto w = download_block128(codes, scales, rows, cols);
    if (!w.ok()) return w.status();
    return upload_block128(kernels::transpose_blocks(*w), t_codes, t_scales);
  }
  absl::Status upload_block128(const kernels::Fp8Matrix& host, uint8_t* codes,
                               float* scales) override {
    if (host.mode != kernels::ScalingMode::kBlock128x128) {
      return absl::InvalidArgumentError("upload_block128: not a 128x128-block matrix");
    }
    std::memcpy(codes, host.data.data(), host.data.size());
    std::memcpy(scales, host.scale_inv.data(), 4 * host.scale_inv.size());
    return absl::OkStatus();
  }
  absl::StatusOr<kernels::Fp8Matrix> download_block128(const uint8_t* codes, const float* scales,
                                                       int64_t rows, int64_t cols) const override {
    kernels::Fp8Matrix q;
    q.rows = rows;
    q.cols = cols;
    q.mode = kernels::ScalingMode::kBlock128x128;
    q.data.assign(codes, codes + rows * cols);
    q.scale_inv.assign(scales, scales + block_scale_count(rows, cols));
    return q;
  }
  absl::Status round_bf16(const float* x, int64_t n, uint16_t* out) const override {
    for (int64_t i = 0; i < n; ++i) out[i] = kernels::dm::float_to_bf16(x[i]);
    return absl::OkStatus();
  }
  // std::max(m, |x|) as the CPU forward's amax_of: a NaN compares false and is skipped.
  absl::Status amax_into(const float* x, int64_t n, float* slot) override {
    float m = *slot;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
    *slot = m;
    return absl::OkStatus();
  }
  absl::Status amax_into_bf16(const uint16_t* x, int64_t n, float* slot) override {
    float m = *slot;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(kernels::dm::bf16_to_float(x[i])));
    *slot = m;
    return absl::OkStatus();
  }
  absl::Status synchronize() const override { return absl::OkStatus(); }

 private:
  std::vector<std::unique_ptr<std::byte[], AlignedFree>> blocks_;
};

}  // namespace

std::unique_ptr<TrainDevice> make_cpu_train_device() { return std::make_unique<HostTrainDevice>(); }

}  // namespace fp8rl::engine
