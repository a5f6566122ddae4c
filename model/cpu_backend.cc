// The CPU implementation of model/inference_backend.h: Model::forward_cached over KvCache objects,
// Sampler, Model::forward; and make_cuda_backend's answer in a build without CUDA.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "model/inference_backend.h"

namespace fp8rl::model {

namespace {

// Blocks + a KvCache of the whole capacity (the CPU cache is contiguous per sequence; blocks
// only count memory so a scheduler sees the same budget on both devices).
class CpuKvSequence final : public KvSequence {
 public:
  CpuKvSequence(std::shared_ptr<KvBlockPool> pool, std::vector<int32_t> ids, int64_t n,
                std::unique_ptr<KvCache> cache, const void* owner)
      : pool_(std::move(pool)),
        ids_(std::move(ids)),
        n_(n),
        cache_(std::move(cache)),
        owner_(owner) {}
  ~CpuKvSequence() override { pool_->release(ids_, n_); }
  int64_t capacity() const override { return cache_->capacity(); }
  int64_t blocks() const override { return n_; }
  KvCache* cache() const { return cache_.get(); }
  const void* owner() const { return owner_; }

 private:
  std::shared_ptr<KvBlockPool> pool_;
  std::vector<int32_t> ids_;
  int64_t n_;
  std::unique_ptr<KvCache> cache_;
  const void* owner_;
};

class CpuBackend final : public InferenceBackend {
 public:
  CpuBackend(std::shared_ptr<const Model> model, const BackendOptions& options, int64_t block_bytes,
             int64_t total_blocks)
      : model_(std::move(model)),
        options_(options),
        block_bytes_(block_bytes),
        pool_(std::make_shared<KvBlockPool>(total_blocks)) {}

  Device device() const override { return Device::kCpu; }
  const ModelConfig& config() const override { return model_->config(); }
  const PrecisionPolicy& policy() const override { return model_->policy(); }

  absl::Status set_model(std::shared_ptr<const Model> model) override {
    if (model == nullptr) return absl::InvalidArgumentError("set_model: no model");
    if (model_config_to_json(model->config()) != model_config_to_json(model_->config()) ||
        !(model->policy() == model_->policy())) {
      return absl::InvalidArgumentError("set_model: the model's config or policy differs");
    }
    if (pool_->used() > 0) {
      return absl::FailedPreconditionError("set_model: sequences still hold KV blocks");
    }
    model_ = std::move(model);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<KvSequence>> new_sequence(int64_t capacity) override {
    if (capacity < 1 || capacity > config().max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "capacity: must be in [1, ", config().max_position_embeddings, "], got ", capacity));
    }
    const int64_t n = blocks_for(capacity);
    auto ids = pool_->acquire(n);
    if (!ids.ok()) return ids.status();
    return std::unique_ptr<KvSequence>(std::make_unique<CpuKvSequence>(
        pool_, *std::move(ids), n, model_->new_kv_cache(capacity), this));
  }

  absl::Status forward(const std::vector<BackendSegment>& segments, float* logits) override {
    cached_.resize(segments.size());
    for (size_t i = 0; i < segments.size(); ++i) {
      const auto* kv = dynamic_cast<const CpuKvSequence*>(segments[i].kv);
      if (kv == nullptr || kv->owner() != this) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: segment ", i, " has no KV sequence of this backend"));
      }
      cached_[i] = {kv->cache(), segments[i].tokens, segments[i].n, segments[i].pos0};
    }
    return model_->forward_cached(cached_, logits, &ws_);
  }

  absl::Status forward_sample(const std::vector<BackendSegment>& segments,
                              const std::vector<SampleSpec>& spec,
                              std::vector<SampledToken>* out) override {
    if (auto s = check_sample_specs(segments, spec); !s.ok()) return s;
    const int64_t vocab = config().vocab_size;
    logits_.resize(segments.size() * vocab);
    if (auto s = forward(segments, logits_.data()); !s.ok()) return s;
    out->resize(segments.size());
    for (size_t i = 0; i < segments.size(); ++i) {
      SampledToken& t = (*out)[i];
      t.token = sampler_.sample(logits_.data() + i * vocab, vocab, *spec[i].params, *spec[i].rng,
                                &t.logprob, &t.full_logprob);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<TokenValues> score(const TokenBatch& batch, float temperature) override {
    return model_->forward(batch, {.temperature = temperature}, nullptr);
  }

  BackendMemory memory() const override {
    BackendMemory m;
    m.budget_bytes = options_.memory_budget_bytes;
    m.weight_bytes = model_->weight_bytes();
    m.kv_block_tokens = options_.kv_block_tokens;
    m.kv_block_bytes = block_bytes_;
    m.kv_blocks_total = pool_->total();
    m.kv_blocks_used = pool_->used();
    return m;
  }

 private:
  std::shared_ptr<const Model> model_;
  BackendOptions options_;
  int64_t block_bytes_;
  std::shared_ptr<KvBlockPool> pool_;
  InferenceWorkspace ws_;
  std::vector<CachedSegment> cached_;
  std::vector<float> logits_;
  Sampler sampler_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<InferenceBackend>> make_cpu_backend(
    std::shared_ptr<const Model> model, const BackendOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("make_cpu_backend: no model");
  if (auto s = check_backend_options(options); !s.ok()) return s;
  const int64_t block_bytes =
      kv_block_bytes(model->config(), model->policy().kv_cache, options.kv_block_tokens);
  const int64_t total =
      options.memory_budget_bytes == 0 ? -1 : options.memory_budget_bytes / block_bytes;
  return std::unique_ptr<InferenceBackend>(
      std::make_unique<CpuBackend>(std::move(model), options, block_bytes, total));
}

#ifndef FP8RL_HAVE_CUDA_BACKEND
absl::StatusOr<std::unique_ptr<InferenceBackend>> make_cuda_backend(std::shared_ptr<const Model>,
                                                                    const BackendOptions&) {
  return absl::FailedPreconditionError("device cuda: this build has no CUDA (built without CUDA)");
}
bool cuda_backend_available() { return false; }
std::string cuda_backend_unavailable_reason() { return "built without CUDA"; }
#endif

}  // namespace fp8rl::model
