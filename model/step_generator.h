// The generation loop of the generation worker's scheduler, the trainer's GRPO step and `fp8rl
// generate`, on either device: BackendGenerator over an InferenceBackend (the CPU backend,
// engine/cpu/cpu_backend.cc, or the CUDA one on --device cuda; docs/design/engine.md). Continuous
// batching: add() sequences at any time, step() (one forward: prefill of the new sequences plus
// one decode token for every running one), take_finished(), cancel() a sequence whose caller went
// away. A sample's random stream is derive_seed(seed, stream), so its tokens do not depend on
// what shares its batch; cancel() frees its KV blocks at once. generate() is the whole-batch call
// on the CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/inference_backend.h"
#include "model/model.h"
#include "model/rng.h"
#include "model/sampler.h"

namespace fp8rl::model {

// kCancelled marks the partial result cancel() returns; take_finished() never holds one.
enum class FinishReason { kStop, kLength, kCancelled };

struct GenerationResult {
  int64_t id = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;  // generated tokens (a stop token is included)
  // One per generated token, under the distribution it was sampled from (temperature, then
  // renormalized over the top-k / top-p kept set; model/sampler.h). The IS behaviour policy.
  std::vector<float> logprobs;
  // One per generated token, under the untruncated softmax(logits / temperature): what the trainer
  // recomputes. Equal to logprobs when top_k = 0 and top_p = 1.
  std::vector<float> full_logprobs;
  // Mixture of experts: the experts each fed token went to, [prompt + tokens - 1 tokens, sparse
  // layers, top_k] (Model::routing_width() per token; the last sampled token is never fed).
  // Empty for a dense model.
  std::vector<int32_t> routing;
  FinishReason reason = FinishReason::kLength;
};

class StepGenerator {
 public:
  virtual ~StepGenerator() = default;
  virtual absl::StatusOr<int64_t> add(std::vector<int32_t> prompt,
                                      const model::SamplingParams& params, uint64_t stream) = 0;
  virtual absl::Status step() = 0;
  virtual std::vector<model::GenerationResult> take_finished() = 0;
  virtual absl::StatusOr<model::GenerationResult> cancel(int64_t id) = 0;
  virtual bool idle() const = 0;
  virtual int64_t kv_cache_bytes() const = 0;
  // A new weight version between batches; an error means "make a new generator".
  virtual absl::Status set_model(std::shared_ptr<const model::Model> model) = 0;
  // The next weight version, announced while the running batch drains, so that set_model() of
  // it later has less to do (InferenceBackend::prepare_model). An error is not fatal: set_model
  // does the whole work then. Default: nothing.
  virtual absl::Status prepare_model(std::shared_ptr<const model::Model> model) {
    (void)model;
    return absl::OkStatus();
  }
};

// The generation loop over an InferenceBackend: each sample holds a KvSequence of prompt +
// max_new_tokens positions from add() to its end; each step is one forward_sample() over the
// decoding rows (in the order they were added) and then the prefills that fit in max_step_tokens
// rows (a prompt longer than that runs alone on the CPU backend and is refused at add() by a
// backend that bounds its rows, InferenceBackend::bounds_step_rows). Mixture-of-experts routing
// is recorded in GenerationResult::routing (BackendSegment::routing).
class BackendGenerator final : public StepGenerator {
 public:
  BackendGenerator(std::unique_ptr<model::InferenceBackend> backend, int64_t max_step_tokens);

  // InvalidArgument for an empty prompt, a token out of range, bad sampling params, a prompt
  // longer than max_step_tokens (on a backend that bounds its rows) or a prompt + max_new_tokens
  // over max_position_embeddings; ResourceExhausted when the backend's KV pool lacks the blocks.
  absl::StatusOr<int64_t> add(std::vector<int32_t> prompt, const model::SamplingParams& params,
                              uint64_t stream) override;
  absl::Status step() override;
  std::vector<model::GenerationResult> take_finished() override;
  absl::StatusOr<model::GenerationResult> cancel(int64_t id) override;
  bool idle() const override { return active_.empty(); }
  int64_t num_active() const { return static_cast<int64_t>(active_.size()); }
  // Blocks held by live sequences x the backend's bytes per block.
  int64_t kv_cache_bytes() const override;
  absl::Status set_model(std::shared_ptr<const model::Model> model) override;
  absl::Status prepare_model(std::shared_ptr<const model::Model> model) override {
    return backend_->prepare_model(std::move(model));
  }

  model::InferenceBackend& backend() { return *backend_; }

 private:
  struct Sequence {
    model::GenerationResult result;
    model::SamplingParams params;
    model::Rng rng;
    std::unique_ptr<model::KvSequence> kv;
    bool prefilled = false;
  };
  std::unique_ptr<model::InferenceBackend> backend_;
  int64_t max_step_tokens_;
  int64_t next_id_ = 0;
  std::vector<std::unique_ptr<Sequence>> active_;
  std::vector<model::GenerationResult> finished_;
};

// Generates for every prompt (prompt i uses stream i) on the CPU backend (make_cpu_backend, no
// KV budget, one step takes every decoding row and the prefills within max(2048, the longest
// prompt) rows) and returns the results in prompt order. Errors name the prompt.
absl::StatusOr<std::vector<GenerationResult>> generate(
    std::shared_ptr<const Model> model, const std::vector<std::vector<int32_t>>& prompts,
    const SamplingParams& params);

}  // namespace fp8rl::model
