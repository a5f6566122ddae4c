// The coordinator's RL loop (docs/design/rl-step.md "The RL step"): optional SFT warm start, then
// per step: P prompts x G samples spread over the live generation workers (unfinished samples of a
// failed or dead worker are re-dispatched, a sample is never counted twice), rewards and group
// advantages via rl/, TrainStep and Publish on the trainer, wait until every live generation
// worker holds the new version, validation at step 0 and every k steps, checkpoints every c
// steps, one metrics row per step in the job store. Cancellation is honoured between phases.
// With algorithm.max_staleness = K >= 1 the rollouts of the next K steps are generated while the
// trainer trains (docs/design/rl-step.md "Asynchronous RL", async_rollouts.h).
//
// It talks to workers only through the interfaces below, so tests drive it with in-process fakes
// and the binary with gRPC clients (grpc_cluster.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rl/job_config.h"
#include "rl/prompt_format.h"
#include "rl/step_metrics.h"
#include "rl/tasks.h"
#include "services/coordinator/job_store.h"

namespace fp8rl::coordinator {

class CoordinatorMetrics;
class RolloutQueue;

struct GenSample {
  std::string sample_id;
  std::vector<int32_t> prompt_tokens;
  uint64_t seed = 0;
};

struct GenParams {
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;
  int64_t max_new_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  int64_t min_weight_version = 0;
};

struct GenResult {
  std::string sample_id;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int64_t weight_version = 0;
  std::vector<int32_t> routing;  // mixture of experts: SampleResult.routed_experts
};

// One generation worker.
class GenerationClient {
 public:
  virtual ~GenerationClient() = default;
  // Generates `samples`, calling on_result (from the calling thread) as each finishes. Returns
  // when the stream ends; an error (worker died, deadline passed) may come after some results.
  virtual absl::Status generate(const std::string& request_id,
                                const std::vector<GenSample>& samples, const GenParams& params,
                                const std::function<void(GenResult)>& on_result,
                                std::chrono::milliseconds deadline) = 0;
  // Weight version the worker serves now.
  virtual absl::StatusOr<int64_t> weight_version() = 0;
};

struct TrainSequence {
  std::vector<int32_t> tokens;  // prompt then response
  int64_t prompt_length = 0;
  float advantage = 0.0f;
  std::vector<float> gen_logprobs;  // one per response token (empty for SFT)
  std::vector<int32_t> routing;     // mixture of experts: the generation's routing (may be empty)
};

struct TrainStepStats {
  std::map<std::string, double> values;  // loss, grad_norm, mismatch metrics, ...
};

class TrainerClient {
 public:
  virtual ~TrainerClient() = default;
  // Loads or initializes the policy described by the config; returns its version.
  virtual absl::StatusOr<int64_t> init_policy(const std::string& job_id,
                                              const rl::JobConfig& config) = 0;
  virtual absl::StatusOr<TrainStepStats> sft_step(const std::string& job_id,
                                                  const std::vector<TrainSequence>& batch,
                                                  double learning_rate) = 0;
  virtual absl::StatusOr<TrainStepStats> train_step(const std::string& job_id, int64_t step,
                                                    const std::vector<TrainSequence>& batch,
                                                    const rl::JobConfig& config) = 0;
  // Re-quantizes, calibrates and uploads to weight sync; returns the new version, which is
  // greater than above_version (the highest version a generation worker holds).
  virtual absl::StatusOr<int64_t> publish(bool calibrate_kv_scales, int64_t above_version) = 0;
  virtual absl::Status save_checkpoint(const std::string& path) = 0;
  // Returns the policy version of the checkpoint.
  virtual absl::StatusOr<int64_t> load_checkpoint(const std::string& path) = 0;
};

struct WorkerRef {
  std::string id;
  std::string address;
};

// What the loop needs from the cluster.
class Cluster {
 public:
  virtual ~Cluster() = default;
  virtual std::vector<WorkerRef> live_generation_workers() = 0;
  virtual bool is_live(const std::string& worker_id) = 0;
  virtual std::shared_ptr<GenerationClient> generation_client(const WorkerRef& worker) = 0;
  // The trainer; Unavailable when none is registered.
  virtual absl::StatusOr<std::shared_ptr<TrainerClient>> trainer() = 0;
  // A data-parallel group of `size` trainers behind one TrainerClient (docs/design/training.md
  // "Trainer groups"), formed anew on every call; Unavailable saying how many are live while fewer
  // than `size` are registered. Clusters without groups serve size 1 only. `shard` is the job's
  // trainer.shard ("none" | "grads_optimizer"), what the ranks shard.
  virtual absl::StatusOr<std::shared_ptr<TrainerClient>> trainer_group(int size,
                                                                       const std::string& shard) {
    (void)shard;  // one trainer shards nothing
    if (size == 1) return trainer();
    return absl::UnimplementedError("this cluster has no trainer groups");
  }
};

struct RlLoopOptions {
  // One Generate call may run this long before its unfinished samples are re-dispatched.
  std::chrono::milliseconds generate_deadline{std::chrono::seconds(120)};
  // How long to wait for any live generation worker (or the trainer) before failing the job.
  std::chrono::milliseconds worker_wait{std::chrono::seconds(60)};
  // How long to wait for every live worker to hold a newly published version.
  std::chrono::milliseconds sync_wait{std::chrono::seconds(60)};
  // After this long in that wait, one warning names the live workers without the version
  // (weight sync cut off from them, or slow) and counts them (sync_lagging_workers).
  std::chrono::milliseconds sync_lag_warn{std::chrono::seconds(5)};
  std::chrono::milliseconds poll_interval{std::chrono::milliseconds(50)};
  // After the trainer is lost (is_trainer_lost), how long the JobManager keeps trying to resume
  // the job from its last checkpoint on a trainer that is back before failing it; 0 fails the
  // job at once.
  std::chrono::milliseconds trainer_resume_wait{std::chrono::seconds(120)};
  // Resumes of one job after trainer losses, at most (a trainer that keeps dying fails the job).
  int max_trainer_resumes = 10;
  // How long a job-store write the job needs (a metrics row, its step, its checkpoint, its final
  // state) is retried while the store refuses it before the job fails naming it (store_retry.h).
  std::chrono::milliseconds store_retry_wait{std::chrono::seconds(10)};
};

struct RlLoopHooks {
  JobStore* store = nullptr;              // required
  CoordinatorMetrics* metrics = nullptr;  // optional
  std::function<bool()> cancelled;        // optional: true once the user cancelled the job
  std::function<void()> on_progress;      // optional: called after each recorded step
  // Optional: the job's current phase (JobProgress without updated_ms), at every phase change
  // and after every SFT step.
  std::function<void(const JobProgress&)> on_phase;
  // Optional: a fault the loop handled, for the job's event list (JobStore::add_event): kind
  // ("checkpoint_fallback") and a sentence.
  std::function<void(std::string_view kind, std::string_view message)> on_event;
};

// Where the loop saves the checkpoint taken after `step`: <checkpoint.dir>/<job id>/step-<step>.
std::string checkpoint_path(const rl::JobConfig& config, const std::string& job_id, int64_t step);

// A failed job whose error carries this payload lost its trainer (the trainer process died, was
// restarted without the job's policy, or stopped answering) or a published weight version (it
// reached no live generation worker): the JobManager may run it again, resuming from its last
// checkpoint, once a trainer is back.
inline constexpr char kTrainerLostPayload[] = "fp8rl.dev/trainer-lost";
bool is_trainer_lost(const absl::Status& status);

// Counters of one dispatch, for tests and metrics.
struct DispatchStats {
  int64_t calls = 0;
  int64_t failed_calls = 0;
  int64_t redispatched_samples = 0;
  int64_t duplicate_results = 0;
};

// One RL step's samples and what the workers generated for them (steps 1-2).
struct StepRollout {
  int64_t step = 0;
  std::vector<rl::Example> prompts;          // [P] the step's training examples
  std::vector<GenSample> samples;            // [P*G] group-major: sample g of prompt p at p*G+g
  std::map<std::string, GenResult> results;  // by sample_id, one per sample
  double generate_seconds = 0.0;             // wall clock of the dispatch
  int64_t redispatched_samples = 0;          // of the dispatch (DispatchStats)
};

// How the job encodes prompts and decodes completions (rl/prompt_format.h): the tokenizer.json,
// chat template and stop ids of its model.checkpoint folder when that folder has a tokenizer.json,
// else the byte tokenizer and plain prompts (byte_prompt_format()). Errors name model.checkpoint.
absl::StatusOr<rl::PromptFormat> job_prompt_format(const rl::JobConfig& config);

class RlLoop {
 public:
  RlLoop(Cluster* cluster, RlLoopHooks hooks, RlLoopOptions options = {});

  // Runs (or resumes, when job.resume) the job to the end. OK: every step done. Cancelled: the
  // user cancelled. Other errors: the reason the job failed (is_trainer_lost() tells whether a
  // retry could resume it). Does not set the final job state. A resumed job restarts from its
  // last checkpoint, or from the beginning when it has none (sampling seeds depend on the step
  // only, so the rows it records again are the same steps).
  absl::Status run(const JobRecord& job, const rl::JobConfig& config);

  // Generates every sample over the live workers; results keyed by sample_id (each once).
  absl::StatusOr<std::map<std::string, GenResult>> dispatch(const std::string& request_prefix,
                                                            const std::vector<GenSample>& samples,
                                                            const GenParams& params);
  // The stats of the last dispatch that ended.
  DispatchStats dispatch_stats() const {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return dispatch_stats_;
  }
  // SFT steps done plus metrics rows (row 0 or RL steps) recorded by run(): > 0 means the job
  // made progress.
  int64_t progress() const { return progress_; }

 private:
  // What one run() works with, from the start of the job to its last step.
  struct JobRun {
    JobRun(const JobRecord& job, const rl::JobConfig& config, rl::Task task,
           rl::PromptFormat format)
        : job(job), config(config), task(std::move(task)), format(std::move(format)) {}
    const JobRecord& job;
    const rl::JobConfig& config;
    rl::Task task;
    rl::PromptFormat format;  // job_prompt_format(config)
    std::shared_ptr<TrainerClient> trainer;
    int64_t start_step = 0;          // steps done before this run (the checkpoint's step)
    int64_t version = 0;             // the last published policy version
    rl::StartMetrics start_metrics;  // row 0, filled while starting
    bool calibrate_kv_scales() const { return config.precision.kv_cache == rl::Precision::kFP8; }
  };
  using Rollout = StepRollout;

  // The phases of run(), numbered as in docs/design/rl-step.md "The RL step".
  // Logs the job's prompt format and the first training prompt's ids (what the model is fed).
  absl::Status log_prompt_format(const JobRun& run);
  // Step 0: waits (up to worker_wait) for a registered trainer.
  absl::Status connect_trainer(JobRun& run);
  // A resumed job got its trainer group of `size` again: log line, metric, group_reformed event.
  void note_group_reformed(const JobRun& run, int size, double waited_seconds);
  // Step 0: loads the job's last checkpoint; the steps after it run (and record rows) again. A
  // checkpoint the trainer cannot read (not a lost trainer) falls back to the one before it,
  // saying so in a log line, fp8rl_coordinator_checkpoint_fallbacks_total and a job event;
  // false when none is readable (the job starts over from the beginning).
  absl::StatusOr<bool> resume_from_checkpoint(JobRun& run);
  // Step 0: initializes the policy from the config (a resumed job without a checkpoint restarts).
  absl::Status init_policy(JobRun& run);
  // Step 0: the SFT warm start, when the config has one (rl/sft_batch.h).
  absl::Status sft_warm_start(JobRun& run);
  // Step 0: publishes the starting weights and waits until every live worker holds them.
  absl::Status publish_first_version(JobRun& run);
  // Step 0: validates the starting policy and records metrics row 0.
  absl::Status validate_start(JobRun& run);
  // Steps 1-2: P prompts x G samples generated over the live workers.
  absl::StatusOr<Rollout> rollout(const JobRun& run, int64_t step, rl::StepMetrics& row);
  // The samples of `step` generated by workers holding at least `min_version`; no phase change,
  // no member written but the dispatch stats, so the async producer thread calls it too.
  absl::StatusOr<Rollout> generate_rollout(const JobRun& run, int64_t step, int64_t min_version);
  // The sampling parameters of a rollout for workers holding at least min_version.
  static GenParams rollout_params(const JobRun& run, int64_t min_version);
  // Step 3: rewards and group advantages (rl/scoring.h); returns the trainer's batch.
  absl::StatusOr<std::vector<TrainSequence>> score(const JobRun& run, Rollout rollout,
                                                   rl::StepMetrics& row);
  // Steps 4-5: the GRPO update on the trainer.
  absl::Status train(const JobRun& run, int64_t step, const std::vector<TrainSequence>& batch,
                     rl::StepMetrics& row);
  // Steps 6-7: publishes version v+1 and waits until every live worker holds it.
  absl::Status publish_and_sync(JobRun& run, int64_t step, rl::StepMetrics& row);
  // Step 8: validation every validation.every_steps (and at the last step), a checkpoint every
  // checkpoint.every_steps.
  absl::Status validate_and_checkpoint(const JobRun& run, int64_t step, rl::StepMetrics& row);
  // After step 8: stores the step's metrics row, advances the job's step, updates the gauges.
  absl::Status record_step(const JobRun& run, int64_t step, const rl::StepMetrics& row);

  // Asynchronous RL (max_staleness >= 1, docs/design/rl-step.md "Asynchronous RL"): steps 1-8 with
  // the rollouts produced ahead by a RolloutQueue; stops the producer before returning.
  absl::Status run_async(JobRun& run);
  absl::Status run_async_steps(JobRun& run, RolloutQueue& queue);
  // On the producer thread: waits until the live workers hold min_version, then generates.
  absl::StatusOr<Rollout> produce_rollout(const JobRun& run, int64_t step, int64_t min_version);
  // The staleness rule (rl/staleness.h) on a taken rollout, trained at run.version: samples more
  // than K versions behind are generated again at run.version; fills row.async.
  absl::Status enforce_staleness(const JobRun& run, Rollout& rollout, rl::StepMetrics& row);

  // Publishes the trainer's current weights as a new version (run.version), numbered above every
  // version a live generation worker holds: after weight sync and the trainer both restarted,
  // a lower number would let workers with older weights pass the min_weight_version check.
  absl::StatusOr<int64_t> publish(JobRun& run);
  // The highest weight version any live generation worker reports (0 when none answers).
  int64_t highest_held_version();
  // Greedy accuracy on the validation split (its first validation.num_prompts prompts) of the
  // version run.version, after step `step` (0: before training).
  absl::StatusOr<double> validate(const JobRun& run, int64_t step);
  void set_phase(std::string phase, int64_t done = 0, int64_t total = 0, std::string detail = "");
  // `status` of a trainer call, its message prefixed with `what`; tagged kTrainerLostPayload when
  // the code says the trainer is gone (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED).
  static absl::Status trainer_error(const absl::Status& status, const std::string& what);
  absl::Status check_cancelled() const;
  // A job-store write retried while the store refuses it (retry_store_write, stopped by
  // cancellation); `label` and `what` as there.
  absl::Status store_write(std::string_view label, std::string_view what,
                           const std::function<absl::Status()>& write) const;
  absl::Status wait_for_version(int64_t version);
  // dispatch() that also returns this dispatch's own stats (safe when dispatches overlap).
  absl::StatusOr<std::map<std::string, GenResult>> dispatch_counted(
      const std::string& request_prefix, const std::vector<GenSample>& samples,
      const GenParams& params, DispatchStats* stats);
  // Whether step `step` validates (validation.every_steps, and the last step).
  static bool validates_at(const rl::JobConfig& config, int64_t step);

  // An RlLoop runs on one thread (the JobManager's runner); dispatch() shares only its own
  // DispatchState (rl_loop.cc) with the generation calls it starts. In asynchronous RL a
  // RolloutQueue's producer thread also runs generate_rollout() (dispatch, wait_for_version,
  // check_cancelled): it reads cluster_, hooks_ and options_ only, which are thread-safe or
  // constant, and the members below that say what guards them.
  Cluster* cluster_;
  RlLoopHooks hooks_;
  RlLoopOptions options_;
  mutable std::mutex stats_mu_;
  DispatchStats dispatch_stats_;  // guarded by stats_mu_
  int64_t progress_ = 0;
  // Set while run_async stops its producer: check_cancelled() fails, so a dispatch or version
  // wait on the producer thread returns.
  std::atomic<bool> stop_generation_{false};
};

}  // namespace fp8rl::coordinator
