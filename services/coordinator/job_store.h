// The coordinator's durable job store (SQLite): jobs and their per-step metrics survive a
// coordinator restart. Opening a store whose jobs were RUNNING marks them for resumption, so the
// RL loop picks them up again from their last checkpoint.
//
// Schema:
//   jobs(id TEXT PK, state TEXT, config_json TEXT, step INT, total_steps INT, error TEXT,
//        resume INT, checkpoint TEXT, checkpoint_step INT, created_ms INT, updated_ms INT)
//   metrics(job_id TEXT, step INT, metrics_json TEXT, recorded_ms INT, PK(job_id, step))
//   events(job_id TEXT, seq INT PK autoincrement, kind TEXT, message TEXT, recorded_ms INT)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct sqlite3;

namespace fp8rl::coordinator {

enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled };

// "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED".
std::string_view job_state_name(JobState state);
absl::StatusOr<JobState> parse_job_state(std::string_view name);
inline bool is_terminal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled;
}

// What a running job is doing right now. Kept in memory by the JobManager (not in the database):
// a restarted coordinator reports the phase of the resumed run.
struct JobProgress {
  // "waiting_for_trainer", "initializing", "loading_checkpoint", "sft", "syncing_weights",
  // "validating", "rl" or "trainer_lost"; empty when the job is not running.
  std::string phase;
  int64_t done = 0;    // units done in the phase: SFT steps in "sft", RL steps in "rl"
  int64_t total = 0;   // units in the phase (0 when it has none)
  std::string detail;  // e.g. "loss 0.5123" in "sft", the step's sub-phase in "rl"
  int64_t updated_ms = 0;
  bool operator==(const JobProgress&) const = default;
};

struct JobRecord {
  std::string id;
  JobState state = JobState::kQueued;
  std::string config_json;
  int64_t step = 0;
  int64_t total_steps = 0;
  std::string error;
  bool resume = false;          // was RUNNING when the coordinator restarted
  std::string checkpoint;       // latest checkpoint folder ("" when none)
  int64_t checkpoint_step = 0;  // step the checkpoint was taken after
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  JobProgress progress;  // filled by JobManager::get/list, never stored
};

struct MetricsRow {
  int64_t step = 0;
  std::map<std::string, double> values;
  int64_t recorded_ms = 0;
};

// Something the coordinator did about a fault while running the job (JobStore::add_event).
struct JobEvent {
  std::string kind;  // "checkpoint_fallback"
  std::string message;
  int64_t recorded_ms = 0;
};

class JobStore {
 public:
  // Opens (creating when missing) the database at `path` (":memory:" for tests). Jobs found in
  // RUNNING get resume = true.
  static absl::StatusOr<std::unique_ptr<JobStore>> open(const std::string& path);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Stores a new QUEUED job with a fresh id.
  absl::StatusOr<JobRecord> create_job(const std::string& config_json, int64_t total_steps);
  // NotFound "job '<id>' not found".
  absl::StatusOr<JobRecord> get_job(const std::string& id) const;
  // Newest first; `state` filters when set; limit 0 = all.
  absl::StatusOr<std::vector<JobRecord>> list_jobs(std::optional<JobState> state,
                                                   int64_t limit) const;
  // The oldest job the loop should run next: a resumable RUNNING job first, else the oldest
  // QUEUED one. nullopt when none.
  absl::StatusOr<std::optional<JobRecord>> next_runnable() const;

  // Sets the state (and error text); clears `resume` when the state is not RUNNING.
  absl::Status set_state(const std::string& id, JobState state, const std::string& error = "");
  // Atomically QUEUED -> CANCELLED; returns the resulting record. FailedPrecondition when the job
  // already ended; a RUNNING job is returned unchanged (the loop cancels it between phases).
  absl::StatusOr<JobRecord> cancel_if_queued(const std::string& id);
  absl::Status set_step(const std::string& id, int64_t step);
  absl::Status set_checkpoint(const std::string& id, const std::string& path, int64_t step);
  absl::Status clear_resume(const std::string& id);

  // Inserts or replaces the row for (id, step).
  absl::Status put_metrics(const std::string& id, int64_t step,
                           const std::map<std::string, double>& values);
  // Deletes the rows after `step` (every row with step < 0): a job resumed from the checkpoint of
  // `step` records them again.
  absl::Status delete_metrics_after(const std::string& id, int64_t step);
  // Rows in step order.
  absl::StatusOr<std::vector<MetricsRow>> get_metrics(const std::string& id) const;
  // What changes whenever the job's metrics rows do: their number, the highest step and the
  // latest recorded time (a replaced row is recorded anew). One indexed query, no row decoded:
  // the cheap validator of the REST metrics history (ETag).
  struct MetricsFingerprint {
    int64_t rows = 0;
    int64_t max_step = -1;
    int64_t max_recorded_ms = 0;
  };
  absl::StatusOr<MetricsFingerprint> metrics_fingerprint(const std::string& id) const;
  // The row with the highest step (nullopt when none).
  absl::StatusOr<std::optional<MetricsRow>> latest_metrics(const std::string& id) const;

  // Faults the coordinator handled for a job (a checkpoint fallback, ...), kept with the job.
  absl::Status add_event(const std::string& id, std::string_view kind, std::string_view message);
  // The job's events in the order they were added.
  absl::StatusOr<std::vector<JobEvent>> get_events(const std::string& id) const;

  // Number of jobs per state (every state present, 0 when none).
  absl::StatusOr<std::map<JobState, int64_t>> count_by_state() const;

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  // Runs `sql`; called by open() only, before the store is shared, so without mu_.
  absl::Status exec(const std::string& sql);

  // Every public method holds mu_ for its whole statement sequence: one connection, shared by
  // the API threads and the job runner.
  mutable std::mutex mu_;
  sqlite3* db_;  // guarded by mu_ (the pointer itself is set once, in open())
};

int64_t now_unix_ms();

}  // namespace fp8rl::coordinator
