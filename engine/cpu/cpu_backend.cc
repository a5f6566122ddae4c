// The CPU implementation of model/inference_backend.h (make_cpu_backend): decoder_step over
// CpuDecoderOps with KV blocks from the ops' paged pool, as CudaBackend runs it over device ops
// (dense and mixture-of-experts models: the CPU ops have a MoE op, and forward() reports the
// routing record); the sampler and the training forward (score) on the host model.
#include <algorithm>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "engine/cpu/decoder_ops.h"
#include "engine/cpu/train_ops.h"
#include "engine/decoder_step.h"
#include "model/inference_backend.h"

namespace fp8rl::engine {
namespace {

using model::BackendSegment;
using model::KvSequence;

// Block ids of the ops' paged pool: the lowest free id first, new ids past the highest handed
// out when none is free. The pool itself grows to high_water() blocks before a step (a budget,
// when there is one, is enforced by the KvBlockPool that counts blocks, not here).
class PagedBlockIds {
 public:
  std::vector<int32_t> acquire(int64_t n) {
    std::vector<int32_t> ids;
    ids.reserve(n);
    while (static_cast<int64_t>(ids.size()) < n && !free_.empty()) {
      ids.push_back(free_.back());
      free_.pop_back();
    }
    while (static_cast<int64_t>(ids.size()) < n) ids.push_back(static_cast<int32_t>(high_++));
    return ids;
  }
  void release(const std::vector<int32_t>& ids) {
    free_.insert(free_.end(), ids.begin(), ids.end());
    std::sort(free_.begin(), free_.end(), std::greater<int32_t>());  // lowest id on top
  }
  int64_t high_water() const { return high_; }

 private:
  std::vector<int32_t> free_;
  int64_t high_ = 0;
};

// A sequence's KV memory: `n` blocks counted in the backend's KvBlockPool, and the ids of its
// blocks in the ops' paged pool.
class CpuKvSequence final : public KvSequence {
 public:
  CpuKvSequence(std::shared_ptr<model::KvBlockPool> pool, std::vector<int32_t> counted, int64_t n,
                std::shared_ptr<PagedBlockIds> paged, std::vector<int32_t> blocks, int64_t capacity,
                const void* owner)
      : pool_(std::move(pool)),
        counted_(std::move(counted)),
        n_(n),
        paged_(std::move(paged)),
        blocks_(std::move(blocks)),
        capacity_(capacity),
        owner_(owner) {}
  ~CpuKvSequence() override {
    pool_->release(counted_, n_);
    paged_->release(blocks_);
  }
  int64_t capacity() const override { return capacity_; }
  int64_t blocks() const override { return n_; }
  const std::vector<int32_t>& paged_blocks() const { return blocks_; }
  const void* owner() const { return owner_; }

 private:
  std::shared_ptr<model::KvBlockPool> pool_;
  std::vector<int32_t> counted_;
  int64_t n_;
  std::shared_ptr<PagedBlockIds> paged_;
  std::vector<int32_t> blocks_;
  int64_t capacity_;
  const void* owner_;
};

class CpuBackend final : public model::InferenceBackend {
 public:
  CpuBackend(std::shared_ptr<const model::Model> model, const model::BackendOptions& options,
             int64_t block_bytes, int64_t total_blocks)
      : model_(std::move(model)),
        options_(options),
        block_bytes_(block_bytes),
        pool_(std::make_shared<model::KvBlockPool>(total_blocks)),
        paged_(std::make_shared<PagedBlockIds>()),
        ops_(std::make_unique<CpuDecoderOps>(*model_, 0, options_.kv_block_tokens)) {}

  model::Device device() const override { return model::Device::kCpu; }
  const model::ModelConfig& config() const override { return model_->config(); }
  const model::PrecisionPolicy& policy() const override { return model_->policy(); }

  absl::Status set_model(std::shared_ptr<const model::Model> model) override {
    if (model == nullptr) return absl::InvalidArgumentError("set_model: no model");
    if (model_config_to_json(model->config()) != model_config_to_json(model_->config()) ||
        !(model->policy() == model_->policy())) {
      return absl::InvalidArgumentError("set_model: the model's config or policy differs");
    }
    if (pool_->used() > 0) {
      return absl::FailedPreconditionError("set_model: sequences still hold KV blocks");
    }
    model_ = std::move(model);
    ops_->set_model(*model_);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<KvSequence>> new_sequence(int64_t capacity) override {
    if (capacity < 1 || capacity > config().max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "capacity: must be in [1, ", config().max_position_embeddings, "], got ", capacity));
    }
    const int64_t n = blocks_for(capacity);
    auto counted = pool_->acquire(n);
    if (!counted.ok()) return counted.status();
    return std::unique_ptr<KvSequence>(std::make_unique<CpuKvSequence>(
        pool_, *std::move(counted), n, paged_, paged_->acquire(n), capacity, this));
  }

  absl::Status forward(const std::vector<BackendSegment>& segments, float* logits) override {
    if (segments.empty()) return absl::OkStatus();
    std::vector<const CpuKvSequence*> kv(segments.size());
    for (size_t i = 0; i < segments.size(); ++i) {
      kv[i] = dynamic_cast<const CpuKvSequence*>(segments[i].kv);
      if (kv[i] == nullptr || kv[i]->owner() != this) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: segment ", i, " has no KV sequence of this backend"));
      }
    }
    if (model_->description_only()) {
      return absl::FailedPreconditionError(
          "forward: this model is a description (its weights live on a device)");
    }
    std::vector<SegmentBlocks> segs(segments.size());
    for (size_t i = 0; i < segments.size(); ++i) {
      segs[i] = {&kv[i]->paged_blocks(), kv[i]->capacity(), segments[i].tokens, segments[i].n,
                 segments[i].pos0};
    }
    auto t = build_step_tables(segs, options_.kv_block_tokens, config().vocab_size,
                               config().max_position_embeddings, OutputRows::kLastOfSegment);
    if (!t.ok()) return t.status();
    // Grow the paged pool to every block handed out (doubling, so it is copied rarely) and the
    // scratch to the step's rows.
    if (ops_->num_blocks() < paged_->high_water()) {
      ops_->grow_pool(std::max(paged_->high_water(), 2 * ops_->num_blocks()));
    }
    if (buf_rows_ < t->rows) {
      buf_rows_ = std::max(t->rows, 2 * buf_rows_);
      buf_ = std::make_unique<CpuStepBuffers>(config(), buf_rows_);
    }
    const StepBuffers b = buf_->view();
    if (auto s = decoder_step(config(), policy(), model_->layout(), *ops_, b, *t, nullptr);
        !s.ok()) {
      return s;
    }
    if (b.routing != nullptr) {
      // b.routing is [sparse layers, rows, k]; each segment's record is [token, sparse layer, k].
      const int64_t k = config().moe.num_experts_per_tok, n_sparse = config().num_sparse_layers();
      int64_t row = 0;
      for (const BackendSegment& seg : segments) {
        for (int64_t r = 0; r < seg.n; ++r, ++row) {
          for (int64_t li = 0; seg.routing != nullptr && li < n_sparse; ++li) {
            const int32_t* sel = b.routing + (li * t->rows + row) * k;
            seg.routing->insert(seg.routing->end(), sel, sel + k);
          }
        }
      }
    }
    // logits = lm_head(sel): one row per segment.
    return ops_->linear(-1, 0, b.sel, t->n_seg, nullptr, logits);
  }

  absl::Status forward_sample(const std::vector<BackendSegment>& segments,
                              const std::vector<model::SampleSpec>& spec,
                              std::vector<model::SampledToken>* out) override {
    if (auto s = model::check_sample_specs(segments, spec); !s.ok()) return s;
    const int64_t vocab = config().vocab_size;
    logits_.resize(segments.size() * vocab);
    if (auto s = forward(segments, logits_.data()); !s.ok()) return s;
    out->resize(segments.size());
    for (size_t i = 0; i < segments.size(); ++i) {
      model::SampledToken& t = (*out)[i];
      t.token = sampler_.sample(logits_.data() + i * vocab, vocab, *spec[i].params, *spec[i].rng,
                                &t.logprob, &t.full_logprob);
    }
    return absl::OkStatus();
  }

  // The training forward's logprobs (no KV cache: an FP8 cache would change them).
  absl::StatusOr<model::TokenValues> score(const model::TokenBatch& batch,
                                           float temperature) override {
    return cpu_logprobs(*model_, batch, {.temperature = temperature});
  }

  bool bounds_step_rows() const override { return false; }

  model::BackendMemory memory() const override {
    model::BackendMemory m;
    m.budget_bytes = options_.memory_budget_bytes;
    m.weight_bytes = model_->weight_bytes();
    m.kv_block_tokens = options_.kv_block_tokens;
    m.kv_block_bytes = block_bytes_;
    m.kv_blocks_total = pool_->total();
    m.kv_blocks_used = pool_->used();
    return m;
  }

 private:
  std::shared_ptr<const model::Model> model_;
  model::BackendOptions options_;
  int64_t block_bytes_;
  std::shared_ptr<model::KvBlockPool> pool_;  // counts blocks against the budget
  std::shared_ptr<PagedBlockIds> paged_;      // the ops' block ids
  std::unique_ptr<CpuDecoderOps> ops_;
  std::unique_ptr<CpuStepBuffers> buf_;
  int64_t buf_rows_ = 0;
  std::vector<float> logits_;
  model::Sampler sampler_;
};

}  // namespace
}  // namespace fp8rl::engine

namespace fp8rl::model {

absl::StatusOr<std::unique_ptr<InferenceBackend>> make_cpu_backend(
    std::shared_ptr<const Model> model, const BackendOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("make_cpu_backend: no model");
  if (auto s = check_backend_options(options); !s.ok()) return s;
  const int64_t block_bytes =
      kv_block_bytes(model->config(), model->policy().kv_cache, options.kv_block_tokens);
  const int64_t total =
      options.memory_budget_bytes == 0 ? -1 : options.memory_budget_bytes / block_bytes;
  return std::unique_ptr<InferenceBackend>(
      std::make_unique<engine::CpuBackend>(std::move(model), options, block_bytes, total));
}

}  // namespace fp8rl::model
