// The trainer worker's logic, independent of gRPC plumbing so it can be tested in-process: holds
// the policy (fp32 master weights + AdamW state) and an optional frozen reference copy, computes
// logprobs, runs the IS-corrected GRPO update (ARCHITECTURE.md "One RL step", steps 5-6) and SFT
// steps, recalibrates KV scales and re-quantizes for publishing, and writes/reads checkpoints.
// Requests and responses are the proto messages of proto/fp8rl/v1/trainer.proto; every failure is
// an absl::Status naming the offending field (INVALID_ARGUMENT); ABORTED when the trainer does not
// hold the caller's policy (none loaded — e.g. the trainer restarted — or another job's id): the
// caller starts again from InitPolicy or LoadCheckpoint (the coordinator resumes the job from its
// last checkpoint); FAILED_PRECONDITION for other calls out of order (no reference policy).
//
// Versions: every TrainStep/SftStep request that updates the weights advances version() by one.
// Publish uploads max(version(), published + 1, weight sync's latest + 1), so published versions
// strictly increase even across trainer restarts, and sets version() to it.
//
// Calls are serialized (one update at a time); status() never waits for a running update.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fp8rl/v1/trainer.pb.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "rl/grpo.h"
#include "services/trainer_worker/trainer_metrics.h"
#include "services/trainer_worker/weight_publisher.h"

namespace fp8rl::trainer {

// KV-cache calibration of ARCHITECTURE.md: percentile 99.9 of per-forward amax, x 1.05, / 448.
inline constexpr double kKvCalibrationPercentile = 99.9;
inline constexpr double kKvCalibrationMargin = 1.05;
// Names inside a checkpoint folder written by save_checkpoint (beside config.json and
// model.safetensors).
inline constexpr char kTrainerStateFile[] = "trainer_state.json";
inline constexpr char kOptimizerStateFile[] = "optimizer.safetensors";
inline constexpr char kReferenceDir[] = "reference";

struct TrainerOptions {
  std::string worker_id = "trainer";
  // Used by Publish when the request names no weight-sync address.
  std::string default_weight_sync_address = "localhost:50052";
  // Relative SaveCheckpoint / LoadCheckpoint paths are taken relative to this folder.
  std::string data_dir = ".";
};

// A sequence batch after validation, as the padded B x L layout of rl/importance.h
// (L = longest response). Response token j of sequence b is tokens[b][prompt_length[b] + j].
struct PackedBatch {
  model::TokenBatch tokens;
  std::vector<int64_t> prompt_length;  // [B]
  int64_t length = 0;                  // L
  std::vector<uint8_t> mask;           // [B*L] 1 = response token in the loss
  std::vector<float> gen_logprobs;     // [B*L] (0 where absent)
  std::vector<float> advantages;       // [B]
  int64_t valid_tokens = 0;
  float temperature = 1.0f;  // logprobs are of logits / temperature (the sampling temperature)

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  rl::TokenLayout layout() const { return {size(), length}; }
  // Sequences [begin, end) as a batch of their own (same L).
  PackedBatch slice(int64_t begin, int64_t end) const;
};

// What gradient() returns: the policy-loss result of rl/grpo.h for the batch and dLoss/dparams.
struct PolicyGradient {
  rl::PolicyLossResult loss;
  std::vector<float> prev_logprobs;  // [B*L]
  std::vector<float> grads;          // [num_params]
};

class Trainer {
 public:
  // `publisher` (required) and `metrics` (optional) must outlive the trainer.
  Trainer(TrainerOptions options, WeightPublisher* publisher, TrainerMetrics* metrics = nullptr);

  absl::StatusOr<v1::InitPolicyResponse> init_policy(const v1::InitPolicyRequest& request);
  absl::StatusOr<v1::ComputeLogprobsResponse> compute_logprobs(
      const v1::ComputeLogprobsRequest& request);
  absl::StatusOr<v1::TrainStepResponse> train_step(const v1::TrainStepRequest& request);
  absl::StatusOr<v1::SftStepResponse> sft_step(const v1::SftStepRequest& request);
  absl::StatusOr<v1::PublishResponse> publish(const v1::PublishRequest& request);
  absl::StatusOr<v1::SaveCheckpointResponse> save_checkpoint(
      const v1::SaveCheckpointRequest& request);
  absl::StatusOr<v1::LoadCheckpointResponse> load_checkpoint(
      const v1::LoadCheckpointRequest& request);
  v1::TrainerStatus status() const;

  // The loss and parameter gradient TrainStep would apply for the whole request batch taken as
  // one minibatch, without updating anything (tests compare it with rl/grpo.h directly).
  absl::StatusOr<PolicyGradient> gradient(const v1::TrainStepRequest& request);

  // Makes running and later updates stop at the next minibatch boundary with UNAVAILABLE
  // (graceful shutdown past its grace period). Irreversible.
  void begin_shutdown() { stopping_.store(true); }

  // The held policy (nullptr before InitPolicy). Not synchronized: tests only, between calls.
  const model::Model* policy() const { return model_.get(); }
  const model::AdamW* optimizer() const { return optimizer_.get(); }
  // The WeightSet of the last successful publish (tests).
  const model::WeightSet& last_published() const { return last_published_; }

 private:
  // A TrainStep request after validation, with prev (and ref) logprobs of its batch.
  struct PreparedStep {
    PackedBatch batch;
    rl::PolicyLossConfig config;
    std::vector<float> prev, ref;  // [B*L]; ref empty unless kl_beta > 0
    double logprob_seconds = 0;
  };

  absl::Status check_job(const std::string& job_id) const;
  absl::StatusOr<PreparedStep> prepare_step(const v1::TrainStepRequest& request);
  // Validates and packs sequences; `name` is the request's field name, for error messages.
  absl::StatusOr<PackedBatch> pack(
      const google::protobuf::RepeatedPtrField<v1::TrainSequence>& seqs, const std::string& name,
      bool require_gen) const;
  absl::StatusOr<rl::PolicyLossConfig> loss_config(const v1::AlgorithmParams& a) const;
  // Response-token logprobs of `batch` under `model`, [B*L] (0 at padding).
  absl::StatusOr<std::vector<float>> response_logprobs(const model::Model& model,
                                                       const PackedBatch& batch,
                                                       model::ForwardContext* ctx) const;
  // Policy loss + backward for one minibatch; grads (num_params) are overwritten.
  absl::StatusOr<rl::PolicyLossResult> minibatch_gradient(const PackedBatch& mb,
                                                          std::span<const float> prev,
                                                          std::span<const float> ref,
                                                          const rl::PolicyLossConfig& config,
                                                          std::vector<float>* grads) const;
  absl::Status set_learning_rate(double lr);
  absl::StatusOr<model::WeightSet> export_for_generation(v1::WeightFormat format,
                                                         int64_t version) const;
  // Replaces the held policy and everything that belongs to it.
  void install(std::unique_ptr<model::Model> model, std::unique_ptr<model::Model> reference,
               std::unique_ptr<model::AdamW> optimizer, const v1::PrecisionSpec& precision,
               const std::string& job_id, int64_t version, int64_t published_version);
  void update_status();
  // An update failed after `applied` optimizer steps: those still make a new version.
  absl::Status interrupted(int64_t applied, const absl::Status& error);
  std::string resolve_path(const std::string& path) const;

  const TrainerOptions options_;
  WeightPublisher* publisher_;
  TrainerMetrics* metrics_;
  std::atomic<bool> stopping_{false};

  std::mutex mu_;  // serializes every call that touches the policy
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<model::Model> reference_;
  std::unique_ptr<model::AdamW> optimizer_;
  v1::PrecisionSpec precision_;  // resolved (no UNSPECIFIED formats)
  std::string job_id_;
  int64_t version_ = 0;
  int64_t published_version_ = 0;
  model::TokenBatch last_batch_;  // data of the last update, for KV calibration
  model::WeightSet last_published_;

  mutable std::mutex status_mu_;  // guards status_ only (never held during work)
  v1::TrainerStatus status_;
};

}  // namespace fp8rl::trainer
