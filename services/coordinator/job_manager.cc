// Job submission, queries and the runner thread (see job_manager.h).
#include "services/coordinator/job_manager.h"

#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/service/log.h"
#include "model/config.h"
#include "rl/model_checkpoint.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/store_retry.h"

namespace fp8rl::coordinator {

namespace {
constexpr char kLog[] = "jobs";

// An inline model.init.config gets the checks a config.json file gets when the trainer loads it
// (model/config.h), at submission instead of when the job starts.
absl::Status validate_inline_model_config(const rl::ModelSpec& model) {
  if (model.init_config_inline.is_null()) return absl::OkStatus();
  absl::StatusOr<model::ModelConfig> parsed =
      model::parse_model_config(model.init_config_inline.dump());
  if (parsed.ok()) return absl::OkStatus();
  std::string message(parsed.status().message());
  if (message.starts_with("config.json: ")) message.erase(0, 13);
  return absl::InvalidArgumentError(absl::StrCat("model.init.config: ", message));
}

}  // namespace

JobManager::JobManager(JobStore* store, Cluster* cluster, WorkerRegistry* registry,
                       CoordinatorMetrics* metrics, RlLoopOptions options)
    : store_(store),
      cluster_(cluster),
      registry_(registry),
      metrics_(metrics),
      options_(options),
      admission_(std::make_unique<AdmissionControl>(AdmissionLimits{}, metrics)) {}

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
  std::vector<std::string> warnings;
  absl::StatusOr<rl::JobConfig> config = rl::parse_job_config(config_text, &warnings);
  if (!config.ok()) return config.status();
  for (const std::string& w : warnings) service::log_warn(kLog, w);
  return submit(*config);
}

absl::StatusOr<JobRecord> JobManager::submit(const rl::JobConfig& submitted) {
  if (absl::Status s = rl::validate_job_config(submitted); !s.ok()) return s;
  rl::JobConfig config = submitted;
  if (path_roots_.has_value()) {
    if (absl::Status s = rl::resolve_job_paths(config, *path_roots_); !s.ok()) return s;
  }
  if (absl::Status s = validate_inline_model_config(config.model); !s.ok()) return s;
  if (!config.model.checkpoint.empty()) {
    // The folder is read here, where it is cheap to refuse (small files only).
    absl::StatusOr<rl::ModelCheckpointInfo> ckpt =
        rl::check_model_checkpoint(config.model.checkpoint);
    if (!ckpt.ok()) return ckpt.status();
  }
  if (absl::Status s = admission_->check_tokens(config); !s.ok()) return s;
  const std::string config_json = rl::job_config_to_json(config).dump();
  absl::StatusOr<JobRecord> job;
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    absl::StatusOr<std::map<JobState, int64_t>> counts = store_->count_by_state();
    if (!counts.ok()) return counts.status();
    const auto queued = counts->find(JobState::kQueued);
    if (absl::Status s = admission_->check_queue(queued == counts->end() ? 0 : queued->second);
        !s.ok()) {
      return s;
    }
    job = store_->create_job(config_json, config.algorithm.steps);
  }
  if (!job.ok()) return job.status();
  service::log_info(kLog, "job submitted", {{"job", job->id}});
  if (metrics_ != nullptr) metrics_->jobs_submitted->get().inc();
  refresh_gauges();
  cv_.notify_all();
  return job;
}

absl::StatusOr<JobRecord> JobManager::get(const std::string& id) const {
  absl::StatusOr<JobRecord> job = store_->get_job(id);
  if (job.ok()) fill_in_memory(&*job);
  return job;
}

absl::StatusOr<std::vector<JobRecord>> JobManager::list(std::optional<JobState> state,
                                                        int64_t limit) const {
  absl::StatusOr<std::vector<JobRecord>> jobs = store_->list_jobs(state, limit);
  if (!jobs.ok()) return jobs;
  for (JobRecord& job : *jobs) fill_in_memory(&job);
  if (state.has_value()) {  // an end kept in memory moved the job out of the filter's state
    std::erase_if(*jobs, [&](const JobRecord& job) { return job.state != *state; });
  }
  return jobs;
}

absl::StatusOr<std::vector<JobEvent>> JobManager::events(const std::string& id) const {
  if (absl::StatusOr<JobRecord> job = store_->get_job(id); !job.ok()) return job.status();
  return store_->get_events(id);
}

void JobManager::add_event(const std::string& id, std::string_view kind, std::string_view message) {
  if (absl::Status s = store_->add_event(id, kind, message); !s.ok()) {
    service::log_error(
        kLog, "cannot record job event",
        {{"job", id}, {"kind", std::string(kind)}, {"error", std::string(s.message())}});
  }
}

void JobManager::set_progress(const std::string& id, JobProgress progress) {
  progress.updated_ms = now_unix_ms();
  std::lock_guard<std::mutex> lock(mu_);
  progress_[id] = std::move(progress);
}

void JobManager::clear_progress(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_.erase(id);
}

void JobManager::fill_in_memory(JobRecord* job) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (job->state != JobState::kRunning) return;
  if (auto it = unrecorded_ends_.find(job->id); it != unrecorded_ends_.end()) {
    job->state = it->second.state;
    job->error = it->second.error;
    return;
  }
  if (auto it = progress_.find(job->id); it != progress_.end()) job->progress = it->second;
}

void JobManager::record_end(const std::string& id, JobState state, const std::string& error) {
  StoreRetry retry;
  retry.wait = options_.store_retry_wait;
  retry.metrics = metrics_;
  retry.stop = [this] { return stopping_.load(); };
  const absl::Status s = retry_store_write(
      "state", absl::StrCat("the end of job '", id, "' (", std::string(job_state_name(state)), ")"),
      retry, [&] { return store_->set_state(id, state, error); });
  if (s.ok()) return;
  service::log_error(kLog,
                     "cannot record job state; reporting it from memory until the store "
                     "takes it",
                     {{"job", id},
                      {"state", std::string(job_state_name(state))},
                      {"job_error", error},
                      {"error", std::string(s.message())}});
  std::lock_guard<std::mutex> lock(mu_);
  unrecorded_ends_[id] = UnrecordedEnd{state, error};
}

bool JobManager::flush_unrecorded_ends() {
  std::map<std::string, UnrecordedEnd> ends;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (unrecorded_ends_.empty()) return true;
    ends = unrecorded_ends_;
  }
  bool all = true;
  for (const auto& [id, end] : ends) {
    if (absl::Status s = store_->set_state(id, end.state, end.error); !s.ok()) {
      all = false;
      continue;
    }
    service::log_info(kLog, "job state recorded after the store refused it",
                      {{"job", id}, {"state", std::string(job_state_name(end.state))}});
    std::lock_guard<std::mutex> lock(mu_);
    unrecorded_ends_.erase(id);
  }
  return all;
}

void JobManager::pause(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, wait, [&] { return stopping_.load(); });
}

bool JobManager::cancel_requested(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancel_requests_.contains(id);
}

absl::StatusOr<JobRecord> JobManager::cancel(const std::string& id) {
  absl::StatusOr<JobRecord> job = store_->cancel_if_queued(id);
  if (!job.ok()) return job.status();
  if (job->state == JobState::kRunning) {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_requests_.insert(id);
  }
  cv_.notify_all();  // ends a wait for a lost trainer
  service::log_info(kLog, "cancel requested", {{"job", id}});
  refresh_gauges();
  return job;
}

absl::StatusOr<std::vector<MetricsRow>> JobManager::metrics(const std::string& id) const {
  if (absl::StatusOr<JobRecord> job = store_->get_job(id); !job.ok()) return job.status();
  return store_->get_metrics(id);
}

absl::StatusOr<JobStore::MetricsFingerprint> JobManager::metrics_fingerprint(
    const std::string& id) const {
  if (absl::StatusOr<JobRecord> job = store_->get_job(id); !job.ok()) return job.status();
  return store_->metrics_fingerprint(id);
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
    if (!flush_unrecorded_ends()) {
      // The store still refuses a job's end: start nothing until it takes writes again.
      pause(std::chrono::seconds(1));
      continue;
    }
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
    record_end(id, state, error);
    std::lock_guard<std::mutex> lock(mu_);
    cancel_requests_.erase(id);
    progress_.erase(id);
  };
  if (absl::Status s = store_->set_state(id, JobState::kRunning); !s.ok()) {
    service::log_error(kLog, "cannot start job",
                       {{"job", id}, {"error", std::string(s.message())}});
    pause(std::chrono::seconds(1));  // the store refuses writes: do not spin on it
    return;
  }
  refresh_gauges();
  absl::StatusOr<rl::JobConfig> config = rl::parse_job_config(job.config_json);
  if (!config.ok()) {
    finish(JobState::kFailed, absl::StrCat("stored config: ", config.status().message()));
    return;
  }
  // Checked again where the files are opened: a stored job (an older store, or one written past
  // submission) cannot read datasets or write checkpoints outside the roots either.
  if (path_roots_.has_value()) {
    if (absl::Status s = rl::resolve_job_paths(*config, *path_roots_); !s.ok()) {
      finish(JobState::kFailed, absl::StrCat("stored config: ", s.message()));
      return;
    }
  }
  // The cap may have been lowered since the job was queued (a restart with another
  // --max-job-tokens): the job fails before generating anything.
  if (absl::Status s = check_token_cap(*config, admission_->limits().max_job_tokens); !s.ok()) {
    service::log_warn(kLog, "job over the token cap",
                      {{"job", id}, {"error", std::string(s.message())}});
    add_event(id, "token_quota", std::string(s.message()));
    finish(JobState::kFailed, absl::StrCat("token quota: ", s.message()));
    refresh_gauges();
    return;
  }
  service::log_info(kLog, "job started", {{"job", id}, {"resume", job.resume ? "true" : "false"}});
  if (job.resume && metrics_ != nullptr) metrics_->job_resumes->get().inc();  // restart resume
  const absl::Status status = run_with_resumes(job, *config);
  const bool user_cancelled = cancel_requested(id);
  if (status.ok()) {
    finish(JobState::kSucceeded, "");
  } else if (status.code() == absl::StatusCode::kCancelled && user_cancelled) {
    finish(JobState::kCancelled, "cancelled by user");
  } else if (stopping_) {
    // Coordinator shutdown: leave the job RUNNING so the next start resumes it.
    service::log_info(kLog, "job interrupted by shutdown", {{"job", id}});
    clear_progress(id);
    return;
  } else {
    finish(JobState::kFailed, std::string(status.message()));
  }
  service::log_info(kLog, "job ended", {{"job", id}, {"status", status.ToString()}});
  refresh_gauges();
}

absl::Status JobManager::run_with_resumes(const JobRecord& job, const rl::JobConfig& config) {
  const std::string& id = job.id;
  RlLoopHooks hooks;
  hooks.store = store_;
  hooks.metrics = metrics_;
  hooks.cancelled = [this, id] { return stopping_ || cancel_requested(id); };
  hooks.on_progress = [this] { refresh_gauges(); };
  hooks.on_phase = [this, id](const JobProgress& p) { set_progress(id, p); };
  hooks.on_event = [this, id](std::string_view kind, std::string_view message) {
    add_event(id, kind, message);
  };
  using Clock = std::chrono::steady_clock;
  JobRecord attempt = job;
  int resumes = 0;
  std::optional<Clock::time_point> lost_since;  // start of the current trainer outage
  std::string lost_reason;                      // the error that started it
  // Pause before the next attempt: 1 s, doubling while attempts make no progress, up to 8 s.
  std::chrono::milliseconds retry_backoff = std::chrono::seconds(1);
  while (true) {
    RlLoop loop(cluster_, hooks, options_);
    const absl::Status status = loop.run(attempt, config);
    if (status.ok() || stopping_ || cancel_requested(id) || !is_trainer_lost(status)) {
      return status;
    }
    // The trainer (or the weights) are gone. An attempt that made progress ends the previous
    // outage; attempts that did not (no trainer yet, weight sync still down) are part of it.
    const bool progressed = loop.progress() > 0;
    if (progressed || !lost_since) {
      retry_backoff = std::chrono::seconds(1);
      lost_since = Clock::now();
      lost_reason = std::string(status.message());
    }
    // The reason the outage started, and the latest failed try when it says something else.
    std::string reason = lost_reason;
    if (status.message() != lost_reason) {
      absl::StrAppend(&reason, " (last try: ", std::string(status.message()), ")");
    }
    const auto waited = Clock::now() - *lost_since;
    const double wait_s = std::chrono::duration<double>(options_.trainer_resume_wait).count();
    if (options_.trainer_resume_wait.count() <= 0) {
      return absl::Status(status.code(), absl::StrCat("trainer or weight sync lost: ", reason));
    }
    if (waited > options_.trainer_resume_wait) {
      return absl::Status(
          status.code(),
          absl::StrCat("trainer or weight sync lost and the job could not resume within ", wait_s,
                       " s: ", reason));
    }
    if (resumes >= options_.max_trainer_resumes) {
      return absl::Status(
          status.code(),
          absl::StrCat("trainer or weight sync lost ", resumes + 1, " times (at most ",
                       options_.max_trainer_resumes, " resumes per job): ", reason));
    }
    if (progressed || resumes == 0) {
      service::log_warn(kLog, "trainer lost; waiting for a trainer to resume the job",
                        {{"job", id}, {"error", std::string(status.message())}});
      add_event(id, "trainer_lost", std::string(status.message()));
    }
    JobProgress waiting;
    waiting.phase = "trainer_lost";
    waiting.detail = absl::StrCat(
        lost_reason, " (resuming when a trainer is back, ",
        static_cast<int64_t>(wait_s - std::chrono::duration<double>(waited).count()), " s left)");
    set_progress(id, waiting);
    // Back off before trying again; stop and cancel end the wait early.
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, retry_backoff,
                   [&] { return stopping_.load() || cancel_requests_.contains(id); });
    }
    if (cancel_requested(id)) return absl::CancelledError("cancelled by user");
    if (stopping_) return status;
    absl::StatusOr<JobRecord> fresh = store_->get_job(id);
    if (!fresh.ok()) return fresh.status();
    attempt = *fresh;
    attempt.resume = true;
    retry_backoff = std::min<std::chrono::milliseconds>(retry_backoff * 2, std::chrono::seconds(8));
    if (progressed || resumes == 0) {
      ++resumes;
      if (metrics_ != nullptr) metrics_->job_resumes->get().inc();
      service::log_info(kLog, "resuming job after trainer loss",
                        {{"job", id},
                         {"checkpoint", attempt.checkpoint.empty() ? "(none: from the start)"
                                                                   : attempt.checkpoint},
                         {"resume", absl::StrCat(resumes)}});
    }
  }
}

}  // namespace fp8rl::coordinator
