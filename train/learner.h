// The learner: the policy under training (fp32 master weights + AdamW state, an optional frozen
// reference copy) and the updates that change it, with plain C++ requests and results (no gRPC,
// no protobuf; services/trainer_worker translates its proto messages to these).
//   - GRPO update (docs/design/rl-step.md "The RL step", steps 5-6): prev logprobs, then epochs x
//     minibatches of IS-corrected policy loss, backward and AdamW.
//   - SFT update: NLL of the masked response tokens, minibatches of AdamW steps.
//   - Export for generation: the KV scales from the K/V amax the step's own forward recorded (no
//     extra pass), then the weights re-quantized to the generation format, with the policy in
//     config.json.
//   - Checkpoints: train/checkpoint.h.
// Errors are absl::Status naming the field (INVALID_ARGUMENT), FAILED_PRECONDITION for a KL term
// without a reference policy, UNAVAILABLE when `stop` was set during an update. Not thread-safe:
// the caller serializes calls.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/precision.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "rl/grpo.h"
#include "rl/mismatch.h"
#include "train/batch.h"
#include "train/collectives.h"
#include "train/collectives_bucketed.h"
#include "train/gradient_buckets.h"
#include "train/memory_plan.h"
#include "train/optimizer_shards.h"
#include "train/shard.h"
#include "train/train_backend.h"

namespace fp8rl::train {

// KV-cache calibration (docs/design/fp8-recipe.md "The FP8 recipe"): percentile 99.9 of the
// per-sequence amax of each layer's K and V, x 1.05 margin, / 448 (E4M3 max).
inline constexpr double kKvCalibrationPercentile = 99.9;
inline constexpr double kKvCalibrationMargin = 1.05;
// Passes over a GRPO batch accepted in one update.
inline constexpr int64_t kMaxEpochs = 64;

// Where and how a policy trains (the trainer worker's --device, --gpu-memory-fraction,
// --recompute and --max-step-tokens).
struct TrainPlacement {
  // train/train_backend.h; cuda is FAILED_PRECONDITION in a build without CUDA.
  model::Device device = model::Device::kCpu;
  int64_t memory_budget_bytes = 0;  // device memory the backend may take (0: unchecked)
  // Activation recomputation of the training forwards (the gradients are the same).
  Recompute recompute = Recompute::kNone;
  // The step shape the memory plan budgets for (train/memory_plan.h): tokens of the largest
  // forward, and tokens whose K/V a step's generation caches (0: the same as max_step_tokens).
  int64_t max_step_tokens = 16384;
  int64_t kv_cache_tokens = 0;
  // The group the learner is made for (a trainer joins its group before InitPolicy): the memory
  // plan counts this rank's shard under `shard`, and a device backend keeps the optimizer state
  // of its shard only from the start (InitialShard). trainers 1: alone.
  int trainers = 1;
  int rank = 0;
  ShardMode shard = ShardMode::kNone;
};

// The InitialShard of `placement` for a model with `layout` (none on the CPU, alone, or
// unsharded); INVALID_ARGUMENT for trainers < 1 or a rank outside [0, trainers).
absl::StatusOr<InitialShard> initial_shard(const model::ParamLayout& layout,
                                           const TrainPlacement& placement);

struct InitRequest {
  std::string job_id;
  // Exactly one model source: a checkpoint folder, or a model config (JSON text, or a path to a
  // config.json) with a seed for the random initialization.
  std::string checkpoint_dir;
  std::string model_config_json;
  uint64_t seed = 0;
  PrecisionConfig precision;
  model::AdamWConfig adamw;
  bool keep_reference = false;
  // Sequences to calibrate the KV scales on until the first update provides data (the initial
  // publish, before any rollout). May be empty.
  std::vector<Sequence> calibration;
  TrainPlacement placement;
};

// The memory plan of a policy `config` trained in `precision` under `placement`:
// RESOURCE_EXHAUSTED when placement.memory_budget_bytes > 0 and the plan exceeds it.
absl::StatusOr<MemoryPlan> plan_for(const model::ModelConfig& config,
                                    const PrecisionConfig& precision,
                                    const TrainPlacement& placement);

struct GrpoRequest {
  std::vector<Sequence> batch;  // gen_logprobs required
  rl::PolicyLossConfig loss;    // clip_eps, kl_beta, IS rule and bounds
  double temperature = 0;       // sampling temperature of the rollouts (0 = 1)
  int64_t minibatches = 1;      // optimizer steps per pass, in [1, batch size]
  int64_t epochs = 1;           // passes over the batch, in [0, kMaxEpochs] (0 = 1)
  double learning_rate = 0;     // > 0: set the optimizer's learning rate first
  // Mixture of experts: replay Sequence::routing in every forward; load-balancing loss weight.
  bool routing_replay = false;
  double router_aux_loss_coef = 0;
};

// Routing of a mixture-of-experts GRPO step, from its prev-logprobs forward (the policy that
// generated the batch; docs/metrics.md "Mixture of experts").
struct MoeStepStats {
  bool present = false;       // the policy has sparse layers
  int64_t routed_tokens = 0;  // tokens with a generation routing record
  // ... whose training-time routing (the router's own choice) differs in some sparse layer
  int64_t differ_tokens = 0;
  bool replay = false;
  double aux_loss = 0;
  int64_t num_experts = 0;
  std::vector<int64_t> expert_tokens;  // [sparse layers, num_experts]
};

struct GrpoResult {
  double loss = 0, pg_loss = 0, kl = 0, grad_norm = 0;  // means over the updates
  double learning_rate = 0;                             // after the last update
  double clip_fraction = 0;      // clipped tokens / valid tokens, averaged over epochs
  int64_t tokens = 0;            // valid (masked-in) response tokens
  int64_t updates = 0;           // optimizer steps taken
  rl::MismatchMetrics mismatch;  // generation vs prev logprobs
  MoeStepStats moe;
  double logprob_seconds = 0, forward_backward_seconds = 0, optimizer_seconds = 0;
  // In a trainer group: time in and payload bytes of this update's all-reduces; group size.
  double all_reduce_seconds = 0;
  int64_t all_reduce_bytes = 0;
  int group_size = 1;
  // Time the update waited for the gradient all-reduce after the backward: all of it when
  // unbucketed, what the backward did not hide when bucketed (Learner::set_group).
  double gradient_wait_seconds = 0;
  // Per request sequence, the logprobs of its loss tokens (the response tokens in the loss, in
  // order): gen as sent, prev as the learner computed them before the update. What the mismatch
  // metrics are computed from, so they can be recomputed from a log of these.
  // Mixture of experts (empty for dense models): the generation's routing record as sent
  // (Sequence::routing) and the router's own top-k in the prev-logprobs forward for every token
  // ([tokens, sparse layers, top_k]), what the MoE step statistics are computed from.
  struct SequenceLogprobs {
    std::vector<float> gen, prev;
    std::vector<int32_t> gen_routing, router_routing;
  };
  std::vector<SequenceLogprobs> logprobs;
};

struct SftRequest {
  std::vector<Sequence> batch;
  double learning_rate = 0;  // > 0
  int64_t minibatches = 1;   // in [1, batch size]
};

struct SftResult {
  double loss = 0, grad_norm = 0;  // means over the minibatches
  double learning_rate = 0;
  int64_t tokens = 0;
  int64_t updates = 0;
  double forward_backward_seconds = 0, optimizer_seconds = 0;
  double all_reduce_seconds = 0;
  int64_t all_reduce_bytes = 0;
  int group_size = 1;
  // Time the update waited for the gradient all-reduce after the backward: all of it when
  // unbucketed, what the backward did not hide when bucketed (Learner::set_group).
  double gradient_wait_seconds = 0;
};

// The loss and parameter gradient of a GRPO request taken as one minibatch (nothing updated).
struct PolicyGradient {
  rl::PolicyLossResult loss;
  std::vector<float> prev_logprobs;  // [B*L]
  std::vector<float> grads;          // [num_params]
};

struct ScaleStats {
  double min = 0, mean = 0, max = 0;
  int64_t count = 0;
};

// The weights for generation workers and what making them measured.
struct Export {
  model::WeightSet weights;  // config_json carries "fp8rl_precision" (the generation policy)
  PrecisionPolicy policy;    // the policy generation runs these weights with
  bool calibrated = false;   // KV scales were recalibrated
  double calibrate_seconds = 0, quantize_seconds = 0;
  ScaleStats weight_scale_inv;  // over every *_scale_inv value (FP8 exports)
  ScaleStats k_scale, v_scale;
};

class Learner {
 public:
  // A new policy from a checkpoint folder or a random init (version from the folder's
  // trainer_state.json when present, else 0).
  static absl::StatusOr<std::unique_ptr<Learner>> create(const InitRequest& request);
  // The same over a policy model already built (version 0; the request's checkpoint_dir, config
  // and seed are not read). `model`'s policy must be request.precision's training policy
  // (INVALID_ARGUMENT otherwise). Benchmarks build the random master once for several precisions.
  static absl::StatusOr<std::unique_ptr<Learner>> create(const InitRequest& request,
                                                         std::unique_ptr<model::Model> model);
  // Everything already loaded (train/checkpoint.cc); `optimizer` was built on `model`.
  Learner(std::string job_id, PrecisionConfig precision, std::unique_ptr<model::Model> model,
          std::unique_ptr<model::Model> reference, std::unique_ptr<model::AdamW> optimizer,
          int64_t version, int64_t published_version);
  // The policy on `backend` (any device).
  Learner(std::string job_id, PrecisionConfig precision, std::unique_ptr<TrainBackend> backend,
          std::unique_ptr<model::Model> reference, int64_t version, int64_t published_version);

  // Response logprobs of `seqs` under the policy (or the reference), one vector per sequence.
  absl::StatusOr<std::vector<std::vector<float>>> logprobs(std::span<const Sequence> seqs,
                                                           double temperature,
                                                           bool use_reference) const;
  // The GRPO update; advances version() by one when any optimizer step was taken (also when
  // stopped or failed midway). `stop` (optional) is polled before each optimizer step.
  absl::StatusOr<GrpoResult> grpo_update(const GrpoRequest& request,
                                         const std::atomic<bool>* stop = nullptr);
  absl::StatusOr<SftResult> sft_update(const SftRequest& request,
                                       const std::atomic<bool>* stop = nullptr);
  absl::StatusOr<PolicyGradient> gradient(const GrpoRequest& request) const;

  // Weights for generation in `format` (kFP8 or kBF16) stamped with `version`. With
  // `calibrate_kv` and an FP8 KV cache, first sets the KV scales (policy and export) from the K/V
  // amax the last update recorded in its own forward: the prev-logprobs forward of a GRPO update
  // (the weights before the update, every sequence of the batch), the training forwards of an
  // SFT update. No forward runs here, except before any update: then one forward over
  // InitRequest.calibration on the model generation runs.
  absl::StatusOr<Export> export_for_generation(Precision format, int64_t version,
                                               bool calibrate_kv);
  // Makes the GRPO and SFT updates data-parallel over `group` (docs/design/training.md "Trainer
  // groups"): every rank of the group is sent the same request and takes a token-balanced share of
  // each minibatch (train/data_parallel.h); gradients are summed across ranks with each rank's loss
  // normalized by the whole minibatch's token count, so every rank applies the same AdamW step
  // (the single-trainer step up to summation order), then the ranks compare weight hashes (INTERNAL
  // on a mismatch). The prev logprobs and K/V amax records are gathered, so metrics and KV
  // calibration cover the whole batch on every rank. A collective failure fails the update with
  // its status (DEADLINE_EXCEEDED / UNAVAILABLE). Non-owning; null (or one rank) = alone.
  // bucket_bytes > 0: gradients are all-reduced in buckets of that many bytes while the backward
  // runs (train/collectives_bucketed.h); 0: in one all-reduce after the backward.
  void set_group(Collectives* group, int64_t bucket_bytes = 0);
  Collectives* group() const { return group_; }
  // ZeRO-2 (trainer.shard, docs/design/sharding.md), after set_group. kGradsOptimizer in a group
  // of 2 or more: the flat parameters are cut into block-aligned shards (train::shard_parameters);
  // each rank keeps the AdamW moments of its own shard only, receives only its shard of the summed
  // gradient (reduce-scatter, bucketed as set_group says), keeps the fp32 master of its shard
  // only, steps AdamW on that shard (the clip norm summed across the shards in the order one
  // trainer sums it), re-derives the working copies of its shard and all-gathers the ranks'
  // (TrainBackend::gather_working). Irreversible for this learner:
  // in another group (size or rank) its updates are FAILED_PRECONDITION (check_shard_group); its
  // optimizer is re-cut only by loading a checkpoint (train/checkpoint.h, which saves a sharded
  // optimizer per rank). Alone (no group or one rank) the mode is recorded and nothing is
  // sharded. kParams (ZeRO-3): the same, and the working copies are kept for the rank's shard
  // only and all-gathered unit by unit while each forward and backward runs
  // (TrainBackend::shard_working, train/unit_gather.h); every rank runs the same gathers, also a
  // rank without a sequence in a minibatch. Under kParams logprobs() of the policy and gradient()
  // are FAILED_PRECONDITION (one rank cannot run a forward alone), and an export of the working
  // copies gathers them whole for the call. kNone after sharding, another mode than the one
  // sharded with, or a backend that cannot shard: FAILED_PRECONDITION. Calling it again with the
  // same mode once sharded changes nothing.
  // A pending sharded optimizer state (set_pending_optimizer_shards) is restored here, re-cut to
  // the range this learner now holds; its read errors are returned.
  absl::Status set_shard_mode(ShardMode mode);
  // FAILED_PRECONDITION when sharded for another group size or rank than the current group's.
  absl::Status check_shard_group() const;
  // The whole fp32 master (num_params floats, layout order), a copy. Sharded, where each rank
  // holds the master of its own shard only, a collective: every rank of the group calls it and
  // the shards are all-gathered (4 bytes per parameter, transient; the checkpoint's
  // model.safetensors, exports that need the master, tests). FAILED_PRECONDITION unsharded on a
  // device backend (its master is on the device: export_weights) or out of the shard's group.
  absl::StatusOr<std::vector<float>> whole_master(std::string_view what = "") const;
  // backend().export_weights, except that a sharded learner gathers the master first when the
  // format needs it (model::Model::export_needs_master; then a collective, as whole_master).
  absl::StatusOr<model::WeightSet> export_weights(model::WeightFormat format,
                                                  int64_t version) const;
  // The optimizer state of a sharded checkpoint (train/checkpoint.cc load_checkpoint): read from
  // `dir`'s optimizer_shards/ once the learner knows its range, by set_shard_mode or else by the
  // first update. Until then the optimizer holds the initial (zero) state.
  void set_pending_optimizer_shards(std::string dir, OptimizerShardManifest manifest);
  bool optimizer_restore_pending() const { return pending_shards_.has_value(); }
  ShardMode shard_mode() const { return shard_mode_; }
  // Bytes of gradient storage this rank held at most during the last update: the backend's
  // whole buffer alone; in a group the whole host array (plus, sharded without buckets, the
  // shard of the sum); sharded with buckets (set_group's bucket_bytes > 0) the shard of the sum
  // plus the most bucket buffers held at once (train/gradient_buckets.h), never a whole array.
  int64_t gradient_peak_bytes() const { return gradient_peak_bytes_; }
  // ZeRO-2's gradient buckets (null unless sharded in a group with bucket_bytes > 0).
  const GradientBuckets* gradient_buckets() const { return gradient_buckets_.get(); }
  // The cut in use (null unless sharded).
  const ShardLayout* shard_layout() const { return shard_layout_ ? &*shard_layout_ : nullptr; }
  // After a successful upload of `version`.
  void set_published(int64_t version) { version_ = published_version_ = version; }

  const std::string& job_id() const { return job_id_; }
  const PrecisionConfig& precision() const { return precision_; }
  int64_t version() const { return version_; }
  int64_t published_version() const { return published_version_; }
  // The policy as the host describes it (TrainBackend::host_model: on the CPU backend, the model
  // that trains).
  const model::Model& policy() const { return backend_->host_model(); }
  const model::Model* reference() const { return reference_.get(); }
  const TrainBackend& backend() const { return *backend_; }
  TrainBackend& backend() { return *backend_; }
  int64_t optimizer_steps() const { return backend_->optimizer_steps(); }
  // The memory plan computed when the policy was created (before the backend allocated).
  const MemoryPlan& memory_plan() const { return memory_plan_; }
  void set_memory_plan(MemoryPlan plan) { memory_plan_ = std::move(plan); }
  const model::AdamWConfig& optimizer_config() const { return backend_->optimizer_config(); }
  // K/V amax samples (sequences) the next export calibrates on: the last update's, 0 before any.
  int64_t kv_calibration_records() const { return kv_records_ ? kv_records_->num_records() : 0; }

 private:
  struct Prepared {
    PackedBatch batch;
    std::vector<float> prev, ref;  // [B*L]; ref empty unless kl_beta > 0
    double logprob_seconds = 0;
    MoeStepStats moe;
    model::TokenRouting router_choice;  // MoE: the prev forward's router top-k per sequence
  };
  // Validates and computes the prev (and ref) logprobs; `calibrator` (optional) records the K/V
  // amax of the prev-logprobs forward.
  // `shares` (data-parallel only): per minibatch, this rank's sequence range; the logprobs are
  // computed for those rows only and then gathered from the group.
  absl::StatusOr<Prepared> prepare(const GrpoRequest& request, model::KvCalibrator* calibrator,
                                   bool data_parallel = false) const;
  // Per minibatch i of m over B sequences: this rank's [begin, end) of sequences.
  std::vector<std::pair<int64_t, int64_t>> rank_shares(const PackedBatch& batch, int64_t m) const;
  bool data_parallel() const { return group_ != nullptr && group_->size() > 1; }
  // `grads` null: into the backend's own gradient buffer (TrainBackend::backward), which the
  // next optimizer_step(nullptr) reads.
  // Sharded: `bucketed` reduce-scatters into `shard` instead (begin_buckets); with `sink`
  // (ZeRO-2's buckets) the backward writes into the sink, `grads` is not touched and the sink
  // reduce-scatters into `shard`.
  absl::StatusOr<rl::PolicyLossResult> minibatch_gradient(
      const PackedBatch& mb, std::span<const float> prev, std::span<const float> ref,
      const rl::PolicyLossConfig& config, std::vector<float>* grads,
      BucketedAllReduce* bucketed = nullptr, const std::string& what = "",
      std::span<float> shard = {}, GradientBuckets* sink = nullptr) const;
  // (Re)builds gradient_buckets_ when sharded with buckets in the shard's group, else null.
  void make_gradient_buckets();
  // The gradient storage of one minibatch (see gradient_peak_bytes): the bucket pool's peak and
  // `shard`, the backend's whole buffer, or `grads` (+ `shard`).
  int64_t gradient_bytes(const std::vector<float>& grads, std::span<const float> shard,
                         bool backend_buffer) const;
  // Starts the buckets over `grads`: an all-reduce in place, or sharded a reduce-scatter into
  // `shard` (this rank's shard_layout_ piece).
  void begin_buckets(BucketedAllReduce* bucketed, std::vector<float>* grads, std::span<float> shard,
                     const std::string& what) const;
  // Sums this rank's `grads` over the group: with bucketed_, waits for the buckets begun in
  // minibatch_gradient (begun = true); else one all-reduce now (sharded: one reduce-scatter into
  // `shard`, and `grads` is left as this rank's own). Adds the wait to *wait_seconds.
  absl::Status reduce_gradients(std::vector<float>* grads, bool begun, const std::string& what,
                                double* wait_seconds, std::span<float> shard = {});
  // The optimizer step of an update: alone on the backend's own buffer, in a group on `grads`
  // (the sum), sharded on `shard` followed by the master all-gather.
  absl::StatusOr<model::OptimizerStepStats> step_optimizer(std::vector<float>* grads,
                                                           std::span<float> shard,
                                                           const std::string& where);
  // Sharded: the norm of the whole summed gradient from the ranks' shards, each rank adding its
  // squares to the total of the ranks before it (one 8-byte all-reduce per rank), so the double
  // sum runs over the elements in the order model::AdamW::step adds them on one trainer.
  absl::StatusOr<double> sharded_grad_norm(std::span<const float> shard, const std::string& what);
  bool sharded() const { return shard_layout_.has_value(); }
  // ZeRO-3, a rank without data where the others run a forward and a backward (a minibatch
  // without a sequence here; `forward` false: after a forward whose loss failed): the same unit
  // gathers, and with gradient buckets the same reduce-scatters, begun into `shard` (finished
  // here when `finish` or on error, else by reduce_gradients). A no-op unless sharded as params.
  absl::Status idle_pass(bool forward, std::span<float> shard, const std::string& what,
                         bool finish) const;
  // Whether idle_pass began the gradient buckets (reduce_gradients must not begin them again).
  bool idle_begins_buckets() const {
    return gradient_buckets_ != nullptr && backend_->sharded_units() != nullptr;
  }
  // Restores the pending sharded optimizer state into the range the optimizer holds (no-op when
  // none is pending).
  absl::Status restore_optimizer_shards();
  absl::Status set_learning_rate(double lr);
  // A calibrator for an update's forwards (null unless the KV cache is FP8).
  std::unique_ptr<model::KvCalibrator> new_kv_records() const;

  std::string job_id_;
  PrecisionConfig precision_;
  std::unique_ptr<TrainBackend> backend_;    // the policy, its optimizer state and device
  std::unique_ptr<model::Model> reference_;  // frozen, on the host
  MemoryPlan memory_plan_;
  int64_t version_ = 0;
  int64_t published_version_ = 0;
  // K/V amax records of the last update's forward (null before any update).
  std::unique_ptr<model::KvCalibrator> kv_records_;
  model::TokenBatch calibration_;  // InitRequest.calibration, for an export before any update
  Collectives* group_ = nullptr;   // see set_group
  // With a bucket size and a group of 2 or more: the overlapping all-reduce (see set_group).
  std::unique_ptr<BucketedAllReduce> bucketed_;
  ShardMode shard_mode_ = ShardMode::kNone;  // see set_shard_mode
  std::optional<ShardLayout> shard_layout_;  // set when sharded (a group of 2 or more)
  int shard_rank_ = 0;                       // the rank whose shard the optimizer holds
  // A sharded checkpoint's optimizer state not restored yet (see set_pending_optimizer_shards).
  std::string pending_shards_dir_;
  std::optional<OptimizerShardManifest> pending_shards_;
  int64_t gradient_peak_bytes_ = 0;  // see gradient_peak_bytes
  // Sharded with buckets: the gradient sink of every backward (make_gradient_buckets). Last: it
  // refers to group_ and shard_layout_, so it goes first.
  std::unique_ptr<GradientBuckets> gradient_buckets_;
};

// Checks a PrecisionConfig the services can run: fp8 or bf16 formats, layer counts >= 0. Errors
// name "<where>.<field>".
absl::Status validate_precision(const PrecisionConfig& precision, std::string_view where);

}  // namespace fp8rl::train
