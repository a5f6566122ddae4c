// The generation loop of the generation worker's scheduler and of `fp8rl generate`, on either
// device: Generator on the CPU model (the reference, also for mixture-of-experts routing), or
// BackendGenerator over an InferenceBackend (the CUDA backend on --device cuda; docs/design/gpu.md
// "The GPU path"). Both keep Generator's contract: a sample's stream is derive_seed(seed, stream),
// so its tokens do not depend on what shares its batch; cancel() frees its KV blocks at once.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/generator.h"
#include "model/inference_backend.h"
#include "model/model.h"
#include "model/rng.h"
#include "model/sampler.h"

namespace fp8rl::model {

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

// model::Generator as a StepGenerator.
std::unique_ptr<StepGenerator> make_cpu_step_generator(std::shared_ptr<const model::Model> model,
                                                       int64_t max_step_tokens);

// model::Generator's loop over an InferenceBackend: each sample holds a KvSequence of prompt +
// max_new_tokens positions from add() to its end; each step is one forward_sample() over the
// decoding rows and the prefills that fit in max_step_tokens (the backend's rows per step, so a
// longer prompt is refused at add()).
// Mixture-of-experts routing is not reported (GenerationResult::routing stays empty).
class BackendGenerator final : public StepGenerator {
 public:
  BackendGenerator(std::unique_ptr<model::InferenceBackend> backend, int64_t max_step_tokens);

  // InvalidArgument for an empty prompt, a token out of range, bad sampling params, a prompt
  // longer than max_step_tokens or a prompt + max_new_tokens over max_position_embeddings;
  // ResourceExhausted when the backend's KV pool lacks the blocks.
  absl::StatusOr<int64_t> add(std::vector<int32_t> prompt, const model::SamplingParams& params,
                              uint64_t stream) override;
  absl::Status step() override;
  std::vector<model::GenerationResult> take_finished() override;
  absl::StatusOr<model::GenerationResult> cancel(int64_t id) override;
  bool idle() const override { return active_.empty(); }
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

}  // namespace fp8rl::model
