// The coordinator's job service core, shared by the REST and gRPC front ends: validates and
// stores submitted jobs, answers queries, records cancellations, and runs one job at a time on a
// background thread through RlLoop (resuming jobs a restart left RUNNING, and jobs whose trainer
// was lost once a trainer is back within RlLoopOptions::trainer_resume_wait). It also keeps each
// running job's current phase (JobRecord::progress) in memory.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "rl/job_config.h"
#include "rl/job_paths.h"
#include "services/coordinator/admission.h"
#include "services/coordinator/job_store.h"
#include "services/coordinator/rl_loop.h"
#include "services/coordinator/worker_registry.h"

namespace fp8rl::coordinator {

class JobManager {
 public:
  // `registry` and `metrics` may be null (tests); `cluster` may be null when start() is never
  // called.
  JobManager(JobStore* store, Cluster* cluster, WorkerRegistry* registry,
             CoordinatorMetrics* metrics, RlLoopOptions options = {});
  ~JobManager();

  // Starts the runner thread.
  void start();
  // Stops the runner: a running job is interrupted at its next phase boundary and stays RUNNING
  // (it resumes after the next start). Waits at most `grace`.
  void stop();

  // Confines the paths of every job submitted from now on to these roots (rl/job_paths.h). The
  // coordinator binary always sets them (its --data-root, --models-root, --datasets-root); without
  // them (unit tests) paths are stored as given. Call before start() and the front ends.
  void set_path_roots(rl::JobPathRoots roots) { path_roots_ = std::move(roots); }

  // The job API's limits (admission.h); AdmissionLimits' defaults until set. Call before start()
  // and the front ends.
  void set_admission_limits(const AdmissionLimits& limits) {
    admission_ = std::make_unique<AdmissionControl>(limits, metrics_);
  }
  // The front ends take a slot here for every job API call (AdmissionControl::enter).
  AdmissionControl& admission() const { return *admission_; }

  // Job config as YAML or JSON text; InvalidArgument naming the field on bad input: a value out
  // of range, a path outside its root, an inline model config that is not a valid config.json,
  // rollouts over the per-job token cap. ResourceExhausted with a retry hint when
  // AdmissionLimits::max_queued_jobs jobs are already queued. The stored config carries the
  // resolved paths.
  absl::StatusOr<JobRecord> submit_text(std::string_view config_text);
  absl::StatusOr<JobRecord> submit(const rl::JobConfig& config);

  // Records come with their in-memory progress (empty phase when not running).
  absl::StatusOr<JobRecord> get(const std::string& id) const;
  absl::StatusOr<std::vector<JobRecord>> list(std::optional<JobState> state, int64_t limit) const;
  // QUEUED -> CANCELLED now; RUNNING -> flagged, CANCELLED at the next phase boundary.
  absl::StatusOr<JobRecord> cancel(const std::string& id);
  absl::StatusOr<std::vector<MetricsRow>> metrics(const std::string& id) const;
  absl::StatusOr<std::optional<MetricsRow>> latest_metrics(const std::string& id) const;
  // The faults handled for the job (JobStore::get_events); NotFound for an unknown job.
  absl::StatusOr<std::vector<JobEvent>> events(const std::string& id) const;
  // NotFound for an unknown job (see JobStore::metrics_fingerprint).
  absl::StatusOr<JobStore::MetricsFingerprint> metrics_fingerprint(const std::string& id) const;

  // Updates the jobs-by-state and live-worker gauges.
  void refresh_gauges();
  // The metrics the front ends update (rejected requests); null in tests without metrics.
  CoordinatorMetrics* coordinator_metrics() const { return metrics_; }

 private:
  void run_loop();
  void run_job(const JobRecord& job);
  // Runs the job through RlLoop, again (resuming) after each trainer loss while a trainer comes
  // back in time. Returns the final status of the last run.
  absl::Status run_with_resumes(const JobRecord& job, const rl::JobConfig& config);
  void set_progress(const std::string& id, JobProgress progress);
  // Stores a job event (a failure to store it is logged, not returned).
  void add_event(const std::string& id, std::string_view kind, std::string_view message);
  void clear_progress(const std::string& id);
  // Adds what only memory holds: the running job's progress, and an end the store refused.
  void fill_in_memory(JobRecord* job) const;
  // Stores the job's final state, retried while the store refuses it (store_retry.h); when it
  // still refuses, the end is kept in unrecorded_ends_ (and reported from there).
  void record_end(const std::string& id, JobState state, const std::string& error);
  // Tries to store the ends kept in unrecorded_ends_; true when none is left.
  bool flush_unrecorded_ends();
  // Waits up to `wait` for stop() or a wake-up (a submission, a cancel).
  void pause(std::chrono::milliseconds wait);
  bool cancel_requested(const std::string& id) const;

  JobStore* store_;
  Cluster* cluster_;
  WorkerRegistry* registry_;
  CoordinatorMetrics* metrics_;
  RlLoopOptions options_;
  std::optional<rl::JobPathRoots> path_roots_;   // set before serving, then read-only
  std::unique_ptr<AdmissionControl> admission_;  // set before serving, then read-only
  // Held from counting the queued jobs to storing a new one, so concurrent submissions cannot
  // together pass AdmissionLimits::max_queued_jobs.
  std::mutex submit_mu_;
  // The store, cluster, registry and metrics are thread-safe on their own; mu_ guards only the
  // in-memory state below that the API threads and the runner thread share.
  mutable std::mutex mu_;
  // Wakes the runner thread (waiting under mu_) when a job is submitted, a cancel is requested
  // (ends a wait for a lost trainer) or stop() is called; the runner also wakes every 500 ms.
  std::condition_variable cv_;
  std::set<std::string> cancel_requests_;        // guarded by mu_
  std::map<std::string, JobProgress> progress_;  // guarded by mu_; running jobs only
  // Jobs that ended while the store refused every write of their final state (a read-only or
  // full disk): reported from here, stored when the store takes writes again. The store still
  // says RUNNING; a coordinator restarted before that resumes them. No new job starts while
  // one is here.
  struct UnrecordedEnd {
    JobState state;
    std::string error;
  };
  std::map<std::string, UnrecordedEnd> unrecorded_ends_;  // guarded by mu_
  std::atomic<bool> stopping_{false};                     // atomic: read by the loop without mu_
  std::thread runner_;  // started and joined by start()/stop() only
};

}  // namespace fp8rl::coordinator
