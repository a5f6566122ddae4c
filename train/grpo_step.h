// One whole GRPO step in one process, without services (docs/design/gpu-training.md "Training on
// the GPU", in-process GRPO step): generate G samples for each of P prompts on the published
// weights, score them, train on them (train/learner.h grpo_update over the learner's backend), then
// publish the new weights to the generation engine (export_for_generation, then an install into
// the generation backend). Every phase is timed; bench/grpo_step runs it for BF16, FP8 linears
// and FP8 linears + FP8 KV cache.
//
// Generation runs on a model::InferenceBackend (the CPU one, or the CUDA one on cuda) built from
// the exported payload, exactly what a generation worker would install. Training runs wherever
// the learner's backend is (train/train_backend.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "model/inference_backend.h"
#include "model/step_generator.h"
#include "train/learner.h"

namespace fp8rl::train {

// The reward of one completion (the completion's tokens, after the prompt).
using RewardFn =
    std::function<float(std::span<const int32_t> prompt, std::span<const int32_t> completion)>;

struct GrpoStepConfig {
  int64_t samples_per_prompt = 4;  // G (>= 2: group-relative advantages)
  int64_t new_tokens = 64;         // max new tokens per sample (no stop token: exactly this many)
  float temperature = 1.0f;        // sampling temperature (> 0)
  uint64_t seed = 1;               // sampling seed; sample g of prompt p is stream p * G + g
  rl::PolicyLossConfig loss;       // clip, IS rule
  int64_t minibatches = 1;         // optimizer steps per GRPO step
  // The generation engine: device and its memory budget (cuda: required), rows per forward.
  model::Device generation_device = model::Device::kCpu;
  int64_t generation_memory_bytes = 0;
  int64_t max_step_tokens = 4096;
};

// Seconds of each phase of one step. requantize is the re-quantization of the working copies
// timed alone once more after the step (the optimizer phase already includes one; the total
// does not count the extra one).
struct GrpoStepTimes {
  double generate = 0, score = 0, logprobs = 0, forward_backward = 0, optimizer = 0, requantize = 0,
         calibrate = 0, export_weights = 0, install = 0;
  double total() const {
    return generate + score + logprobs + forward_backward + optimizer + calibrate + export_weights +
           install;
  }
};

struct GrpoStepReport {
  GrpoStepTimes times;
  int64_t samples = 0, generated_tokens = 0;
  double mean_reward = 0;
  GrpoResult train;     // the update's loss, grad norm, mismatch metrics
  int64_t version = 0;  // published after the step
};

class InProcessGrpo {
 public:
  // Publishes `learner`'s current weights (export in the generation format with KV calibration
  // on `calibration`, then the generation backend built on them). `learner` must outlive this.
  static absl::StatusOr<std::unique_ptr<InProcessGrpo>> create(Learner* learner,
                                                               const GrpoStepConfig& config,
                                                               RewardFn reward);
  // One step over `prompts` (P prompts, each non-empty). INVALID_ARGUMENT naming the field for
  // bad prompts; errors of a phase are prefixed with the phase.
  absl::StatusOr<GrpoStepReport> step(std::span<const std::vector<int32_t>> prompts);

 private:
  InProcessGrpo(Learner* learner, GrpoStepConfig config, RewardFn reward)
      : learner_(learner), config_(std::move(config)), reward_(std::move(reward)) {}
  // Export + install of the learner's weights as `version`; adds the phase times to `times`.
  absl::Status publish(int64_t version, GrpoStepTimes* times);

  Learner* learner_;
  GrpoStepConfig config_;
  RewardFn reward_;
  std::unique_ptr<model::StepGenerator> generator_;
  int64_t steps_ = 0;
};

}  // namespace fp8rl::train
