// The continuous-batching scheduler of a generation worker. One thread owns the generator
// (model::BackendGenerator over the CPU or CUDA inference backend): every step it admits queued
// samples of any number of concurrent Generate calls (within a row budget and a KV-cache block
// budget, kv_block_budget.h), runs one batched forward, and hands finished samples back to their
// requests. Weight versions are swapped in only between batches, so a sample admitted at version v
// finishes at v, and every queued sample after the swap runs at the newest version. A cancelled
// request (client gone, deadline passed) leaves the queue at once and the batch at the next step,
// so its KV-cache blocks go to the samples waiting behind it.
//
// Concurrency: four mutexes, acquired only in this order (never the reverse):
//   Scheduler::install_mu_ -> Scheduler::mu_ -> GenerationRequest::mu_;
// Scheduler::join_mu_ is taken alone. The scheduler thread holds Scheduler::mu_ except during a
// batched forward. Three condition variables: GenerationRequest::cv_ (a result or the end of the
// request), Scheduler::cv_ (work or a state change for the scheduler thread) and
// Scheduler::swapped_cv_ (install() waiting for its version to be served). Members say what
// guards them; functions named ..._locked expect Scheduler::mu_ held.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fp8rl/v1/common.pb.h"
#include "model/device.h"
#include "model/sampler.h"
#include "model/step_generator.h"
#include "services/generation_worker/generation_metrics.h"
#include "services/generation_worker/kv_block_budget.h"
#include "services/generation_worker/weight_loader.h"

namespace fp8rl::generation {

struct SchedulerOptions {
  // Rows of one forward step (prefill tokens + one per decoding sequence); a prompt longer than
  // this still runs, alone.
  int64_t max_batch_tokens = 2048;
  // KV-cache budget in blocks of kv_block_size tokens (paged KV): a running sequence holds
  // ceil((prompt + max_new_tokens) / kv_block_size) blocks; a sample waits while that many are
  // not free, and one that needs more than the whole budget is refused at submit. The budget is
  // kv_cache_blocks, or when that is 0, floor(kv_cache_tokens / kv_block_size).
  int64_t kv_cache_tokens = 262144;
  int64_t kv_block_size = 16;
  int64_t kv_cache_blocks = 0;
  // Where the model runs (worker_config.cc apply_device) and, on cuda, the bytes the CUDA
  // inference backend may take for weights, activations and KV blocks (--gpu-memory-fraction of
  // the device's memory). On cuda the KV block budget is the backend's pool
  // (memory().kv_blocks_total), not kv_cache_tokens. On cpu the CPU backend's pool is given
  // exactly the budget above; its host memory grows with the blocks held (never past the budget).
  model::Device device = model::Device::kCpu;
  int64_t gpu_memory_budget_bytes = 0;
  // cuda: device copies of the weights (--gpu-weight-slots, 1 or 2). With 2 a new version is
  // copied to the device while the running batch drains (InferenceBackend::prepare_model), and
  // the swap is a switch; with 1 the copy happens at the swap, with the batch stopped.
  int64_t gpu_weight_slots = 2;
  // Samples waiting to be admitted, over all requests; more are refused (RESOURCE_EXHAUSTED).
  int64_t max_queued_samples = 65536;
  // When the batch is empty, the first queued sample waits this long for company before the
  // first step, so requests arriving together start together.
  std::chrono::milliseconds batch_wait{2};
};

// Checks ranges; InvalidArgument naming the field.
absl::Status validate_scheduler_options(const SchedulerOptions& options);

// The KV block budget the options give (kv_cache_blocks, else kv_cache_tokens / kv_block_size).
int64_t kv_budget_blocks(const SchedulerOptions& options);

// One sample of a request. `params.seed` is the sample's seed; the sampling stream is
// derive_seed(seed, 0), so a sample's tokens are those of model::generate(model, {prompt},
// params) whatever else shares its batch.
struct SampleSpec {
  std::string sample_id;
  std::vector<int32_t> prompt;
  model::SamplingParams params;
};

struct SampleOutcome {
  std::string sample_id;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> routing;  // mixture of experts: model::GenerationResult::routing
  int64_t weight_version = 0;
  model::FinishReason reason = model::FinishReason::kLength;
};

// The handle of one submitted request, shared by the caller and the scheduler thread.
class GenerationRequest {
 public:
  explicit GenerationRequest(size_t samples) : remaining_(samples) {}

  // Waits until a result is ready, the request ends or `timeout` passes; moves out the ready
  // results (possibly none).
  std::vector<SampleOutcome> take(std::chrono::milliseconds timeout);
  // Every result was taken, or the request failed or was cancelled.
  bool done() const;
  // OK, or why the request failed (its remaining samples are dropped); CANCELLED after
  // Scheduler::cancel() of an unfinished request.
  absl::Status status() const;
  // Scheduler::cancel() was called or the request failed: nothing more will be delivered.
  bool cancelled() const { return cancelled_.load(); }

 private:
  friend class Scheduler;
  // Ends an unfinished request with CANCELLED (a finished one keeps its status).
  void cancel();
  void deliver(SampleOutcome outcome);
  void fail(absl::Status error);

  // Guards ready_, remaining_ and error_. Taken after Scheduler::mu_ when both are held (the
  // scheduler thread delivers under its own lock).
  mutable std::mutex mu_;
  // Waits for: a ready result, the last result taken (remaining_ == 0), or an error (failure or
  // cancel). Notified by deliver(), fail() and cancel(); waited on by take().
  std::condition_variable cv_;
  std::vector<SampleOutcome> ready_;    // guarded by mu_
  size_t remaining_;                    // guarded by mu_; results not yet delivered
  absl::Status error_;                  // guarded by mu_
  std::atomic<bool> cancelled_{false};  // lock-free: read by the scheduler without mu_
};

class Scheduler {
 public:
  // Starts the scheduler thread. `metrics` may be null (not owned; must outlive the scheduler).
  Scheduler(SchedulerOptions options, GenerationMetrics* metrics);
  ~Scheduler();  // shutdown(0)
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues the samples (already validated against model()). Errors: UNAVAILABLE "no weights yet"
  // or when shutting down; FAILED_PRECONDITION when min_weight_version is newer than the held
  // version; RESOURCE_EXHAUSTED when the queue is full; INVALID_ARGUMENT naming the sample when
  // one needs more KV blocks than the whole budget (it could never be admitted).
  absl::StatusOr<std::shared_ptr<GenerationRequest>> submit(std::vector<SampleSpec> samples,
                                                            int64_t min_weight_version);

  // Serves `weights` from the next batch boundary on and returns once it is being served (after
  // the running batch drains; queued samples wait for it). FAILED_PRECONDITION when the version is
  // not newer than the held one; UNAVAILABLE when the scheduler shuts down first.
  absl::Status install(LoadedWeights weights);

  // The caller of `request` is gone (client cancelled, deadline passed, stream closed): its queued
  // samples leave the queue now and its running ones leave the batch before the next step,
  // releasing their KV cache and blocks to the samples queued behind; nothing more is delivered
  // and the samples of other requests are unaffected (bit for bit). Idempotent; no-op for a
  // request that already finished.
  void cancel(GenerationRequest& request);

  // Stops admitting requests, lets in-flight samples finish for up to `grace`, fails the rest with
  // UNAVAILABLE, and joins the thread. Idempotent.
  void shutdown(std::chrono::milliseconds grace);

  // The model being served (null before the first install).
  std::shared_ptr<const model::Model> model() const;

  struct Snapshot {
    int64_t weight_version = 0;
    v1::WeightFormat weight_format = v1::WEIGHT_FORMAT_UNSPECIFIED;
    int64_t queued_samples = 0;
    int64_t running_samples = 0;
    double kv_cache_usage = 0;  // reserved / budgeted KV blocks
    int64_t kv_blocks_used = 0;
    int64_t kv_blocks_total = 0;
    int64_t kv_cache_bytes = 0;
    uint64_t generated_tokens = 0;
    int64_t steps = 0;            // batched forward steps run
    int64_t peak_batch_size = 0;  // most sequences in one step since start
    int64_t swaps = 0;            // versions installed
    // Versions announced to the generator (StepGenerator::prepare_model) while a batch was
    // still running, before their swap.
    int64_t prepared_swaps = 0;
    // Samples taken out unfinished, from the queue or the batch, because their request was
    // cancelled (or another of its samples failed); generated_tokens includes what they had
    // generated. Samples failed by a shutdown or a failed step are not counted.
    int64_t cancelled_samples = 0;
    bool ready = false;  // weights loaded and accepting requests
  };
  Snapshot snapshot() const;

 private:
  struct Queued {
    std::shared_ptr<GenerationRequest> request;
    SampleSpec spec;
    std::chrono::steady_clock::time_point enqueued;
  };
  struct Running {
    std::shared_ptr<GenerationRequest> request;
    std::string sample_id;
    int64_t weight_version = 0;
    int64_t kv_blocks = 0;
  };

  // The scheduler thread's loop: holds mu_ except around each batched forward.
  void run();
  // Expect mu_ held.
  // Swaps in pending weights when the batch is empty; notifies swapped_cv_.
  void apply_pending_locked();
  // Takes the samples of cancelled or failed requests out of the queue and the generator
  // (between steps) and releases their KV blocks.
  void drop_cancelled_locked();
  // Moves queued samples into the generator while their KV blocks are free (in queue order: the
  // first that does not fit waits, and so does everything behind it).
  void admit_locked();
  // Fails every running sample with `error` and starts a fresh generator.
  void reset_generator_locked(const absl::Status& error);
  // A generator for current_.model on options_.device (the CUDA backend on cuda; the old
  // generator must be gone first, so two never hold device memory at once). On cuda it also sets
  // the KV block budget to the backend's pool.
  absl::StatusOr<std::unique_ptr<model::StepGenerator>> make_generator_locked();
  // Copies stats_ into the metric gauges.
  void publish_gauges_locked();

  const SchedulerOptions options_;
  GenerationMetrics* const metrics_;

  // Guards the members marked below.
  mutable std::mutex mu_;
  // Waits for (scheduler thread only): a submitted sample, a cancel, pending weights, shutdown,
  // or the batch_wait / drain deadline passing. Notified by submit(), install(), cancel() and
  // shutdown().
  std::condition_variable cv_;
  // Waits for (install() only): current_.version reaching the installed version, or the thread
  // ending (thread_done_). Notified by apply_pending_locked() and at the end of run().
  std::condition_variable swapped_cv_;
  // Serializes install() calls (one pending_ at a time); taken before mu_.
  std::mutex install_mu_;
  // Serializes shutdown()'s join of thread_ (a second caller waits for the first to finish).
  std::mutex join_mu_;
  bool stopping_ = false;                                 // guarded by mu_
  bool thread_done_ = false;                              // guarded by mu_
  std::chrono::steady_clock::time_point drain_deadline_;  // guarded by mu_
  std::optional<LoadedWeights> pending_;                  // guarded by mu_
  bool pending_prepared_ = false;  // pending_ was announced to the generator; guarded by mu_
  // Why the last pending version could not be served (no generator could be made for it);
  // install() returns it. Guarded by mu_.
  absl::Status install_error_;
  LoadedWeights current_;  // guarded by mu_
  // Owned by the scheduler thread: no other thread reads the pointer or calls the generator.
  // step() runs with mu_ released, everything else with mu_ held.
  std::unique_ptr<model::StepGenerator> generator_;
  std::deque<Queued> queue_;                      // guarded by mu_
  std::unordered_map<int64_t, Running> running_;  // guarded by mu_; by generator id
  KvBlockBudget kv_blocks_;                       // guarded by mu_
  Snapshot stats_;                                // guarded by mu_
  std::thread thread_;  // started in the constructor, joined under join_mu_
};

}  // namespace fp8rl::generation
