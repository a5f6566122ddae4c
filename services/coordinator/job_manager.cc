// Job submission, queries and the runner thread (see job_manager.h).
#include "services/coordinator/job_manager.h"

#include "absl/strings/str_cat.h"
#include "common/service/log.h"
#include "services/coordinator/coordinator_metrics.h"

namespace fp8rl::coordinator {

namespace {
constexpr char kLog[] = "jobs";
}

JobManager::JobManager(JobStore* store, Cluster* cluster, WorkerRegistry* registry,
                       CoordinatorMetrics* metrics, RlLoopOptions options)
    : store_(store), cluster_(cluster), registry_(registry), metrics_(metrics), options_(options) {}

JobManager::~JobManager() { stop(); }

void JobManager::start() {
  if (runner_.joinable()) return;
  stopping_ = false;
  runner_ = std::thread([this] { run_loop(); });
}

void JobManager::stop() {
  stopping_ = true;
  cv_.notify_all();
  if (runner_.joinable()) runner_.join();
}

absl::StatusOr<JobRecord> JobManager::submit_text(std::string_view config_text) {
  absl::StatusOr<rl::JobConfig> config = rl::parse_job_config(config_text);
  if (!config.ok()) return config.status();
  return submit(*config);
}

absl::StatusOr<JobRecord> JobManager::submit(const rl::JobConfig& config) {
  if (absl::Status s = rl::validate_job_config(config); !s.ok()) return s;
  absl::StatusOr<JobRecord> job =
      store_->create_job(rl::job_config_to_json(config).dump(), config.algorithm.steps);
  if (!job.ok()) return job.status();
  service::log_info(kLog, "job submitted", {{"job", job->id}});
  if (metrics_ != nullptr) metrics_->jobs_submitted->get().inc();
  refresh_gauges();
  cv_.notify_all();
  return job;
}

absl::StatusOr<JobRecord> JobManager::get(const std::string& id) const {
  return store_->get_job(id);
}

absl::StatusOr<std::vector<JobRecord>> JobManager::list(std::optional<JobState> state,
                                                        int64_t limit) const {
  return store_->list_jobs(state, limit);
}

absl::StatusOr<JobRecord> JobManager::cancel(const std::string& id) {
  absl::StatusOr<JobRecord> job = store_->cancel_if_queued(id);
  if (!job.ok()) return job.status();
  if (job->state == JobState::kRunning) {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_requests_.insert(id);
  }
  service::log_info(kLog, "cancel requested", {{"job", id}});
  refresh_gauges();
  return job;
}

absl::StatusOr<std::vector<MetricsRow>> JobManager::metrics(const std::string& id) const {
  if (absl::StatusOr<JobRecord> job = store_->get_job(id); !job.ok()) return job.status();
  return store_->get_metrics(id);
}

absl::StatusOr<std::optional<MetricsRow>> JobManager::latest_metrics(const std::string& id) const {
  return store_->latest_metrics(id);
}

void JobManager::refresh_gauges() {
  if (metrics_ == nullptr) return;
  if (auto counts = store_->count_by_state(); counts.ok()) {
    for (const auto& [state, count] : *counts) {
      std::string name(job_state_name(state));
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      metrics_->jobs->with({name}).set(static_cast<double>(count));
    }
  }
  if (registry_ != nullptr) {
    for (WorkerKind kind :
         {WorkerKind::kGeneration, WorkerKind::kTrainer, WorkerKind::kWeightSync}) {
      metrics_->live_workers->with({std::string(worker_kind_name(kind))})
          .set(static_cast<double>(registry_->live(kind).size()));
    }
  }
}

void JobManager::run_loop() {
  while (!stopping_) {
    absl::StatusOr<std::optional<JobRecord>> next = store_->next_runnable();
    if (!next.ok()) {
      service::log_error(kLog, "job store read failed",
                         {{"error", std::string(next.status().message())}});
    } else if (next->has_value()) {
      run_job(**next);
      continue;
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(500));
    lock.unlock();
    refresh_gauges();
  }
}

void JobManager::run_job(const JobRecord& job) {
  const std::string& id = job.id;
  auto finish = [&](JobState state, const std::string& error) {
    if (absl::Status s = store_->set_state(id, state, error); !s.ok()) {
      service::log_error(kLog, "cannot record job state",
                         {{"job", id}, {"error", std::string(s.message())}});
    }
    std::lock_guard<std::mutex> lock(mu_);
    cancel_requests_.erase(id);
  };
  if (absl::Status s = store_->set_state(id, JobState::kRunning); !s.ok()) {
    service::log_error(kLog, "cannot start job",
                       {{"job", id}, {"error", std::string(s.message())}});
    return;
  }
  refresh_gauges();
  absl::StatusOr<rl::JobConfig> config = rl::parse_job_config(job.config_json);
  if (!config.ok()) {
    finish(JobState::kFailed, absl::StrCat("stored config: ", config.status().message()));
    return;
  }
  service::log_info(kLog, "job started", {{"job", id}, {"resume", job.resume ? "true" : "false"}});
  RlLoopHooks hooks;
  hooks.store = store_;
  hooks.metrics = metrics_;
  hooks.cancelled = [this, id] {
    if (stopping_) return true;
    std::lock_guard<std::mutex> lock(mu_);
    return cancel_requests_.contains(id);
  };
  hooks.on_progress = [this] { refresh_gauges(); };
  RlLoop loop(cluster_, hooks, options_);
  const absl::Status status = loop.run(job, *config);
  bool user_cancelled = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    user_cancelled = cancel_requests_.contains(id);
  }
  if (status.ok()) {
    finish(JobState::kSucceeded, "");
  } else if (status.code() == absl::StatusCode::kCancelled && user_cancelled) {
    finish(JobState::kCancelled, "cancelled by user");
  } else if (stopping_) {
    // Coordinator shutdown: leave the job RUNNING so the next start resumes it.
    service::log_info(kLog, "job interrupted by shutdown", {{"job", id}});
    return;
  } else {
    finish(JobState::kFailed, std::string(status.message()));
  }
  service::log_info(kLog, "job ended", {{"job", id}, {"status", status.ToString()}});
  refresh_gauges();
}

}  // namespace fp8rl::coordinator
