// CudaTrainOps: device weights in the training GEMM formats, the step's tables and scratch, and
// the training step's ops over kernels/cuda (engine/cuda/cuda_train_ops.h).
#include "engine/cuda/cuda_train_ops.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "engine/cpu/decoder_ops.h"
#include "engine/cuda/step_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decoder_cuda.h"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/cuda/train_cuda.h"
#include "kernels/formats.h"

namespace fp8rl::engine {
namespace {

namespace kc = kernels::cuda;
namespace dm = kernels::dm;
using kernels::ScalingMode;

#define FP8RL_TRY(expr)                                \
  do {                                                 \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)

// How a linear runs on the device.
enum class LinearKind { kF64Acc, kBf16Lt, kFp8Lt };

struct DeviceTrainLinear {
  LinearKind kind = LinearKind::kF64Acc;
  model::Precision precision = model::Precision::kF32;
  int64_t out = 0, in = 0;
  kc::DeviceBuffer dense;          // kF64Acc: fp32 values [out, in] (bf16-valued for bf16)
  kc::DeviceBuffer bf16, bf16_t;   // kBf16Lt: bf16 bits [out, in] and [in, out]
  kc::Fp8DeviceMatrix fp8, fp8_t;  // kFp8Lt: 128x128 blocks of W [out, in] and W^T [in, out]
};

dm::KvDtype kv_dtype(model::KvCacheDtype d) {
  return d == model::KvCacheDtype::kF32    ? dm::KvDtype::kF32
         : d == model::KvCacheDtype::kBF16 ? dm::KvDtype::kBF16
                                           : dm::KvDtype::kFP8;
}

int64_t round_up16(int64_t n) { return (n + 15) / 16 * 16; }

// Device scratch that grows to the largest request (contents not kept across growth; the stream
// is drained first so no queued kernel still reads the old buffer).
class Scratch {
 public:
  template <typename T>
  absl::StatusOr<T*> get(int64_t count, kc::Stream stream) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
    if (buf_.bytes() < bytes) {
      if (absl::Status s = kc::synchronize(stream); !s.ok()) return s;
      auto b = kc::DeviceBuffer::allocate(bytes);
      if (!b.ok()) return b.status();
      buf_ = *std::move(b);
    }
    return buf_.as<T>();
  }

 private:
  kc::DeviceBuffer buf_;
};

// cuBLASLt FP8 rules for fprop (K = in), dgrad (K = out) and wgrad (M = out, N = in).
absl::Status check_fp8_shape(const model::LinearWeight& w, int64_t layer, int64_t j) {
  if (w.precision != model::Precision::kFP8 || (w.in % 16 == 0 && w.out % 16 == 0)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "layer ", layer, " linear ", j,
      ": FP8 training on CUDA needs in and out multiples of 16, got [", w.out, ", ", w.in, "]"));
}

class CudaTrainOpsImpl final : public CudaTrainOps {
 public:
  explicit CudaTrainOpsImpl(const model::Model& model)
      : config_(model.config()), policy_(model.policy()), layout_(model.layout()) {}
  ~CudaTrainOpsImpl() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status init(const model::Model& model) {
    // What the model asks of the device is checked before the device is touched.
    if (config_.is_moe()) {
      return absl::FailedPreconditionError(
          "CUDA training step: MoE training on CUDA is not built (this model has experts); use "
          "--device cpu");
    }
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
      for (int64_t j = 0; j < 7; ++j) FP8RL_TRY(check_fp8_shape(model.layer_linear(l, j), l, j));
    }
    auto dev = kc::require_sm90();
    if (!dev.ok()) return dev.status();
    FP8RL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    auto gemm = kc::CublasLtGemm::create();
    if (!gemm.ok()) return gemm.status();
    gemm_ = *std::move(gemm);
    return upload_weights(model);
  }

  absl::Status upload_weights(const model::Model& m) override;
  absl::Status refresh_from_device(const float* master) override;
  absl::Status install_working(const model::Model::WorkingStreams& all) override;
  absl::Status set_kv_scales(const model::KvScales& scales) override {
    if (static_cast<int64_t>(scales.k.size()) != config_.num_hidden_layers ||
        static_cast<int64_t>(scales.v.size()) != config_.num_hidden_layers) {
      return absl::InvalidArgumentError("set_kv_scales: one k and one v scale per layer");
    }
    kv_scales_ = scales;
    return absl::OkStatus();
  }
  absl::StatusOr<float*> allocate(int64_t floats) override {
    auto b = kc::DeviceBuffer::allocate(static_cast<size_t>(std::max<int64_t>(floats, 1)) * 4);
    if (!b.ok()) return b.status();
    FP8RL_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b->data(), 0, b->bytes(), stream_));
    owned_.push_back(*std::move(b));
    return owned_.back().as<float>();
  }
  kc::Stream stream() const override { return stream_; }

  absl::Status load_tables(const TrainTables& t) override;
  absl::Status embed(float* x) override {
    return kc::embed_gather(embed_.as<float>(), config_.vocab_size, config_.hidden_size, d_tokens_,
                            rows_, x, nullptr, stream_);
  }
  absl::Status rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, bool rb, float* y,
                       float* inv) override {
    return kc::rmsnorm(x, g, rows, h, static_cast<float>(config_.rms_norm_eps), rb, y, inv,
                       stream_);
  }
  absl::Status rope(int64_t heads, bool rb, bool inverse, float* x) override {
    if (inverse) {
      return kc::rope_inverse(rope_cos_.as<float>(), rope_sin_.as<float>(), d_pos_, rows_, heads,
                              config_.head_dim, x, stream_);
    }
    return kc::rope(rope_cos_.as<float>(), rope_sin_.as<float>(), d_pos_, rows_, heads,
                    config_.head_dim, rb, x, stream_);
  }
  absl::Status linear(int64_t layer, int64_t j, const float* x, int64_t rows, const float* bias,
                      float* y) override;
  absl::Status seq_amax(const float* k, const float* v, float* k_amax_host,
                        float* v_amax_host) override {
    auto amax = amax_.get<float>(2 * n_seq_, stream_);
    if (!amax.ok()) return amax.status();
    FP8RL_TRY(kc::seq_amax(k, config_.kv_dim(), d_seq_start_, n_seq_, *amax, stream_));
    FP8RL_TRY(kc::seq_amax(v, config_.kv_dim(), d_seq_start_, n_seq_, *amax + n_seq_, stream_));
    FP8RL_TRY(kc::copy_to_host(k_amax_host, *amax, n_seq_ * 4, stream_));
    return kc::copy_to_host(v_amax_host, *amax + n_seq_, n_seq_ * 4, stream_);
  }
  absl::Status kv_fake_quant(int64_t layer, float* k, float* v) override {
    const int64_t n = rows_ * config_.kv_dim();
    const dm::KvDtype d = kv_dtype(policy_.kv_cache);
    FP8RL_TRY(kc::kv_fake_quant(k, n, d, kv_scales_.k[layer], stream_));
    return kc::kv_fake_quant(v, n, d, kv_scales_.v[layer], stream_);
  }
  absl::Status attention(const float* q, const float* k, const float* v, float* o) override {
    return kc::attention_prefill(q, k, v, d_seq_start_, n_seq_, rows_, config_.num_attention_heads,
                                 config_.num_key_value_heads, config_.head_dim, scale(), o,
                                 stream_);
  }
  absl::Status swiglu(const float* g, const float* u, int64_t n, bool rb, float* act) override {
    return kc::swiglu(g, u, n, rb, act, stream_);
  }
  absl::Status add(float* y, const float* x, int64_t n, bool rb) override {
    return kc::add(y, x, n, rb, stream_);
  }
  absl::Status round_bf16(float* x, int64_t n) override { return cuda::round_bf16(x, n, stream_); }
  absl::Status log_softmax(const float* z, int64_t row0, int64_t rows, float inv_t, float* lse,
                           float* logprob) override {
    return kc::log_softmax(z, rows, config_.vocab_size, inv_t, d_targets_ + row0, lse, logprob,
                           stream_);
  }
  absl::Status head_dlogits(float* z, int64_t row0, int64_t rows, float inv_t, const float* lse,
                            const float* dlogp) override {
    return kc::head_dlogits(z, rows, config_.vocab_size, inv_t, d_targets_ + row0, lse, dlogp,
                            stream_);
  }
  absl::Status linear_backward(int64_t layer, int64_t j, const float* x, const float* dy,
                               int64_t rows, float* dx, float* dw, float* db) override;
  absl::Status rmsnorm_backward(const float* x, const float* g, const float* inv, const float* dy,
                                int64_t rows, int64_t h, float* dx, float* dg) override {
    return kc::rmsnorm_backward(x, g, inv, dy, rows, h, dx, dg, stream_);
  }
  absl::Status attention_backward(const float* q, const float* k, const float* v, const float* dout,
                                  float* dq, float* dk, float* dv) override {
    auto stats = stats_.get<float>(rows_ * config_.num_attention_heads * 3, stream_);
    if (!stats.ok()) return stats.status();
    return kc::attention_backward(q, k, v, dout, d_seq_start_, d_row_seq_, rows_,
                                  config_.num_attention_heads, config_.num_key_value_heads,
                                  config_.head_dim, scale(), *stats, dq, dk, dv, stream_);
  }
  absl::Status swiglu_backward(const float* g, const float* u, const float* dact, int64_t n,
                               float* dg, float* du) override {
    return kc::swiglu_backward(g, u, dact, n, dg, du, stream_);
  }
  // Mixture of experts: not built on CUDA (no grouped expert GEMMs or router kernels here); Create
  // refuses MoE models, so the step never reaches these.
  absl::Status moe(int64_t layer, const float*, int64_t, const int32_t*, MoeRouteHost*,
                   float*) override {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA training step: layer ", layer, ": MoE training on CUDA is not built"));
  }
  absl::Status moe_backward(int64_t layer, const float*, const float*, int64_t, const float*,
                            float*, model::GradientSink&) override {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA training step: layer ", layer, ": MoE training on CUDA is not built"));
  }
  absl::Status embed_backward(const float* dx, float* dembed) override {
    return kc::embed_backward(dx, d_tokens_, rows_, config_.hidden_size, dembed, stream_);
  }
  absl::Status copy(float* dst, const float* src, int64_t n) override {
    FP8RL_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
  }
  absl::Status zero(float* x, int64_t n) override {
    FP8RL_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(x, 0, n * sizeof(float), stream_));
    return absl::OkStatus();
  }
  absl::Status to_host(float* dst_host, const float* src, int64_t n) override {
    return kc::copy_to_host(dst_host, src, n * sizeof(float), stream_);
  }
  absl::Status from_host(float* dst, const float* src_host, int64_t n) override {
    return kc::copy_to_device(dst, src_host, n * sizeof(float), stream_);
  }
  absl::Status synchronize() override { return kc::synchronize(stream_); }
  const float* small(int64_t offset) const override {
    auto it = small_.find(offset);
    return it == small_.end() ? nullptr : it->second.as<float>();
  }

 private:
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(config_.head_dim)); }
  DeviceTrainLinear& weight(int64_t layer, int64_t j) {
    return layer < 0 ? head_ : linears_[layer][j];
  }
  absl::Status place(const model::LinearWeight& w, DeviceTrainLinear& d, const std::string& what);
  // Quantizes x [rows (padded to 8), cols] in 1x128 tiles into scratch slot `slot`.
  absl::StatusOr<kc::Fp8DeviceView> quantize_tiles(const float* x, int64_t rows, int64_t cols,
                                                   int slot);

  model::ModelConfig config_;
  model::PrecisionPolicy policy_;
  model::ParamLayout layout_;
  model::KvScales kv_scales_;
  kc::Stream stream_ = nullptr;
  std::unique_ptr<kc::CublasLtGemm> gemm_;
  std::vector<std::array<DeviceTrainLinear, 7>> linears_;
  DeviceTrainLinear head_;
  kc::DeviceBuffer embed_, rope_cos_, rope_sin_;
  std::unordered_map<int64_t, kc::DeviceBuffer> small_;
  std::vector<kc::DeviceBuffer> owned_;

  // The step's tables.
  int64_t rows_ = 0, n_seq_ = 0;
  kc::DeviceBuffer tables_;
  int32_t *d_tokens_ = nullptr, *d_pos_ = nullptr, *d_row_seq_ = nullptr, *d_seq_start_ = nullptr,
          *d_targets_ = nullptr;
  // GEMM and kernel scratch.
  Scratch amax_, stats_, bf16_a_, bf16_b_, f32_a_, f32_b_;
  std::array<Scratch, 2> codes_, scales_;
};

absl::Status CudaTrainOpsImpl::place(const model::LinearWeight& w, DeviceTrainLinear& d,
                                     const std::string& what) {
  d.precision = w.precision;
  d.out = w.out;
  d.in = w.in;
  auto upload = [&](kc::DeviceBuffer& dst, const void* src, size_t bytes) -> absl::Status {
    if (dst.bytes() != bytes) {
      auto b = kc::DeviceBuffer::allocate(bytes);
      if (!b.ok()) return b.status();
      dst = *std::move(b);
    }
    return kc::copy_to_device(dst.data(), src, bytes, stream_);
  };
  if (w.precision == model::Precision::kFP8) {
    // cuBLASLt FP8 rules for fprop (K = in), dgrad (K = out) and wgrad (M = out, N = in).
    if (w.in % 16 != 0 || w.out % 16 != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": FP8 training on CUDA needs in and out multiples of 16, got [",
                       w.out, ", ", w.in, "]"));
    }
    d.kind = LinearKind::kFp8Lt;
    auto q = kc::upload(w.q, stream_);
    if (!q.ok()) return q.status();
    auto qt = kc::upload(w.qt, stream_);
    if (!qt.ok()) return qt.status();
    d.fp8 = *std::move(q);
    d.fp8_t = *std::move(qt);
    return absl::OkStatus();
  }
  const std::vector<float> values = linear_values(w);
  if (static_cast<int64_t>(values.size()) != w.out * w.in) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": the model holds no weights"));
  }
  const bool lt_ok = w.in % 8 == 0 && w.out % 8 == 0;
  d.kind =
      w.precision == model::Precision::kBF16 && lt_ok ? LinearKind::kBf16Lt : LinearKind::kF64Acc;
  if (d.kind == LinearKind::kBf16Lt) {
    std::vector<uint16_t> bits(values.size()), bits_t(values.size());
    for (int64_t r = 0; r < w.out; ++r) {
      for (int64_t c = 0; c < w.in; ++c) {
        const uint16_t b = kernels::float_to_bf16(values[r * w.in + c]);
        bits[r * w.in + c] = b;
        bits_t[c * w.out + r] = b;
      }
    }
    FP8RL_TRY(upload(d.bf16, bits.data(), bits.size() * 2));
    return upload(d.bf16_t, bits_t.data(), bits_t.size() * 2);
  }
  return upload(d.dense, values.data(), values.size() * 4);
}

absl::Status CudaTrainOpsImpl::upload_weights(const model::Model& m) {
  if (m.config().hidden_size != config_.hidden_size ||
      m.config().num_hidden_layers != config_.num_hidden_layers || !(m.policy() == policy_)) {
    return absl::InvalidArgumentError("upload_weights: another model shape or policy");
  }
  linears_.resize(config_.num_hidden_layers);
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    for (int64_t j = 0; j < 7; ++j) {
      FP8RL_TRY(
          place(m.layer_linear(l, j), linears_[l][j], absl::StrCat("layer ", l, " linear ", j)));
    }
  }
  FP8RL_TRY(place(m.lm_head_weight(), head_, "lm_head"));
  auto upload = [&](kc::DeviceBuffer& dst, const float* src, int64_t n) -> absl::Status {
    if (dst.bytes() != static_cast<size_t>(n) * 4) {
      auto b = kc::DeviceBuffer::allocate(static_cast<size_t>(n) * 4);
      if (!b.ok()) return b.status();
      dst = *std::move(b);
    }
    return kc::copy_to_device(dst.data(), src, static_cast<size_t>(n) * 4, stream_);
  };
  const std::vector<float> table = linear_values(m.embedding_weight());
  if (static_cast<int64_t>(table.size()) != config_.vocab_size * config_.hidden_size) {
    return absl::FailedPreconditionError("embedding: the model holds no fp32/bf16 table");
  }
  FP8RL_TRY(upload(embed_, table.data(), static_cast<int64_t>(table.size())));
  FP8RL_TRY(upload(rope_cos_, m.rope_cos().data(), static_cast<int64_t>(m.rope_cos().size())));
  FP8RL_TRY(upload(rope_sin_, m.rope_sin().data(), static_cast<int64_t>(m.rope_sin().size())));
  for (const model::ParamInfo& info : layout_.params()) {
    if (info.kind == model::ParamKind::kNorm || info.kind == model::ParamKind::kBias) {
      FP8RL_TRY(upload(small_[info.offset], m.norm_or_bias(info.offset), info.numel));
    }
  }
  kv_scales_ = m.kv_scales();
  return kc::synchronize(stream_);
}

absl::Status CudaTrainOpsImpl::refresh_from_device(const float* master) {
  if (master == nullptr) return absl::InvalidArgumentError("refresh_from_device: master is null");
  const bool rb = policy_.bf16_activations();
  auto derive = [&](DeviceTrainLinear& d, int64_t offset) -> absl::Status {
    const float* src = master + offset;
    const int64_t n = d.out * d.in;
    switch (d.kind) {
      case LinearKind::kFp8Lt:
        FP8RL_TRY(kc::quantize(src, d.out, d.in, ScalingMode::kBlock128x128,
                               {.pow2_scales = policy_.pow2_scales}, d.fp8.data(),
                               d.fp8.scale_inv(), stream_));
        return kc::transpose_blocks(d.fp8.view(), d.fp8_t, stream_);
      case LinearKind::kBf16Lt:
        // W and W^T ([in, out]: the transpose of W's rows = out, cols = in, ld = out).
        FP8RL_TRY(kc::to_bf16_bits(src, n, d.bf16.as<uint16_t>(), stream_));
        return kc::transpose_pad(src, d.out, d.in, d.out, nullptr, d.bf16_t.as<uint16_t>(),
                                 stream_);
      case LinearKind::kF64Acc:
        FP8RL_TRY(copy(d.dense.as<float>(), src, n));
        return d.precision == model::Precision::kF32
                   ? absl::OkStatus()
                   : cuda::round_bf16(d.dense.as<float>(), n, stream_);
    }
    return absl::OkStatus();
  };
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const model::LayerOffsets& lo = layout_.layer(l);
    const std::array<int64_t, 7> offsets = {lo.q, lo.k, lo.v, lo.o, lo.gate, lo.up, lo.down};
    for (int64_t j = 0; j < 7; ++j) FP8RL_TRY(derive(linears_[l][j], offsets[j]));
  }
  FP8RL_TRY(derive(head_, layout_.lm_head()));  // the embedding's values when tied
  // Embedding table: bf16 values when activations are bf16 (Model::refresh), else fp32.
  const int64_t table = config_.vocab_size * config_.hidden_size;
  FP8RL_TRY(copy(embed_.as<float>(), master + layout_.embed(), table));
  if (rb) FP8RL_TRY(cuda::round_bf16(embed_.as<float>(), table, stream_));
  for (const model::ParamInfo& info : layout_.params()) {
    if (info.kind != model::ParamKind::kNorm && info.kind != model::ParamKind::kBias) continue;
    float* dst = small_.at(info.offset).as<float>();
    FP8RL_TRY(copy(dst, master + info.offset, info.numel));
    if (rb) FP8RL_TRY(cuda::round_bf16(dst, info.numel, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaTrainOpsImpl::install_working(const model::Model::WorkingStreams& all) {
  // Where each parameter's piece of the streams starts, in Model::install_working's order: an FP8
  // linear's codes and scales, every other tensor's bf16 bits.
  struct At {
    const uint8_t* codes;
    const float* scales;
    const uint16_t* bits;
  };
  std::unordered_map<int64_t, At> at;
  int64_t nc = 0, ns = 0, nb = 0;
  const int64_t n_layers = config_.num_hidden_layers;
  for (const model::ParamInfo& p : layout_.params()) {
    at[p.offset] = {all.codes.data() + std::min<int64_t>(nc, std::ssize(all.codes)),
                    all.scales.data() + std::min<int64_t>(ns, std::ssize(all.scales)),
                    all.bf16.data() + std::min<int64_t>(nb, std::ssize(all.bf16))};
    if (p.kind == model::ParamKind::kLinear &&
        policy_.layer_linear(p.layer, n_layers) == model::Precision::kFP8) {
      nc += p.numel;
      ns += kernels::ceil_div(p.shape[0], kernels::kBlock) *
            kernels::ceil_div(p.shape[1], kernels::kBlock);
    } else {
      nb += p.numel;
    }
  }
  if (nc != std::ssize(all.codes) || ns != std::ssize(all.scales) || nb != std::ssize(all.bf16)) {
    return absl::InvalidArgumentError(absl::StrCat("install_working: streams of ", all.codes.size(),
                                                   " codes, ", all.scales.size(), " scales and ",
                                                   all.bf16.size(), " bf16 values; the layout has ",
                                                   nc, ", ", ns, " and ", nb));
  }
  std::vector<float> values;  // host scratch: bf16 bits as floats
  auto to_device_floats = [&](void* dst, const uint16_t* bits, int64_t n) -> absl::Status {
    values.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) values[i] = kernels::bf16_to_float(bits[i]);
    return kc::copy_to_device(dst, values.data(), static_cast<size_t>(n) * 4, stream_);
  };
  auto install = [&](DeviceTrainLinear& d, int64_t offset) -> absl::Status {
    const At& a = at.at(offset);
    const int64_t n = d.out * d.in;
    switch (d.kind) {
      case LinearKind::kFp8Lt: {
        kernels::Fp8Matrix q;
        q.rows = d.out;
        q.cols = d.in;
        q.mode = ScalingMode::kBlock128x128;
        q.data.assign(a.codes, a.codes + n);
        q.scale_inv.assign(a.scales, a.scales + q.scale_rows() * q.scale_cols());
        auto gemm = kc::scales_to_gemm_layout(q);
        if (!gemm.ok()) return gemm.status();
        FP8RL_TRY(kc::copy_to_device(d.fp8.data(), q.data.data(), q.data.size(), stream_));
        FP8RL_TRY(kc::copy_to_device(d.fp8.scale_inv(), gemm->data(), gemm->size() * 4, stream_));
        return kc::transpose_blocks(d.fp8.view(), d.fp8_t, stream_);
      }
      case LinearKind::kBf16Lt: {
        // W [out, in] and W^T [in, out] (the transpose of the bits is exact).
        std::vector<uint16_t> t(static_cast<size_t>(n));
        for (int64_t r = 0; r < d.out; ++r) {
          for (int64_t c = 0; c < d.in; ++c) t[c * d.out + r] = a.bits[r * d.in + c];
        }
        FP8RL_TRY(kc::copy_to_device(d.bf16.data(), a.bits, static_cast<size_t>(n) * 2, stream_));
        return kc::copy_to_device(d.bf16_t.data(), t.data(), static_cast<size_t>(n) * 2, stream_);
      }
      case LinearKind::kF64Acc:
        return to_device_floats(d.dense.data(), a.bits, n);
    }
    return absl::OkStatus();
  };
  for (int64_t l = 0; l < n_layers; ++l) {
    const model::LayerOffsets& lo = layout_.layer(l);
    const std::array<int64_t, 7> offsets = {lo.q, lo.k, lo.v, lo.o, lo.gate, lo.up, lo.down};
    for (int64_t j = 0; j < 7; ++j) FP8RL_TRY(install(linears_[l][j], offsets[j]));
  }
  FP8RL_TRY(install(head_, layout_.lm_head()));  // the embedding's bits when tied
  // A sharded group has bf16 working copies (Model::check_bf16_working): the embedding table and
  // the norms and biases hold bf16 values, as refresh_from_device rounds them.
  FP8RL_TRY(to_device_floats(embed_.data(), at.at(layout_.embed()).bits,
                             config_.vocab_size * config_.hidden_size));
  for (const model::ParamInfo& info : layout_.params()) {
    if (info.kind != model::ParamKind::kNorm && info.kind != model::ParamKind::kBias) continue;
    FP8RL_TRY(to_device_floats(small_.at(info.offset).data(), at.at(info.offset).bits, info.numel));
  }
  return kc::synchronize(stream_);
}

absl::Status CudaTrainOpsImpl::load_tables(const TrainTables& t) {
  rows_ = t.rows;
  n_seq_ = t.n_seq;
  // One int32 upload: tokens, pos, row_seq, targets [rows each], seq_start [n_seq + 1].
  std::vector<int32_t> all;
  all.reserve(4 * t.rows + t.n_seq + 1);
  for (const auto* v : {&t.tokens, &t.pos, &t.row_seq, &t.targets, &t.seq_start}) {
    all.insert(all.end(), v->begin(), v->end());
  }
  const size_t bytes = all.size() * 4;
  if (tables_.bytes() < bytes) {
    FP8RL_TRY(kc::synchronize(stream_));  // queued kernels may still read the old tables
    auto b = kc::DeviceBuffer::allocate(bytes);
    if (!b.ok()) return b.status();
    tables_ = *std::move(b);
  }
  FP8RL_TRY(kc::copy_to_device(tables_.data(), all.data(), bytes, stream_));
  int32_t* p = tables_.as<int32_t>();
  d_tokens_ = p;
  d_pos_ = p + t.rows;
  d_row_seq_ = p + 2 * t.rows;
  d_targets_ = p + 3 * t.rows;
  d_seq_start_ = p + 4 * t.rows;
  return absl::OkStatus();
}

absl::StatusOr<kc::Fp8DeviceView> CudaTrainOpsImpl::quantize_tiles(const float* x, int64_t rows,
                                                                   int64_t cols, int slot) {
  auto codes = codes_[slot].get<uint8_t>(rows * cols, stream_);
  if (!codes.ok()) return codes.status();
  auto scales =
      scales_[slot].get<float>(kc::gemm_scale_count(ScalingMode::kTile1x128, rows, cols), stream_);
  if (!scales.ok()) return scales.status();
  FP8RL_TRY(kc::quantize(x, rows, cols, ScalingMode::kTile1x128,
                         {.pow2_scales = policy_.pow2_scales}, *codes, *scales, stream_));
  return kc::Fp8DeviceView{rows, cols, ScalingMode::kTile1x128, *codes, *scales};
}

absl::Status CudaTrainOpsImpl::linear(int64_t layer, int64_t j, const float* x, int64_t rows,
                                      const float* bias, float* y) {
  if (rows == 0) return absl::OkStatus();
  DeviceTrainLinear& w = weight(layer, j);
  const bool rb = w.precision != model::Precision::kF32;  // linear_forward's output rounding
  switch (w.kind) {
    case LinearKind::kF64Acc:
      FP8RL_TRY(kc::gemm_nt_f64acc(x, w.dense.as<float>(), y, rows, w.out, w.in, false, stream_));
      break;
    case LinearKind::kBf16Lt: {
      // x is bf16-valued on bf16 paths; its bits are the GEMM operand.
      auto xb = bf16_a_.get<uint16_t>(rows * w.in, stream_);
      if (!xb.ok()) return xb.status();
      FP8RL_TRY(kc::to_bf16_bits(x, rows * w.in, *xb, stream_));
      FP8RL_TRY(gemm_->gemm_bf16(*xb, w.bf16.as<uint16_t>(), y, rows, w.out, w.in,
                                 kernels::OutDtype::kF32, false, stream_));
      break;
    }
    case LinearKind::kFp8Lt: {
      // fprop: 1x128 activation tiles x 128x128 weight blocks; rows padded to 8 (the buffers
      // hold the padding rows).
      auto a = quantize_tiles(x, padded_rows(rows), w.in, 0);
      if (!a.ok()) return a.status();
      FP8RL_TRY(gemm_->gemm_fp8(*a, w.fp8.view(), y, kernels::OutDtype::kF32, false, stream_));
      break;
    }
  }
  return cuda::bias_round(y, bias, rows, w.out, rb, stream_);
}

absl::Status CudaTrainOpsImpl::linear_backward(int64_t layer, int64_t j, const float* x,
                                               const float* dy, int64_t rows, float* dx, float* dw,
                                               float* db) {
  if (rows == 0) return absl::OkStatus();
  DeviceTrainLinear& w = weight(layer, j);
  const int64_t n = w.out, k = w.in, ld = round_up16(rows);
  if (db != nullptr) FP8RL_TRY(kc::column_sum(dy, rows, n, db, stream_));
  switch (w.kind) {
    case LinearKind::kF64Acc:
      if (dx != nullptr) {
        FP8RL_TRY(kc::gemm_nn_f64acc(dy, w.dense.as<float>(), dx, rows, k, n, stream_));
      }
      if (dw != nullptr) FP8RL_TRY(kc::gemm_tn_f64acc(dy, x, dw, n, k, rows, stream_));
      return absl::OkStatus();
    case LinearKind::kBf16Lt: {
      if (dx != nullptr) {
        // dgrad: dX[m, k] = bf16(dY)[m, n] . (W^T [k, n])^T.
        auto dyb = bf16_a_.get<uint16_t>(rows * n, stream_);
        if (!dyb.ok()) return dyb.status();
        FP8RL_TRY(kc::to_bf16_bits(dy, rows * n, *dyb, stream_));
        FP8RL_TRY(gemm_->gemm_bf16(*dyb, w.bf16_t.as<uint16_t>(), dx, rows, k, n,
                                   kernels::OutDtype::kF32, false, stream_));
      }
      if (dw != nullptr) {
        // wgrad: dW[n, k] += bf16(dY^T)[n, ld] . (bf16(X^T)[k, ld])^T, tokens zero-padded to ld.
        auto dyt = bf16_a_.get<uint16_t>(n * ld, stream_);
        auto xt = bf16_b_.get<uint16_t>(k * ld, stream_);
        if (!dyt.ok()) return dyt.status();
        if (!xt.ok()) return xt.status();
        FP8RL_TRY(kc::transpose_pad(dy, rows, n, ld, nullptr, *dyt, stream_));
        FP8RL_TRY(kc::transpose_pad(x, rows, k, ld, nullptr, *xt, stream_));
        FP8RL_TRY(
            gemm_->gemm_bf16(*dyt, *xt, dw, n, k, ld, kernels::OutDtype::kF32, true, stream_));
      }
      return absl::OkStatus();
    }
    case LinearKind::kFp8Lt: {
      if (dx != nullptr) {
        // dgrad: 1x128 tiles of dY [m, n] x the transposed 128x128 blocks of W ([k, n]).
        auto a = quantize_tiles(dy, padded_rows(rows), n, 0);
        if (!a.ok()) return a.status();
        FP8RL_TRY(gemm_->gemm_fp8(*a, w.fp8_t.view(), dx, kernels::OutDtype::kF32, false, stream_));
      }
      if (dw != nullptr) {
        // wgrad: dY^T [n, ld] and X^T [k, ld], both 1x128 along the tokens (zero padding leaves
        // every tile's amax, hence its scale, as the CPU's partial edge tile has it).
        auto dyt = f32_a_.get<float>(n * ld, stream_);
        auto xt = f32_b_.get<float>(k * ld, stream_);
        if (!dyt.ok()) return dyt.status();
        if (!xt.ok()) return xt.status();
        FP8RL_TRY(kc::transpose_pad(dy, rows, n, ld, *dyt, nullptr, stream_));
        FP8RL_TRY(kc::transpose_pad(x, rows, k, ld, *xt, nullptr, stream_));
        auto a = quantize_tiles(*dyt, n, ld, 0);
        if (!a.ok()) return a.status();
        auto b = quantize_tiles(*xt, k, ld, 1);
        if (!b.ok()) return b.status();
        FP8RL_TRY(gemm_->gemm_fp8(*a, *b, dw, kernels::OutDtype::kF32, true, stream_));
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaTrainOps>> CudaTrainOps::Create(const model::Model& model) {
  auto ops = std::make_unique<CudaTrainOpsImpl>(model);
  if (absl::Status s = ops->init(model); !s.ok()) return s;
  return std::unique_ptr<CudaTrainOps>(std::move(ops));
}

absl::StatusOr<std::unique_ptr<CudaTrainStep>> CudaTrainStep::Create(const model::Model& model) {
  auto ops = CudaTrainOps::Create(model);
  if (!ops.ok()) return ops.status();
  auto step = std::unique_ptr<CudaTrainStep>(new CudaTrainStep());
  step->ops_ = *std::move(ops);
  step->num_params_ = model.num_params();
  return step;
}

absl::Status CudaTrainStep::ensure_grads() {
  if (grads_ != nullptr) return absl::OkStatus();
  auto g = ops_->allocate(num_params_);  // zeroed
  if (!g.ok()) return g.status();
  grads_ = *g;
  return absl::OkStatus();
}

absl::StatusOr<model::TokenValues> CudaTrainStep::forward(const model::Model& model,
                                                          const model::TokenBatch& batch,
                                                          const TrainStepOptions& opts) {
  auto t = build_train_tables(batch, model.config());
  if (!t.ok()) return t.status();
  tables_ = *std::move(t);
  opts_ = opts;
  const int64_t need = train_buffer_floats(model.config(), tables_.rows, opts_);
  if (static_cast<size_t>(need) * sizeof(float) > storage_.bytes()) {
    // Drain the stream before the old buffers go; the new ones start zeroed (finite padding rows).
    if (absl::Status s = ops_->synchronize(); !s.ok()) return s;
    storage_ = kc::DeviceBuffer();
    auto b = kc::DeviceBuffer::allocate(static_cast<size_t>(need) * sizeof(float));
    if (!b.ok()) return b.status();
    storage_ = *std::move(b);
    if (absl::Status s = ops_->zero(storage_.as<float>(), need); !s.ok()) return s;
  }
  buffers_ = carve_train_buffers(model.config(), tables_.rows, opts_, storage_.as<float>());
  return train_forward(model.config(), model.policy(), model.layout(), *ops_, buffers_, tables_,
                       opts_);
}

absl::Status CudaTrainStep::backward(const model::Model& model, const model::TokenValues& dlogp,
                                     const model::GradientsFinal& on_final) {
  if (absl::Status s = ensure_grads(); !s.ok()) return s;
  return backward_into(model, dlogp, grads_, on_final);
}

absl::Status CudaTrainStep::backward_into(const model::Model& model,
                                          const model::TokenValues& dlogp, float* device_grads,
                                          const model::GradientsFinal& on_final) {
  if (buffers_.layers.empty()) return absl::FailedPreconditionError("backward: no forward ran");
  if (device_grads == nullptr) return absl::InvalidArgumentError("backward: grads is null");
  return train_backward(model.config(), model.policy(), model.layout(), *ops_, buffers_, tables_,
                        dlogp, device_grads, opts_, on_final);
}

absl::Status CudaTrainStep::backward_to_sink(const model::Model& model,
                                             const model::TokenValues& dlogp,
                                             model::GradientSink& sink) {
  if (buffers_.layers.empty()) return absl::FailedPreconditionError("backward: no forward ran");
  return train_backward(model.config(), model.policy(), model.layout(), *ops_, buffers_, tables_,
                        dlogp, sink, opts_);
}

absl::Status CudaTrainStep::zero_grads() {
  if (absl::Status s = ensure_grads(); !s.ok()) return s;
  return ops_->zero(grads_, num_params_);
}

absl::Status CudaTrainStep::download_grads(std::vector<float>* out) {
  if (absl::Status s = ensure_grads(); !s.ok()) return s;
  out->resize(num_params_);
  return ops_->to_host(out->data(), grads_, num_params_);
}

}  // namespace fp8rl::engine
