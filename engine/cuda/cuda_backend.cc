// CudaBackend: device weights, arena, paged KV pool and the device ops of decoder_step().
#include "engine/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "engine/arena.h"
#include "engine/cpu/decoder_ops.h"
#include "engine/cuda/step_kernels.h"
#include "engine/decoder_step.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decoder_cuda.h"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/formats.h"

namespace fp8rl::engine {
namespace {

namespace kc = kernels::cuda;
namespace dm = kernels::dm;

#define FP8RL_TRY(expr)                                \
  do {                                                 \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)

constexpr int64_t kHeadRows = 256;  // lm_head / sampling rows per chunk (a multiple of 8)

// How a linear runs on the device.
enum class LinearKind { kF64Acc, kBf16Lt, kFp8Lt };

struct DeviceLinear {
  LinearKind kind = LinearKind::kF64Acc;
  model::Precision precision = model::Precision::kF32;
  int64_t out = 0, in = 0;
  float* f32 = nullptr;      // kF64Acc: the forward's fp32 operand (bf16-valued for bf16)
  uint16_t* bf16 = nullptr;  // kBf16Lt: bf16 bits [out, in]
  kc::Fp8DeviceView fp8;     // kFp8Lt: codes [out, in] + block scales (GEMM layout)
};

// One device copy of the weights (a weight slot), laid out by reserve_weights().
struct DeviceWeights {
  std::vector<std::array<DeviceLinear, 7>> linears;
  DeviceLinear head;
  float* embed = nullptr;
  float* rope_cos = nullptr;
  float* rope_sin = nullptr;
  std::unordered_map<int64_t, float*> small;  // norm weights and biases by layout offset
};

// Host -> device copies through two pinned staging buffers on one stream: the host copies piece
// i + 1 into one buffer while the DMA of piece i reads the other, so a pageable source (the
// worker's host model) never blocks the stream and the calling thread never waits for the whole
// transfer, only for a buffer to come free.
class PinnedStager {
 public:
  static constexpr size_t kBytes = size_t{16} << 20;  // per buffer

  PinnedStager() = default;
  PinnedStager(const PinnedStager&) = delete;
  PinnedStager& operator=(const PinnedStager&) = delete;
  ~PinnedStager() {
    for (int i = 0; i < 2; ++i) {
      if (done_[i] != nullptr) {
        cudaEventSynchronize(done_[i]);
        cudaEventDestroy(done_[i]);
      }
      if (buf_[i] != nullptr) cudaFreeHost(buf_[i]);
    }
  }

  absl::Status init() {
    for (int i = 0; i < 2; ++i) {
      FP8RL_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&buf_[i], kBytes, cudaHostAllocDefault));
      FP8RL_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
    }
    return absl::OkStatus();
  }

  // Queues dst[0, bytes) = src[0, bytes) on `stream`; src may be reused when this returns.
  absl::Status put(void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
    auto* d = static_cast<char*>(dst);
    const auto* h = static_cast<const char*>(src);
    for (int64_t at = 0; at < bytes;) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(kBytes), bytes - at);
      // The buffer's previous DMA must have read it before it is overwritten.
      FP8RL_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_[next_]));
      std::memcpy(buf_[next_], h + at, static_cast<size_t>(n));
      FP8RL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d + at, buf_[next_], static_cast<size_t>(n),
                                                 cudaMemcpyHostToDevice, stream));
      FP8RL_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_[next_], stream));
      next_ ^= 1;
      at += n;
      staged_bytes_ += n;
    }
    return absl::OkStatus();
  }

  int64_t staged_bytes() const { return staged_bytes_; }

 private:
  void* buf_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};
  int next_ = 0;
  int64_t staged_bytes_ = 0;
};

dm::KvDtype kv_dtype(model::KvCacheDtype d) {
  return d == model::KvCacheDtype::kF32    ? dm::KvDtype::kF32
         : d == model::KvCacheDtype::kBF16 ? dm::KvDtype::kBF16
                                           : dm::KvDtype::kFP8;
}

class CudaKvSequence final : public model::KvSequence {
 public:
  CudaKvSequence(std::shared_ptr<model::KvBlockPool> pool, std::vector<int32_t> ids,
                 int64_t capacity, const void* owner)
      : pool_(std::move(pool)), ids_(std::move(ids)), capacity_(capacity), owner_(owner) {}
  ~CudaKvSequence() override { pool_->release(ids_, static_cast<int64_t>(ids_.size())); }
  int64_t capacity() const override { return capacity_; }
  int64_t blocks() const override { return static_cast<int64_t>(ids_.size()); }
  const std::vector<int32_t>& ids() const { return ids_; }
  const void* owner() const { return owner_; }

 private:
  std::shared_ptr<model::KvBlockPool> pool_;
  std::vector<int32_t> ids_;
  int64_t capacity_;
  const void* owner_;
};

class CudaBackendImpl final : public CudaBackend, private DecoderOps {
 public:
  CudaBackendImpl(std::shared_ptr<const model::Model> model, const model::BackendOptions& options,
                  const CudaBackendExtras& extras)
      : model_(std::move(model)),
        config_(model_->config()),
        policy_(model_->policy()),
        options_(options),
        extras_(extras),
        plan_(0) {}

  ~CudaBackendImpl() override {
    if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : {switched_, staged_}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    stager_.reset();
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
    if (stream_ != nullptr) {
      gemm_.reset();
      cudaStreamDestroy(stream_);
    }
  }

  absl::Status init();

  // ---- InferenceBackend ------------------------------------------------------------------------
  model::Device device() const override { return model::Device::kCuda; }
  const model::ModelConfig& config() const override { return config_; }
  const model::PrecisionPolicy& policy() const override { return policy_; }
  absl::Status set_model(std::shared_ptr<const model::Model> model) override;
  absl::Status prepare_model(std::shared_ptr<const model::Model> model) override;
  absl::StatusOr<std::unique_ptr<model::KvSequence>> new_sequence(int64_t capacity) override;
  absl::Status forward(const std::vector<model::BackendSegment>& segments, float* logits) override {
    return forward_layers(segments, logits, nullptr);
  }
  absl::Status forward_layers(const std::vector<model::BackendSegment>& segments, float* logits,
                              std::vector<std::vector<float>>* layers) override;
  absl::Status forward_sample(const std::vector<model::BackendSegment>& segments,
                              const std::vector<model::SampleSpec>& spec,
                              std::vector<model::SampledToken>* out) override;
  absl::StatusOr<model::TokenValues> score(const model::TokenBatch& batch,
                                           float temperature) override;
  model::BackendMemory memory() const override;

 private:
  // ---- DecoderOps (device pointers) ------------------------------------------------------------
  absl::Status load_tables(const StepTables& t) override;
  absl::Status embed(int64_t rows, float* x) override {
    return kc::embed_gather(w().embed, config_.vocab_size, config_.hidden_size, d_tokens_, rows, x,
                            nullptr, stream_);
  }
  absl::Status rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, bool rb,
                       float* y) override {
    if (rows == 0) return absl::OkStatus();
    return kc::rmsnorm(x, g, rows, h, static_cast<float>(config_.rms_norm_eps), rb, y, nullptr,
                       stream_);
  }
  absl::Status rope(int64_t rows, int64_t heads, bool rb, float* x) override {
    return kc::rope(w().rope_cos, w().rope_sin, d_pos_, rows, heads, config_.head_dim, rb, x,
                    stream_);
  }
  absl::Status linear(int64_t layer, int64_t j, const float* x, int64_t rows, const float* bias,
                      float* y) override;
  absl::Status attention(int64_t layer, const float* q, const float* k, const float* v,
                         int64_t rows, float* o) override;
  absl::Status swiglu(const float* g, const float* u, int64_t n, bool rb, float* act) override {
    return kc::swiglu(g, u, n, rb, act, stream_);
  }
  absl::Status add(float* y, const float* x, int64_t n, bool rb) override {
    return cuda::add_round(y, x, n, rb, stream_);
  }
  absl::Status round_bf16(float* x, int64_t n) override { return cuda::round_bf16(x, n, stream_); }
  absl::Status gather_out_rows(const float* x, int64_t h, int64_t n_out, float* out) override {
    return cuda::gather_rows(x, h, d_out_rows_, n_out, out, stream_);
  }
  const float* small(int64_t offset) const override {
    auto it = w().small.find(offset);
    return it == w().small.end() ? nullptr : it->second;
  }

  // ---- helpers ---------------------------------------------------------------------------------
  template <typename T>
  absl::StatusOr<T*> take(int64_t count, const std::string& what) {
    auto at = plan_.reserve(count * static_cast<int64_t>(sizeof(T)), what);
    if (!at.ok()) return at.status();
    return reinterpret_cast<T*>(base_ + *at);
  }
  const DeviceWeights& w() const { return weights_[active_]; }
  absl::Status check_same_shape(const model::Model& model) const;
  absl::Status reserve_weights(const model::Model& m, DeviceWeights* dw);
  // Queues the copy of m's weights into dw on `stream` (through the pinned stager).
  absl::Status copy_weights(const model::Model& m, const DeviceWeights& dw, cudaStream_t stream);
  absl::Status reserve_scratch();
  dm::PagedKvView kv_view(int64_t layer) const;
  // Checks segments, builds and loads the step tables, runs decoder_step; sel then holds the
  // final-norm output rows.
  absl::StatusOr<StepTables> run_step(const std::vector<model::BackendSegment>& segments,
                                      OutputRows out, std::vector<std::vector<float>>* layers);
  absl::Status upload(void* dst, const void* src, int64_t bytes) {
    return kc::copy_to_device(dst, src, static_cast<size_t>(bytes), stream_);
  }

  std::shared_ptr<const model::Model> model_;
  model::ModelConfig config_;
  model::PrecisionPolicy policy_;
  model::BackendOptions options_;
  CudaBackendExtras extras_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<kc::CublasLtGemm> gemm_;
  kc::DeviceBuffer arena_;
  char* base_ = nullptr;
  ArenaPlan plan_;
  int64_t weight_bytes_ = 0, scratch_bytes_ = 0;

  // Weights: weight_slots_ device copies; forward passes read weights_[active_]. With two,
  // prepare_model() fills the other one on copy_stream_ (after `switched_`, recorded on stream_
  // when the slot stopped serving) and records `staged_`; set_model() of the same model makes
  // stream_ wait for `staged_` and flips active_.
  int weight_slots_ = 1;
  DeviceWeights weights_[2];
  int active_ = 0;
  std::vector<std::pair<int64_t, int64_t>> small_sizes_;  // (offset, floats)
  std::unique_ptr<PinnedStager> stager_;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t switched_ = nullptr, staged_ = nullptr;
  std::shared_ptr<const model::Model> staged_model_;  // in weights_[1 - active_] once staged_ fires

  // Step scratch.
  int64_t rows_cap_ = 0, table_cap_ = 0, max_k_ = 0;
  StepBuffers buf_;
  int32_t *d_tokens_ = nullptr, *d_pos_ = nullptr, *d_row_seq_ = nullptr, *d_table_ = nullptr,
          *d_out_rows_ = nullptr, *d_targets_ = nullptr;
  int64_t table_width_ = 0;
  uint8_t* q_codes_ = nullptr;
  float* q_scales_ = nullptr;
  uint16_t* x_bf16_ = nullptr;
  float* logits_ = nullptr;  // [kHeadRows, vocab]
  float* target_lp_ = nullptr;
  dm::SampleParams* d_params_ = nullptr;
  dm::RngState* d_rng_ = nullptr;
  dm::SampleResult* d_results_ = nullptr;
  int32_t* d_sample_scratch_ = nullptr;

  // KV pool: per layer, K and V pools of num_blocks_ blocks.
  int64_t num_blocks_ = 0, block_bytes_ = 0;
  std::vector<char*> k_pool_, v_pool_;
  std::shared_ptr<model::KvBlockPool> pool_;
};

absl::Status CudaBackendImpl::init() {
  if (config_.is_moe()) {
    return absl::FailedPreconditionError(
        "MoE not on CUDA (this model has experts); use --device cpu");
  }
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    for (int64_t j = 0; j < 7; ++j) {
      const model::LinearWeight& w = model_->layer_linear(l, j);
      if (w.out * w.in == 0) {
        return absl::FailedPreconditionError(
            "make_cuda_backend: the model holds no weights yet (install a version first)");
      }
    }
  }
  auto dev = kc::require_sm90();
  if (!dev.ok()) return dev.status();
  FP8RL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  weight_slots_ = static_cast<int>(options_.weight_slots);
  stager_ = std::make_unique<PinnedStager>();
  FP8RL_TRY(stager_->init());
  if (weight_slots_ == 2) {
    FP8RL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    FP8RL_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&switched_, cudaEventDisableTiming));
    FP8RL_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
  }
  auto gemm = kc::CublasLtGemm::create();
  if (!gemm.ok()) return gemm.status();
  gemm_ = *std::move(gemm);
  const int64_t ws = static_cast<int64_t>(kc::kDefaultWorkspaceBytes);
  if (options_.memory_budget_bytes <= ws) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_budget_bytes: the CUDA backend needs more than the GEMM workspace (",
                     ws, " bytes), got ", options_.memory_budget_bytes));
  }
  const int64_t arena_bytes = options_.memory_budget_bytes - ws;
  auto mem = kc::DeviceBuffer::allocate(static_cast<size_t>(arena_bytes));
  if (!mem.ok()) return mem.status();
  arena_ = *std::move(mem);
  base_ = arena_.as<char>();
  plan_ = ArenaPlan(arena_bytes);
  // Zero once: padding rows of the FP8 activation tiles then hold finite values.
  FP8RL_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(base_, 0, arena_bytes, stream_));
  for (int slot = 0; slot < weight_slots_; ++slot) {
    FP8RL_TRY(reserve_weights(*model_, &weights_[slot]));
  }
  weight_bytes_ = plan_.used();
  FP8RL_TRY(reserve_scratch());
  scratch_bytes_ = plan_.used() - weight_bytes_ + ws;
  // The KV pool takes the rest.
  block_bytes_ = kv_block_bytes(config_, policy_.kv_cache, options_.kv_block_tokens);
  const int64_t per_layer_block = block_bytes_ / (2 * config_.num_hidden_layers);
  num_blocks_ =
      (plan_.remaining() - 2 * config_.num_hidden_layers * ArenaPlan::kAlign) / block_bytes_;
  if (num_blocks_ < 1) {
    return absl::ResourceExhaustedError(
        absl::StrCat("GPU memory budget: no room for one KV block (", block_bytes_,
                     " bytes) after weights (", weight_bytes_, ") and scratch (", scratch_bytes_,
                     "); budget ", options_.memory_budget_bytes));
  }
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    auto k = take<char>(num_blocks_ * per_layer_block, "kv");
    auto v = take<char>(num_blocks_ * per_layer_block, "kv");
    if (!k.ok()) return k.status();
    if (!v.ok()) return v.status();
    k_pool_.push_back(*k);
    v_pool_.push_back(*v);
  }
  pool_ = std::make_shared<model::KvBlockPool>(num_blocks_);
  FP8RL_TRY(copy_weights(*model_, weights_[0], stream_));
  FP8RL_TRY(kc::synchronize(stream_));
  // The idle slot serves nothing yet: a first prepare_model() may fill it at once.
  if (switched_ != nullptr) FP8RL_CUDA_RETURN_IF_ERROR(cudaEventRecord(switched_, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::reserve_weights(const model::Model& m, DeviceWeights* dw) {
  const int64_t n_layers = config_.num_hidden_layers;
  auto place = [&](const model::LinearWeight& w, DeviceLinear& d, const std::string& what) {
    d.precision = w.precision;
    d.out = w.out;
    d.in = w.in;
    if (w.precision == model::Precision::kFP8) {
      // cuBLASLt FP8 rules: K % 16, N % 8 (the M rule is met by padded rows).
      if (w.in % 16 != 0 || w.out % 8 != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, ": FP8 on CUDA needs in % 16 == 0 and out % 8 == 0, got [", w.out,
                         ", ", w.in, "]"));
      }
      d.kind = LinearKind::kFp8Lt;
      auto codes = take<uint8_t>(w.out * w.in, "weights");
      const int64_t ns = kc::gemm_scale_count(kernels::ScalingMode::kBlock128x128, w.out, w.in);
      auto scales = take<float>(ns, "weights");
      if (!codes.ok()) return codes.status();
      if (!scales.ok()) return scales.status();
      d.fp8 = {w.out, w.in, kernels::ScalingMode::kBlock128x128, *codes, *scales};
      return absl::OkStatus();
    }
    const bool lt_ok = w.in % 8 == 0 && w.out % 8 == 0;
    d.kind = w.precision == model::Precision::kBF16 && lt_ok && !extras_.exact_bf16_linears
                 ? LinearKind::kBf16Lt
                 : LinearKind::kF64Acc;
    if (d.kind == LinearKind::kBf16Lt) {
      auto p = take<uint16_t>(w.out * w.in, "weights");
      if (!p.ok()) return p.status();
      d.bf16 = *p;
    } else {
      auto p = take<float>(w.out * w.in, "weights");
      if (!p.ok()) return p.status();
      d.f32 = *p;
    }
    return absl::OkStatus();
  };
  dw->linears.assign(n_layers, {});
  for (int64_t l = 0; l < n_layers; ++l) {
    for (int64_t j = 0; j < 7; ++j) {
      FP8RL_TRY(
          place(m.layer_linear(l, j), dw->linears[l][j], absl::StrCat("layer ", l, " linear ", j)));
    }
  }
  FP8RL_TRY(place(m.lm_head_weight(), dw->head, "lm_head"));
  auto e = take<float>(config_.vocab_size * config_.hidden_size, "weights");
  if (!e.ok()) return e.status();
  dw->embed = *e;
  const int64_t rope_n = static_cast<int64_t>(m.rope_cos().size());
  auto c = take<float>(rope_n, "weights");
  auto s = take<float>(rope_n, "weights");
  if (!c.ok()) return c.status();
  if (!s.ok()) return s.status();
  dw->rope_cos = *c;
  dw->rope_sin = *s;
  // Norm weights and biases by offset.
  const model::ParamLayout& lay = m.layout();
  small_sizes_.clear();
  auto add_small = [&](int64_t off, int64_t n) {
    if (off >= 0) small_sizes_.emplace_back(off, n);
  };
  for (int64_t l = 0; l < n_layers; ++l) {
    const model::LayerOffsets& lo = lay.layer(l);
    add_small(lo.input_norm, config_.hidden_size);
    add_small(lo.post_norm, config_.hidden_size);
    add_small(lo.q_bias, config_.q_dim());
    add_small(lo.k_bias, config_.kv_dim());
    add_small(lo.v_bias, config_.kv_dim());
    if (config_.qk_norm()) {
      add_small(lo.q_norm, config_.head_dim);
      add_small(lo.k_norm, config_.head_dim);
    }
  }
  add_small(lay.final_norm(), config_.hidden_size);
  for (const auto& [off, n] : small_sizes_) {
    auto p = take<float>(n, "weights");
    if (!p.ok()) return p.status();
    dw->small[off] = *p;
  }
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::copy_weights(const model::Model& m, const DeviceWeights& dw,
                                           cudaStream_t stream) {
  auto upload = [&](const void* dst, const void* src, int64_t bytes) {
    return stager_->put(const_cast<void*>(dst), src, bytes, stream);
  };
  auto copy_linear = [&](const model::LinearWeight& w, const DeviceLinear& d,
                         const std::string& what) {
    if (w.precision != d.precision || w.out != d.out || w.in != d.in) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the new weights have another precision or shape"));
    }
    switch (d.kind) {
      case LinearKind::kFp8Lt: {
        // The payload's codes and 128x128 scales as they are (device scale layout: padded ld).
        auto scales = kc::scales_to_gemm_layout(w.q);
        if (!scales.ok()) return scales.status();
        FP8RL_TRY(upload(d.fp8.data, w.q.data.data(), static_cast<int64_t>(w.q.data.size())));
        return upload(d.fp8.scale_inv, scales->data(),
                      static_cast<int64_t>(scales->size() * sizeof(float)));
      }
      case LinearKind::kBf16Lt: {
        const std::vector<float> src = linear_values(w);
        std::vector<uint16_t> bits(src.size());
        for (size_t i = 0; i < bits.size(); ++i) bits[i] = kernels::float_to_bf16(src[i]);
        return upload(d.bf16, bits.data(), static_cast<int64_t>(bits.size() * 2));
      }
      case LinearKind::kF64Acc: {
        const std::vector<float> src = linear_values(w);
        return upload(d.f32, src.data(), static_cast<int64_t>(src.size() * 4));
      }
    }
    return absl::OkStatus();
  };
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    for (int64_t j = 0; j < 7; ++j) {
      FP8RL_TRY(copy_linear(m.layer_linear(l, j), dw.linears[l][j],
                            absl::StrCat("layer ", l, " linear ", j)));
    }
  }
  FP8RL_TRY(copy_linear(m.lm_head_weight(), dw.head, "lm_head"));
  const std::vector<float> table = linear_values(m.embedding_weight());
  if (static_cast<int64_t>(table.size()) != config_.vocab_size * config_.hidden_size) {
    return absl::InvalidArgumentError("embedding: the model holds no fp32/bf16 table");
  }
  FP8RL_TRY(upload(dw.embed, table.data(), static_cast<int64_t>(table.size()) * 4));
  FP8RL_TRY(
      upload(dw.rope_cos, m.rope_cos().data(), static_cast<int64_t>(m.rope_cos().size()) * 4));
  FP8RL_TRY(
      upload(dw.rope_sin, m.rope_sin().data(), static_cast<int64_t>(m.rope_sin().size()) * 4));
  for (const auto& [off, n] : small_sizes_) {
    FP8RL_TRY(upload(dw.small.at(off), m.norm_or_bias(off), n * 4));
  }
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::reserve_scratch() {
  const int64_t r = padded_rows(options_.max_step_tokens), h = config_.hidden_size,
                qd = config_.q_dim(), kvd = config_.kv_dim(), f = config_.intermediate_size,
                vocab = config_.vocab_size;
  rows_cap_ = r;
  auto f32 = [&](int64_t n, float** p) -> absl::Status {
    auto t = take<float>(n, "scratch");
    if (!t.ok()) return t.status();
    *p = *t;
    return absl::OkStatus();
  };
  for (float** p : {&buf_.x, &buf_.h1, &buf_.x2, &buf_.h2, &buf_.sel}) FP8RL_TRY(f32(r * h, p));
  for (float** p : {&buf_.q, &buf_.qn, &buf_.o}) FP8RL_TRY(f32(r * qd, p));
  for (float** p : {&buf_.k, &buf_.kn, &buf_.v}) FP8RL_TRY(f32(r * kvd, p));
  for (float** p : {&buf_.g, &buf_.u, &buf_.act}) FP8RL_TRY(f32(r * f, p));
  FP8RL_TRY(f32(kHeadRows * vocab, &logits_));
  FP8RL_TRY(f32(kHeadRows, &target_lp_));
  auto i32 = [&](int64_t n, int32_t** p) -> absl::Status {
    auto t = take<int32_t>(n, "scratch");
    if (!t.ok()) return t.status();
    *p = *t;
    return absl::OkStatus();
  };
  // Block table: every step's segments x the widest segment's blocks; at most one segment per
  // row, each of at most max_position_embeddings positions.
  const int64_t max_blocks =
      (config_.max_position_embeddings + options_.kv_block_tokens - 1) / options_.kv_block_tokens;
  table_cap_ = r * max_blocks;
  for (int32_t** p : {&d_tokens_, &d_pos_, &d_row_seq_, &d_out_rows_, &d_targets_}) {
    FP8RL_TRY(i32(r, p));
  }
  FP8RL_TRY(i32(table_cap_, &d_table_));
  FP8RL_TRY(i32(kHeadRows * vocab, &d_sample_scratch_));
  max_k_ = std::max({h, qd, f});
  auto codes = take<uint8_t>(r * max_k_, "scratch");
  auto scales =
      take<float>(kc::gemm_scale_count(kernels::ScalingMode::kTile1x128, r, max_k_), "scratch");
  auto xb = take<uint16_t>(r * max_k_, "scratch");
  auto params = take<dm::SampleParams>(kHeadRows, "scratch");
  auto rng = take<dm::RngState>(kHeadRows, "scratch");
  auto results = take<dm::SampleResult>(kHeadRows, "scratch");
  for (const absl::Status& s : {codes.status(), scales.status(), xb.status(), params.status(),
                                rng.status(), results.status()}) {
    FP8RL_TRY(s);
  }
  q_codes_ = *codes;
  q_scales_ = *scales;
  x_bf16_ = *xb;
  d_params_ = *params;
  d_rng_ = *rng;
  d_results_ = *results;
  return absl::OkStatus();
}

dm::PagedKvView CudaBackendImpl::kv_view(int64_t layer) const {
  dm::PagedKvView kv;
  kv.k_pool = k_pool_[layer];
  kv.v_pool = v_pool_[layer];
  kv.dtype = kv_dtype(policy_.kv_cache);
  kv.num_blocks = num_blocks_;
  kv.block_size = options_.kv_block_tokens;
  kv.n_kv = config_.num_key_value_heads;
  kv.head_dim = config_.head_dim;
  kv.block_table = d_table_;
  kv.max_blocks = table_width_;
  kv.k_scale = model_->kv_scales().k[layer];
  kv.v_scale = model_->kv_scales().v[layer];
  return kv;
}

absl::Status CudaBackendImpl::load_tables(const StepTables& t) {
  if (t.rows > rows_cap_) {
    return absl::InvalidArgumentError(absl::StrCat("forward: ", t.rows,
                                                   " rows in one step, more than max_step_tokens (",
                                                   options_.max_step_tokens, ")"));
  }
  if (t.n_seg * t.width > table_cap_) {
    return absl::InvalidArgumentError("forward: the step's block table exceeds its buffer");
  }
  FP8RL_TRY(upload(d_tokens_, t.tokens.data(), t.rows * 4));
  FP8RL_TRY(upload(d_pos_, t.pos.data(), t.rows * 4));
  FP8RL_TRY(upload(d_row_seq_, t.row_seq.data(), t.rows * 4));
  FP8RL_TRY(upload(d_table_, t.block_table.data(), t.n_seg * t.width * 4));
  const int64_t n_out = static_cast<int64_t>(t.out_rows.size());
  FP8RL_TRY(upload(d_out_rows_, t.out_rows.data(), n_out * 4));
  if (!t.targets.empty()) FP8RL_TRY(upload(d_targets_, t.targets.data(), n_out * 4));
  table_width_ = t.width;
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::linear(int64_t layer, int64_t j, const float* x, int64_t rows,
                                     const float* bias, float* y) {
  if (rows == 0) return absl::OkStatus();
  const DeviceLinear& w = layer < 0 ? this->w().head : this->w().linears[layer][j];
  const bool rb = w.precision != model::Precision::kF32;  // linear_forward's output rounding
  switch (w.kind) {
    case LinearKind::kF64Acc:
      FP8RL_TRY(cuda::gemm_f64acc(x, w.f32, y, rows, w.out, w.in, stream_));
      break;
    case LinearKind::kBf16Lt:
      // x is bf16-valued on bf16 paths; its bits are the GEMM operand. fp32 out, then epilogue.
      FP8RL_TRY(cuda::to_bf16_bits(x, rows * w.in, x_bf16_, stream_));
      FP8RL_TRY(gemm_->gemm_bf16(x_bf16_, w.bf16, y, rows, w.out, w.in, kernels::OutDtype::kF32,
                                 false, stream_));
      break;
    case LinearKind::kFp8Lt: {
      // 1x128 activation tiles (bit-exact with the CPU quantizer), rows padded to 8 for cuBLASLt.
      const int64_t mp = padded_rows(rows);
      FP8RL_TRY(kc::quantize(x, mp, w.in, kernels::ScalingMode::kTile1x128,
                             {.pow2_scales = policy_.pow2_scales}, q_codes_, q_scales_, stream_));
      const kc::Fp8DeviceView a{mp, w.in, kernels::ScalingMode::kTile1x128, q_codes_, q_scales_};
      FP8RL_TRY(gemm_->gemm_fp8(a, w.fp8, y, kernels::OutDtype::kF32, false, stream_));
      break;
    }
  }
  return cuda::bias_round(y, bias, rows, w.out, rb, stream_);
}

absl::Status CudaBackendImpl::attention(int64_t layer, const float* q, const float* k,
                                        const float* v, int64_t rows, float* o) {
  const dm::PagedKvView kv = kv_view(layer);
  FP8RL_TRY(kc::kv_write_paged(k, v, rows, d_row_seq_, d_pos_, kv, stream_));
  const float scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  return kc::attention_paged(q, rows, d_row_seq_, d_pos_, kv, config_.num_attention_heads, scale, o,
                             stream_);
}

absl::StatusOr<StepTables> CudaBackendImpl::run_step(
    const std::vector<model::BackendSegment>& segments, OutputRows out,
    std::vector<std::vector<float>>* layers) {
  std::vector<SegmentBlocks> segs(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    const auto* kv = dynamic_cast<const CudaKvSequence*>(segments[i].kv);
    if (kv == nullptr || kv->owner() != this) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward: segment ", i, " has no KV sequence of this backend"));
    }
    segs[i] = {&kv->ids(), kv->capacity(), segments[i].tokens, segments[i].n, segments[i].pos0};
  }
  auto t = build_step_tables(segs, options_.kv_block_tokens, config_.vocab_size,
                             config_.max_position_embeddings, out);
  if (!t.ok()) return t.status();
  if (t->rows > rows_cap_) {
    return absl::InvalidArgumentError(absl::StrCat("forward: ", t->rows,
                                                   " rows in one step, more than max_step_tokens (",
                                                   options_.max_step_tokens, ")"));
  }
  std::function<absl::Status(int64_t, const float*)> hook;
  if (layers != nullptr) {
    layers->assign(config_.num_hidden_layers, {});
    const int64_t n = t->rows * config_.hidden_size;
    hook = [&, n](int64_t l, const float* x) {
      (*layers)[l].resize(n);
      return kc::copy_to_host((*layers)[l].data(), x, n * sizeof(float), stream_);
    };
  }
  FP8RL_TRY(decoder_step(config_, policy_, model_->layout(), *this, buf_, *t, hook));
  return t;
}

absl::Status CudaBackendImpl::forward_layers(const std::vector<model::BackendSegment>& segments,
                                             float* logits,
                                             std::vector<std::vector<float>>* layers) {
  if (segments.empty()) return absl::OkStatus();
  auto t = run_step(segments, OutputRows::kLastOfSegment, layers);
  if (!t.ok()) return t.status();
  const int64_t n_out = static_cast<int64_t>(t->out_rows.size()), vocab = config_.vocab_size;
  for (int64_t c0 = 0; c0 < n_out; c0 += kHeadRows) {
    const int64_t rows = std::min(kHeadRows, n_out - c0);
    FP8RL_TRY(linear(-1, 0, buf_.sel + c0 * config_.hidden_size, rows, nullptr, logits_));
    FP8RL_TRY(
        kc::copy_to_host(logits + c0 * vocab, logits_, rows * vocab * sizeof(float), stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::forward_sample(const std::vector<model::BackendSegment>& segments,
                                             const std::vector<model::SampleSpec>& spec,
                                             std::vector<model::SampledToken>* out) {
  if (auto s = model::check_sample_specs(segments, spec); !s.ok()) return s;
  out->resize(segments.size());
  if (segments.empty()) return absl::OkStatus();
  auto t = run_step(segments, OutputRows::kLastOfSegment, nullptr);
  if (!t.ok()) return t.status();
  const int64_t n = static_cast<int64_t>(segments.size()), vocab = config_.vocab_size;
  std::vector<dm::SampleParams> params(kHeadRows);
  std::vector<dm::RngState> rng(kHeadRows);
  std::vector<dm::SampleResult> res(kHeadRows);
  for (int64_t c0 = 0; c0 < n; c0 += kHeadRows) {
    const int64_t rows = std::min(kHeadRows, n - c0);
    for (int64_t i = 0; i < rows; ++i) {
      const model::SamplingParams& p = *spec[c0 + i].params;
      params[i] = {p.temperature, p.top_p, p.top_k};
      const std::array<uint64_t, 4> st = spec[c0 + i].rng->state();
      std::copy(st.begin(), st.end(), rng[i].s);
    }
    FP8RL_TRY(linear(-1, 0, buf_.sel + c0 * config_.hidden_size, rows, nullptr, logits_));
    FP8RL_TRY(upload(d_params_, params.data(), rows * sizeof(dm::SampleParams)));
    FP8RL_TRY(upload(d_rng_, rng.data(), rows * sizeof(dm::RngState)));
    FP8RL_TRY(kc::sample(logits_, rows, vocab, d_params_, d_rng_, d_sample_scratch_, d_results_,
                         stream_));
    FP8RL_TRY(kc::copy_to_host(res.data(), d_results_, rows * sizeof(dm::SampleResult), stream_));
    FP8RL_TRY(kc::copy_to_host(rng.data(), d_rng_, rows * sizeof(dm::RngState), stream_));
    for (int64_t i = 0; i < rows; ++i) {
      (*out)[c0 + i] = {res[i].token, res[i].logprob, res[i].full_logprob};
      spec[c0 + i].rng->set_state({rng[i].s[0], rng[i].s[1], rng[i].s[2], rng[i].s[3]});
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<model::TokenValues> CudaBackendImpl::score(const model::TokenBatch& batch,
                                                          float temperature) {
  if (!(temperature > 0) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature: must be > 0, got ", temperature));
  }
  if (batch.empty()) return absl::InvalidArgumentError("batch: no sequences");
  for (size_t s = 0; s < batch.size(); ++s) {
    if (batch[s].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("batch: sequence ", s, " is empty"));
    }
    if (auto st = model_->check_tokens(batch[s]); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("batch: sequence ", s, ": ", st.message()));
    }
    if (static_cast<int64_t>(batch[s].size()) > options_.max_step_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch: sequence ", s, " has ", batch[s].size(),
                       " tokens, more than max_step_tokens (", options_.max_step_tokens, ")"));
    }
  }
  model::TokenValues out(batch.size());
  const int64_t vocab = config_.vocab_size;
  std::vector<float> lp(kHeadRows);
  size_t next = 0;
  while (next < batch.size()) {
    // Pack whole sequences into one step while the rows last; each gets a temporary KV sequence.
    std::vector<std::unique_ptr<model::KvSequence>> kv;
    std::vector<model::BackendSegment> segs;
    std::vector<size_t> which;
    int64_t rows = 0;
    while (next < batch.size() &&
           rows + static_cast<int64_t>(batch[next].size()) <= options_.max_step_tokens) {
      const int64_t n = static_cast<int64_t>(batch[next].size());
      auto seq = new_sequence(n);
      if (!seq.ok()) {
        if (!kv.empty() && seq.status().code() == absl::StatusCode::kResourceExhausted) break;
        return seq.status();
      }
      kv.push_back(*std::move(seq));
      segs.push_back({kv.back().get(), batch[next].data(), n, 0});
      which.push_back(next);
      rows += n;
      ++next;
    }
    auto t = run_step(segs, OutputRows::kAllButLast, nullptr);
    if (!t.ok()) return t.status();
    const int64_t n_out = static_cast<int64_t>(t->out_rows.size());
    std::vector<float> all(n_out);
    for (int64_t c0 = 0; c0 < n_out; c0 += kHeadRows) {
      const int64_t r = std::min(kHeadRows, n_out - c0);
      FP8RL_TRY(linear(-1, 0, buf_.sel + c0 * config_.hidden_size, r, nullptr, logits_));
      FP8RL_TRY(kc::log_softmax(logits_, r, vocab, 1.0f / temperature, d_targets_ + c0, nullptr,
                                target_lp_, stream_));
      FP8RL_TRY(kc::copy_to_host(all.data() + c0, target_lp_, r * sizeof(float), stream_));
    }
    int64_t at = 0;
    for (size_t i = 0; i < which.size(); ++i) {
      const int64_t n = static_cast<int64_t>(batch[which[i]].size()) - 1;
      out[which[i]].assign(all.begin() + at, all.begin() + at + n);
      at += n;
    }
  }
  return out;
}

absl::Status CudaBackendImpl::check_same_shape(const model::Model& model) const {
  if (model_config_to_json(model.config()) != model_config_to_json(config_) ||
      !(model.policy() == policy_)) {
    return absl::InvalidArgumentError("set_model: the model's config or policy differs");
  }
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::prepare_model(std::shared_ptr<const model::Model> model) {
  if (model == nullptr) return absl::InvalidArgumentError("prepare_model: no model");
  FP8RL_TRY(check_same_shape(*model));
  if (weight_slots_ < 2 || model == model_ || model == staged_model_) return absl::OkStatus();
  staged_model_.reset();
  // The idle slot may still be read by forward passes queued before it stopped serving.
  FP8RL_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, switched_, 0));
  FP8RL_TRY(copy_weights(*model, weights_[1 - active_], copy_stream_));
  FP8RL_CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_, copy_stream_));
  staged_model_ = std::move(model);
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::set_model(std::shared_ptr<const model::Model> model) {
  if (model == nullptr) return absl::InvalidArgumentError("set_model: no model");
  FP8RL_TRY(check_same_shape(*model));
  if (pool_->used() > 0) {
    return absl::FailedPreconditionError("set_model: sequences still hold KV blocks");
  }
  if (weight_slots_ == 2) {
    if (model != staged_model_) FP8RL_TRY(prepare_model(model));
    if (model != staged_model_) return absl::OkStatus();  // it is already the serving one
    // Forward passes queued from now on read the staged slot once its copy is done; the slot
    // left behind becomes free for the next prepare_model() after what is already queued.
    FP8RL_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, staged_, 0));
    active_ = 1 - active_;
    FP8RL_CUDA_RETURN_IF_ERROR(cudaEventRecord(switched_, stream_));
    staged_model_.reset();
    model_ = std::move(model);
    return absl::OkStatus();
  }
  FP8RL_TRY(kc::synchronize(stream_));
  FP8RL_TRY(copy_weights(*model, weights_[0], stream_));
  model_ = std::move(model);
  return kc::synchronize(stream_);
}

absl::StatusOr<std::unique_ptr<model::KvSequence>> CudaBackendImpl::new_sequence(int64_t capacity) {
  if (capacity < 1 || capacity > config_.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity: must be in [1, ", config_.max_position_embeddings, "], got ", capacity));
  }
  auto ids = pool_->acquire(blocks_for(capacity));
  if (!ids.ok()) return ids.status();
  return std::unique_ptr<model::KvSequence>(
      std::make_unique<CudaKvSequence>(pool_, *std::move(ids), capacity, this));
}

model::BackendMemory CudaBackendImpl::memory() const {
  model::BackendMemory m;
  m.budget_bytes = options_.memory_budget_bytes;
  m.weight_bytes = weight_bytes_;
  m.weight_slots = weight_slots_;
  m.scratch_bytes = scratch_bytes_;
  m.kv_block_tokens = options_.kv_block_tokens;
  m.kv_block_bytes = block_bytes_;
  m.kv_blocks_total = pool_ ? pool_->total() : 0;
  m.kv_blocks_used = pool_ ? pool_->used() : 0;
  return m;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> create_cuda_backend(
    std::shared_ptr<const model::Model> model, const model::BackendOptions& options,
    const CudaBackendExtras& extras) {
  if (model == nullptr) return absl::InvalidArgumentError("make_cuda_backend: no model");
  if (auto s = model::check_backend_options(options); !s.ok()) return s;
  auto b = std::make_unique<CudaBackendImpl>(std::move(model), options, extras);
  if (auto s = b->init(); !s.ok()) return s;
  return std::unique_ptr<CudaBackend>(std::move(b));
}

}  // namespace fp8rl::engine

namespace fp8rl::model {

absl::StatusOr<std::unique_ptr<model::InferenceBackend>> make_cuda_backend(
    std::shared_ptr<const model::Model> model, const model::BackendOptions& options) {
  auto b = engine::create_cuda_backend(std::move(model), options);
  if (!b.ok()) return b.status();
  return std::unique_ptr<model::InferenceBackend>(*std::move(b));
}

bool cuda_backend_available() { return kernels::cuda::require_sm90().ok(); }

std::string cuda_backend_unavailable_reason() {
  auto dev = kernels::cuda::require_sm90();
  return dev.ok() ? "" : std::string(dev.status().message());
}

}  // namespace fp8rl::model
