// Batched generation with a KV cache and a step API for continuous batching: the generation
// worker add()s sequences at any time, calls step() (one forward: prefill of the new sequences
// plus one decode token for every running one), collects take_finished() and cancel()s sequences
// whose caller went away. generate() is the simple whole-batch call built on it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/model.h"
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

class Generator {
 public:
  // max_step_tokens bounds the rows of one step (new prefills wait for a later step beyond it;
  // a single prompt longer than it still runs alone).
  explicit Generator(std::shared_ptr<const Model> model, int64_t max_step_tokens = 2048);

  // Queues a sequence; its random stream is derive_seed(params.seed, stream), so a sample's
  // tokens depend on (seed, stream) only, not on what else is in the batch.
  absl::StatusOr<int64_t> add(std::vector<int32_t> prompt, const SamplingParams& params,
                              uint64_t stream = 0);
  // One batched forward over every unfinished sequence. No-op when idle.
  absl::Status step();
  // Finished sequences since the last call, in finishing order.
  std::vector<GenerationResult> take_finished();
  // Cancels the unfinished sequence `id` (waiting for its prefill or decoding) between steps: it
  // takes no rows from the next step() on, its KV cache is freed now, and it never appears in
  // take_finished(); returns what it had generated (reason kCancelled). The other sequences'
  // tokens and logprobs are exactly those they would have had without it. Errors (nothing
  // changes): NotFound for an id add() never returned; FailedPrecondition for a sequence that
  // already finished (its result stays in take_finished() if not yet taken) or was cancelled.
  absl::StatusOr<GenerationResult> cancel(int64_t id);

  int64_t num_active() const { return static_cast<int64_t>(active_.size()); }
  bool idle() const { return active_.empty(); }
  int64_t kv_cache_bytes() const;
  const std::shared_ptr<const Model>& model() const { return model_; }
  // Swaps the model between batches; fails while sequences are active.
  absl::Status set_model(std::shared_ptr<const Model> model);

 private:
  struct Sequence {
    GenerationResult result;
    SamplingParams params;
    Rng rng;
    std::unique_ptr<KvCache> cache;
    bool prefilled = false;
  };
  std::shared_ptr<const Model> model_;
  int64_t max_step_tokens_;
  int64_t next_id_ = 0;
  std::vector<std::unique_ptr<Sequence>> active_;
  std::vector<GenerationResult> finished_;
  Sampler sampler_;
  InferenceWorkspace ws_;
  std::vector<CachedSegment> segments_;
  std::vector<Sequence*> stepped_;
  std::vector<float> logits_;
};

// Generates for every prompt (prompt i uses stream i) and returns results in prompt order.
absl::StatusOr<std::vector<GenerationResult>> generate(
    std::shared_ptr<const Model> model, const std::vector<std::vector<int32_t>>& prompts,
    const SamplingParams& params);

}  // namespace fp8rl::model
