// The trainer worker's request handling, independent of gRPC plumbing so it can be tested
// in-process: translates the proto messages of proto/fp8rl/v1/trainer.proto to the plain requests
// of the training layer (train/learner.h: GRPO and SFT updates, export for generation;
// train/checkpoint.h), serializes calls, uploads published weights and records metrics. Every
// failure is
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
#include "common/service/security.h"
#include "fp8rl/v1/trainer.pb.h"
#include "services/trainer_worker/trainer_metrics.h"
#include "services/trainer_worker/weight_publisher.h"
#include "train/learner.h"

namespace fp8rl::trainer {

using train::PolicyGradient;

struct TrainerOptions {
  std::string worker_id = "trainer";
  // Used by Publish when the request names no weight-sync address.
  std::string default_weight_sync_address = "localhost:50052";
  // Relative SaveCheckpoint / LoadCheckpoint paths are taken relative to this folder.
  std::string data_dir = ".";
  // When set (relative: under data_dir), every TrainStep writes the per-token logprobs its
  // mismatch metrics come from to <dir>/<job id>/step-<N>.jsonl (see write_logprob_log).
  std::string logprob_log_dir;
  // When set, paths from calls are confined (common/path_roots.h; symlinks and ".." resolved
  // first): SaveCheckpoint/LoadCheckpoint under data_root, model.checkpoint_dir under
  // models_root. A caller that skipped the coordinator's checks cannot escape them either.
  std::string data_root = {};
  std::string models_root = {};
  // The address other members of a trainer group reach this trainer's collectives at (Gloo TCP
  // listens on an ephemeral port of this interface).
  std::string group_host = "127.0.0.1";
  // The device the policy trains on (--device after resolution: "cpu" or "cuda"); it chooses the
  // training backend (train/train_backend.h) and the group's collectives
  // (train::backend_for_device: cpu -> Gloo, cuda -> NCCL).
  std::string device = "cpu";
  // On cuda: the bytes the training backend may take (--gpu-memory-fraction of the device).
  int64_t gpu_memory_budget_bytes = 0;
  // --recompute and --max-step-tokens (train::TrainPlacement).
  train::Recompute recompute = train::Recompute::kNone;
  int64_t max_step_tokens = 16384;
  // Gradients are all-reduced in buckets of this many bytes while the backward runs; 0: in one
  // all-reduce after it (train::Learner::set_group; --allreduce-bucket-mb, 4 MiB by default
  // there; 0 here for tests that build a Trainer directly).
  int64_t allreduce_bucket_bytes = 0;
  // What the ranks of a group shard (--shard; train::Learner::set_shard_mode after every
  // set_group).
  train::ShardMode shard = train::ShardMode::kNone;
  // The coordinator (its fp8rl.v1.Rendezvous) when JoinGroup names no rendezvous address.
  std::string coordinator_address;
  // TLS and the cluster token for calls to the rendezvous (as for the trainer's other calls).
  service::ClientSecurity rendezvous_security = {};
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
  // Forms (size > 1) or leaves (size 1) a data-parallel group (trainer.proto JoinGroup; the
  // updates in docs/design/training.md "Trainer groups"). Blocks until every rank joined or the
  // timeout. Replaces any earlier group. In a group, Publish on rank != 0 only sets the KV scales
  // (every rank's forward must use the same ones) and uploads nothing, except in a sharded
  // group (grads_optimizer, params), where every rank uploads its own part of the version.
  absl::StatusOr<v1::JoinGroupResponse> join_group(const v1::JoinGroupRequest& request);

  // The loss and parameter gradient TrainStep would apply for the whole request batch taken as
  // one minibatch, without updating anything (tests compare it with rl/grpo.h directly).
  absl::StatusOr<PolicyGradient> gradient(const v1::TrainStepRequest& request);

  // Makes running and later updates stop at the next minibatch boundary with UNAVAILABLE
  // (graceful shutdown past its grace period). Irreversible.
  void begin_shutdown() { stopping_.store(true); }

  // The held policy (nullptr before InitPolicy). Not synchronized: tests only, between calls.
  const model::Model* policy() const { return learner_ ? &learner_->policy() : nullptr; }
  int64_t optimizer_steps() const { return learner_ ? learner_->optimizer_steps() : 0; }
  const train::Learner* learner() const { return learner_.get(); }
  // A copy of the WeightSet of the last successful publish (tests). Taken under mu_: Publish
  // writes it on a gRPC handler thread, and a caller's only other ordering is gRPC's own, which
  // ThreadSanitizer cannot see (it reported this read as a race, scripts/sanitize.sh tsan).
  model::WeightSet last_published() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_published_;
  }

 private:
  // Publish in a sharded group (every rank uploads one part): the version and upload_id every
  // rank uses, agreed by one all-reduce from rank 0's (which asks weight sync at `address`).
  absl::StatusOr<int64_t> agree_on_version(const std::string& address, int64_t above_version,
                                           uint64_t* upload_id);
  // This rank's part of `weights` (plan_parts over the group's size, part_index = rank),
  // uploaded through publisher_->upload_part; the part's bytes.
  absl::StatusOr<uint64_t> upload_own_part(const std::string& address,
                                           const model::WeightSet& weights, Precision format,
                                           uint64_t upload_id);
  absl::Status check_job(const std::string& job_id) const;
  // Where new policies train (options_.device, budget, recompute, step shape).
  train::TrainPlacement placement() const;
  // `learner` joins group_ (options_' buckets), then takes shard_
  // (train::Learner::set_shard_mode: FAILED_PRECONDITION when it cannot; a pending sharded
  // optimizer state is restored there).
  absl::Status attach_group(train::Learner& learner);
  // The GRPO request of a TrainStep (validation of the proto-only fields).
  absl::StatusOr<train::GrpoRequest> grpo_request(const v1::TrainStepRequest& request) const;
  void update_status();
  std::string resolve_path(const std::string& path) const;
  // resolve_path(), then confined to options_.data_root when set (InvalidArgument naming "path").
  absl::StatusOr<std::string> confined_data_path(const std::string& path) const;
  absl::Status write_logprob_log(const std::string& job_id, int64_t step,
                                 const train::GrpoResult& result) const;

  const TrainerOptions options_;
  WeightPublisher* publisher_;
  TrainerMetrics* metrics_;
  std::atomic<bool> stopping_{false};

  std::mutex mu_;                              // serializes every call that touches the policy
  std::unique_ptr<train::Learner> learner_;    // guarded by mu_
  model::WeightSet last_published_;            // guarded by mu_
  std::unique_ptr<train::Collectives> group_;  // guarded by mu_; null when alone
  // The group's shard mode: JoinGroupRequest.shard, else options_.shard. Guarded by mu_.
  train::ShardMode shard_ = options_.shard;

  mutable std::mutex status_mu_;  // guards status_ only (never held during work)
  v1::TrainerStatus status_;      // guarded by status_mu_
};

}  // namespace fp8rl::trainer
