// The RL loop and its sample dispatcher (see rl_loop.h).
#include "services/coordinator/rl_loop.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/service/log.h"
#include "rl/sample_seeds.h"
#include "rl/scoring.h"
#include "rl/sft_batch.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/store_retry.h"

namespace fp8rl::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kLog[] = "rl_loop";
// A worker whose call failed gets no new call for this many poll intervals (1 s by default):
// long enough not to hammer a worker that is down, short enough to use one that caught up.
constexpr int kFailedWorkerBackoffPolls = 20;

// State shared between dispatch() and its (detached) worker-call threads, so a call that
// outlives the dispatch (a hung worker) never touches freed memory.
struct DispatchState {
  struct Call {
    std::string worker_id;
    std::vector<GenSample> chunk;
    bool finished = false;
    bool abandoned = false;  // its samples were handed back early (worker expired)
  };
  // Guards every member below; dispatch() holds it except while it asks the cluster for workers,
  // each call thread holds it while it records a result or its end.
  std::mutex mu;
  // Signalled (under mu) when a result arrives or a call ends; dispatch() waits on it for at
  // most poll_interval, then also re-checks live workers, deadlines and cancellation.
  std::condition_variable cv;
  std::deque<GenSample> pending;             // guarded by mu: samples not handed to a call yet
  std::map<std::string, GenResult> results;  // guarded by mu: by sample_id, the first valid one
  std::set<std::string> wanted;              // guarded by mu: every sample_id of the dispatch
  std::map<int64_t, Call> calls;             // guarded by mu: by call number
  std::set<std::string> busy_workers;        // guarded by mu: workers with a call in flight
  std::set<std::string> failed_workers;      // guarded by mu: skipped until the next back-off
  bool closed = false;                       // guarded by mu: late results are dropped
  DispatchStats stats;                       // guarded by mu
  int64_t min_version = 0;                   // set before the first call starts, then read only

  // Puts the unfinished samples of a call back in the queue. Caller holds mu.
  int64_t requeue_locked(const Call& call) {
    int64_t n = 0;
    for (const GenSample& s : call.chunk) {
      if (!results.contains(s.sample_id)) {
        pending.push_back(s);
        ++n;
      }
    }
    return n;
  }
};

// The job starts from a checkpoint folder that has a tokenizer.json (job_prompt_format).
bool has_checkpoint_tokenizer(const rl::JobConfig& config) {
  std::error_code ec;
  return !config.model.checkpoint.empty() &&
         std::filesystem::exists(std::filesystem::path(config.model.checkpoint) / "tokenizer.json",
                                 ec);
}

void run_call(std::shared_ptr<DispatchState> state, std::shared_ptr<GenerationClient> client,
              int64_t call_id, std::string request_id, std::vector<GenSample> chunk,
              GenParams params, std::chrono::milliseconds deadline) {
  std::set<std::string> in_chunk;
  for (const GenSample& s : chunk) in_chunk.insert(s.sample_id);
  const absl::Status status = client->generate(
      request_id, chunk, params,
      [&](GenResult result) {
        std::lock_guard<std::mutex> lock(state->mu);
        const bool valid = in_chunk.contains(result.sample_id) &&
                           result.tokens.size() == result.logprobs.size() &&
                           !result.tokens.empty() && result.weight_version >= state->min_version;
        if (state->closed || !valid || state->results.contains(result.sample_id)) {
          ++state->stats.duplicate_results;
          return;
        }
        state->results.emplace(result.sample_id, std::move(result));
        state->cv.notify_all();
      },
      deadline);
  std::lock_guard<std::mutex> lock(state->mu);
  auto& call = state->calls[call_id];
  call.finished = true;
  state->busy_workers.erase(call.worker_id);
  if (state->closed) return;
  bool missing = false;
  for (const GenSample& s : call.chunk) missing |= !state->results.contains(s.sample_id);
  if (!status.ok() || missing) {
    // An abandoned call (its worker expired) was already counted and re-queued.
    if (!call.abandoned) {
      ++state->stats.failed_calls;
      state->failed_workers.insert(call.worker_id);
      state->stats.redispatched_samples += state->requeue_locked(call);
    }
    fp8rl::service::log_warn(kLog, "generation call failed; re-dispatching",
                             {{"worker", call.worker_id},
                              {"request", request_id},
                              {"error", std::string(status.message())}});
  }
  state->cv.notify_all();
}

}  // namespace

std::string checkpoint_path(const rl::JobConfig& config, const std::string& job_id, int64_t step) {
  return (std::filesystem::path(config.checkpoint.dir) / job_id / absl::StrCat("step-", step))
      .string();
}

bool is_trainer_lost(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kTrainerLostPayload).has_value();
}

RlLoop::RlLoop(Cluster* cluster, RlLoopHooks hooks, RlLoopOptions options)
    : cluster_(cluster), hooks_(std::move(hooks)), options_(options) {}

void RlLoop::set_phase(std::string phase, int64_t done, int64_t total, std::string detail) {
  if (!hooks_.on_phase) return;
  JobProgress p;
  p.phase = std::move(phase);
  p.done = done;
  p.total = total;
  p.detail = std::move(detail);
  hooks_.on_phase(p);
}

absl::Status RlLoop::trainer_error(const absl::Status& status, const std::string& what) {
  absl::Status out(status.code(), absl::StrCat(what, status.message()));
  const absl::StatusCode c = status.code();
  if (c == absl::StatusCode::kUnavailable || c == absl::StatusCode::kDeadlineExceeded ||
      c == absl::StatusCode::kAborted) {
    out.SetPayload(kTrainerLostPayload, absl::Cord(what));
  }
  return out;
}

absl::Status RlLoop::check_cancelled() const {
  if (stop_generation_) return absl::CancelledError("asynchronous rollouts stopped");
  if (hooks_.cancelled && hooks_.cancelled()) return absl::CancelledError("cancelled by user");
  return absl::OkStatus();
}

absl::Status RlLoop::store_write(std::string_view label, std::string_view what,
                                 const std::function<absl::Status()>& write) const {
  StoreRetry retry;
  retry.wait = options_.store_retry_wait;
  retry.metrics = hooks_.metrics;
  retry.stop = hooks_.cancelled;
  absl::Status status = retry_store_write(label, what, retry, write);
  if (!status.ok() && hooks_.cancelled && hooks_.cancelled()) {
    return absl::CancelledError("cancelled by user");
  }
  return status;
}

absl::StatusOr<std::map<std::string, GenResult>> RlLoop::dispatch(
    const std::string& request_prefix, const std::vector<GenSample>& samples,
    const GenParams& params) {
  return dispatch_counted(request_prefix, samples, params, nullptr);
}

absl::StatusOr<std::map<std::string, GenResult>> RlLoop::dispatch_counted(
    const std::string& request_prefix, const std::vector<GenSample>& samples,
    const GenParams& params, DispatchStats* stats) {
  auto state = std::make_shared<DispatchState>();
  state->min_version = params.min_weight_version;
  for (const GenSample& s : samples) {
    if (!state->wanted.insert(s.sample_id).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate sample id ", s.sample_id));
    }
    state->pending.push_back(s);
  }
  int64_t next_call = 0;
  // The dispatch fails when no result arrived for worker_wait while nothing was in flight.
  auto last_progress = Clock::now();
  size_t results_seen = 0;
  auto failed_cleared_at = Clock::now();
  std::unique_lock<std::mutex> lock(state->mu);
  // Ends the dispatch (caller holds mu): late results are dropped, the stats are kept and the
  // re-dispatch counters grow, whichever way the dispatch ends.
  auto close = [&] {
    state->closed = true;
    if (stats != nullptr) *stats = state->stats;
    {
      std::lock_guard<std::mutex> stats_lock(stats_mu_);
      dispatch_stats_ = state->stats;
    }
    if (hooks_.metrics != nullptr) {
      hooks_.metrics->redispatched_requests->get().inc(
          static_cast<double>(state->stats.failed_calls));
      hooks_.metrics->redispatched_samples->get().inc(
          static_cast<double>(state->stats.redispatched_samples));
    }
  };
  while (state->results.size() < samples.size()) {
    lock.unlock();
    const std::vector<WorkerRef> live = cluster_->live_generation_workers();
    lock.lock();
    // Hand back early the samples of calls whose worker expired from the registry.
    std::set<std::string> live_ids;
    for (const WorkerRef& w : live) live_ids.insert(w.id);
    for (auto& [id, call] : state->calls) {
      if (!call.finished && !call.abandoned && !live_ids.contains(call.worker_id)) {
        call.abandoned = true;
        ++state->stats.failed_calls;  // a request given up and re-dispatched
        state->failed_workers.insert(call.worker_id);
        const int64_t requeued = state->requeue_locked(call);
        state->stats.redispatched_samples += requeued;
        fp8rl::service::log_warn(kLog, "generation worker expired; re-dispatching its call",
                                 {{"worker", call.worker_id},
                                  {"request", absl::StrCat(request_prefix, "-c", id)},
                                  {"samples", absl::StrCat(requeued)}});
      }
    }
    if (state->results.size() != results_seen) {
      results_seen = state->results.size();
      last_progress = Clock::now();
    }
    // Workers that failed earlier get another chance after a back-off (they may have caught up
    // with the weights, or come back).
    if (Clock::now() - failed_cleared_at > options_.poll_interval * kFailedWorkerBackoffPolls) {
      state->failed_workers.clear();
      failed_cleared_at = Clock::now();
    }
    std::vector<WorkerRef> idle;
    for (const WorkerRef& w : live) {
      if (!state->busy_workers.contains(w.id) && !state->failed_workers.contains(w.id)) {
        idle.push_back(w);
      }
    }
    // Drop pending entries that a late result already completed.
    std::erase_if(state->pending,
                  [&](const GenSample& s) { return state->results.contains(s.sample_id); });
    if (!state->pending.empty() && !idle.empty()) {
      const size_t per_worker = (state->pending.size() + idle.size() - 1) / idle.size();
      for (const WorkerRef& worker : idle) {
        if (state->pending.empty()) break;
        DispatchState::Call call;
        call.worker_id = worker.id;
        const size_t n = std::min(per_worker, state->pending.size());
        call.chunk.assign(state->pending.begin(), state->pending.begin() + n);
        state->pending.erase(state->pending.begin(), state->pending.begin() + n);
        const int64_t call_id = next_call++;
        state->calls[call_id] = call;
        state->busy_workers.insert(worker.id);
        ++state->stats.calls;
        std::shared_ptr<GenerationClient> client = cluster_->generation_client(worker);
        std::thread(run_call, state, client, call_id, absl::StrCat(request_prefix, "-c", call_id),
                    call.chunk, params, options_.generate_deadline)
            .detach();
      }
    }
    if (!state->pending.empty() && state->busy_workers.empty() &&
        Clock::now() - last_progress > options_.worker_wait) {
      const size_t left = samples.size() - state->results.size();
      close();
      return absl::UnavailableError(absl::StrCat("no live generation worker could finish ", left,
                                                 " of ", samples.size(), " samples within ",
                                                 options_.worker_wait.count() / 1000.0, " s"));
    }
    if (absl::Status s = check_cancelled(); !s.ok()) {
      close();
      return s;
    }
    state->cv.wait_for(lock, options_.poll_interval);
  }
  close();
  return state->results;
}

absl::Status RlLoop::wait_for_version(int64_t version) {
  const auto start = Clock::now();
  const auto deadline = start + options_.sync_wait;
  bool lag_reported = false;
  while (true) {
    int64_t live = 0, holding = 0;
    std::vector<std::string> lagging;  // registration ids of the live workers without it
    for (const WorkerRef& worker : cluster_->live_generation_workers()) {
      ++live;
      absl::StatusOr<int64_t> held = cluster_->generation_client(worker)->weight_version();
      if (held.ok() && *held >= version) {
        ++holding;
      } else {
        lagging.push_back(worker.id);
      }
    }
    if (holding == live) return absl::OkStatus();
    if (!lag_reported && Clock::now() - start >= options_.sync_lag_warn) {
      // Live (heartbeating) but without the version: weight sync cannot reach them, or slowly
      // (docs/design/faults.md "Network delay, loss and partitions").
      lag_reported = true;
      fp8rl::service::log_warn(kLog, "live workers lag behind the new weight version",
                               {{"version", absl::StrCat(version)},
                                {"workers", absl::StrJoin(lagging, ",")},
                                {"holding", absl::StrCat(holding, " of ", live)},
                                {"waited_s", absl::StrFormat("%.1f", seconds_since(start))}});
      if (hooks_.metrics != nullptr) {
        hooks_.metrics->sync_lagging_workers->get().inc(static_cast<double>(lagging.size()));
      }
    }
    if (Clock::now() > deadline) {
      if (holding == 0) {
        // Nobody can sample with these weights: the version was lost on its way (weight sync
        // restarted after the upload). Resumable like a trainer loss: publishing again fixes it.
        return trainer_error(absl::UnavailableError(absl::StrCat(
                                 "weight version ", version, " reached none of the ", live,
                                 " live generation workers within ",
                                 std::chrono::duration<double>(options_.sync_wait).count(),
                                 " s (was the weight-sync service restarted?)")),
                             "");
      }
      // Workers that lag are still safe: Generate carries min_weight_version and they refuse.
      fp8rl::service::log_warn(
          kLog, "not every live worker holds the new version",
          {{"version", absl::StrCat(version)}, {"holding", absl::StrCat(holding, " of ", live)}});
      return absl::OkStatus();
    }
    if (absl::Status s = check_cancelled(); !s.ok()) return s;
    std::this_thread::sleep_for(options_.poll_interval);
  }
}

absl::StatusOr<rl::PromptFormat> job_prompt_format(const rl::JobConfig& config) {
  if (!has_checkpoint_tokenizer(config)) return rl::byte_prompt_format();
  const std::string& dir = config.model.checkpoint;
  absl::StatusOr<rl::PromptFormat> format = rl::load_prompt_format(dir);
  if (!format.ok()) {
    return absl::Status(format.status().code(),
                        absl::StrCat("model.checkpoint: ", format.status().message()));
  }
  if (!config.model.chat_template_kwargs.is_null()) {
    // The job's variables over any the format brings.
    if (!format->template_kwargs.is_object())
      format->template_kwargs = nlohmann::ordered_json::object();
    format->template_kwargs.update(config.model.chat_template_kwargs);
  }
  return format;
}

absl::StatusOr<double> RlLoop::validate(const JobRun& run, int64_t step) {
  const rl::JobConfig& config = run.config;
  const auto& examples = run.task.validation();
  const size_t n = config.validation.num_prompts > 0
                       ? std::min<size_t>(examples.size(), config.validation.num_prompts)
                       : examples.size();
  std::vector<GenSample> samples(n);
  for (size_t i = 0; i < n; ++i) {
    absl::StatusOr<std::vector<int32_t>> prompt = rl::encode_prompt(examples[i], run.format);
    if (!prompt.ok()) return prompt.status();
    samples[i] = {absl::StrCat("v", step, "-", i), *std::move(prompt),
                  rl::validation_sample_seed(config.algorithm.seed, step, static_cast<int64_t>(i))};
  }
  GenParams params;
  params.temperature = 0.0;
  params.max_new_tokens = config.algorithm.max_new_tokens;
  params.stop_token_ids = run.format.stop_ids;
  params.min_weight_version = run.version;
  auto results = dispatch(absl::StrCat(run.job.id, "-val", step), samples, params);
  if (!results.ok()) return results.status();
  if (n == 0) return 0.0;
  int64_t correct = 0;
  for (size_t i = 0; i < n; ++i) {
    const GenResult& r = results->at(samples[i].sample_id);
    correct += run.task.correct(examples[i], rl::decode_completion(r.tokens, run.format)) ? 1 : 0;
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

absl::Status RlLoop::run(const JobRecord& job, const rl::JobConfig& config) {
  absl::StatusOr<rl::Task> task = rl::make_task(config.task);
  if (!task.ok()) return task.status();
  if (task->train().empty()) return absl::FailedPreconditionError("task: empty training split");
  absl::StatusOr<rl::PromptFormat> format = job_prompt_format(config);
  if (!format.ok()) return format.status();
  JobRun run(job, config, *std::move(task), *std::move(format));
  if (absl::Status s = log_prompt_format(run); !s.ok()) return s;

  // Step 0: start or resume.
  if (absl::Status s = connect_trainer(run); !s.ok()) return s;
  bool resumed = false;
  if (job.resume && !job.checkpoint.empty()) {
    absl::StatusOr<bool> loaded = resume_from_checkpoint(run);
    if (!loaded.ok()) return loaded.status();
    resumed = *loaded;
  }
  if (!resumed) {
    if (absl::Status s = init_policy(run); !s.ok()) return s;
    if (absl::Status s = sft_warm_start(run); !s.ok()) return s;
  }
  if (absl::Status s = publish_first_version(run); !s.ok()) return s;
  if (run.start_step == 0) {
    if (absl::Status s = validate_start(run); !s.ok()) return s;
  }
  if (config.algorithm.max_staleness > 0) return run_async(run);

  // Steps 1-8, once per RL step; the job can be cancelled between phases.
  for (int64_t step = run.start_step + 1; step <= config.algorithm.steps; ++step) {
    const auto step_start = Clock::now();
    rl::StepMetrics row;
    if (absl::Status s = check_cancelled(); !s.ok()) return s;
    // Steps 1-2: rollout.
    absl::StatusOr<Rollout> rollout = this->rollout(run, step, row);
    if (!rollout.ok()) return rollout.status();
    if (absl::Status s = check_cancelled(); !s.ok()) return s;
    // Step 3: score.
    absl::StatusOr<std::vector<TrainSequence>> batch = score(run, *std::move(rollout), row);
    if (!batch.ok()) return batch.status();
    // Steps 4-5: train.
    if (absl::Status s = train(run, step, *batch, row); !s.ok()) return s;
    if (absl::Status s = check_cancelled(); !s.ok()) return s;
    // Steps 6-7: publish and sync.
    if (absl::Status s = publish_and_sync(run, step, row); !s.ok()) return s;
    // Step 8: validate and checkpoint, then the step's metrics row.
    if (absl::Status s = validate_and_checkpoint(run, step, row); !s.ok()) return s;
    row.step_seconds = seconds_since(step_start);
    if (absl::Status s = record_step(run, step, row); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RlLoop::log_prompt_format(const JobRun& run) {
  const rl::Example& example = run.task.train().front();
  absl::StatusOr<std::vector<int32_t>> ids = rl::encode_prompt(example, run.format);
  if (!ids.ok()) return ids.status();
  service::log_info(kLog, "prompt format",
                    {{"job", run.job.id},
                     {"tokenizer", has_checkpoint_tokenizer(run.config)
                                       ? run.config.model.checkpoint + "/tokenizer.json"
                                       : "byte"},
                     {"chat_template", run.format.chat_template.has_value() ? "yes" : "no"},
                     {"stop_ids", absl::StrJoin(run.format.stop_ids, ",")},
                     {"example_prompt", example.prompt},
                     {"example_ids", absl::StrJoin(*ids, ",")}});
  return absl::OkStatus();
}

absl::Status RlLoop::connect_trainer(JobRun& run) {
  const int group = static_cast<int>(run.config.trainer.data_parallel);
  set_phase("waiting_for_trainer", 0, group > 1 ? group : 0);
  std::string shown;  // the group's last "k of N live" shown in the phase detail
  for (auto start = Clock::now();;) {
    absl::StatusOr<std::shared_ptr<TrainerClient>> trainer =
        cluster_->trainer_group(group, run.config.trainer.shard);
    if (trainer.ok()) {
      run.trainer = *std::move(trainer);
      if (group > 1 && run.job.resume) note_group_reformed(run, group, seconds_since(start));
      return absl::OkStatus();
    }
    if (Clock::now() - start > options_.worker_wait) {
      const absl::Status none = absl::UnavailableError(
          absl::StrCat("no trainer registered: ", trainer.status().message()));
      // While resuming, a missing trainer is the lost one not back yet.
      return run.job.resume ? trainer_error(none, "") : none;
    }
    if (absl::Status s = check_cancelled(); !s.ok()) return s;
    if (group > 1 && trainer.status().message() != shown) {
      shown = std::string(trainer.status().message());
      set_phase("waiting_for_trainer", 0, group, shown);
    }
    std::this_thread::sleep_for(options_.poll_interval);
  }
}

void RlLoop::note_group_reformed(const JobRun& run, int size, double waited_seconds) {
  const std::string from =
      run.job.checkpoint.empty() ? "the beginning (no checkpoint yet)" : run.job.checkpoint;
  service::log_info(kLog, "trainer group formed again",
                    {{"job", run.job.id},
                     {"size", absl::StrCat(size)},
                     {"waited_seconds", absl::StrFormat("%.1f", waited_seconds)},
                     {"resume_from", from}});
  if (hooks_.metrics != nullptr) hooks_.metrics->trainer_groups_reformed->get().inc();
  if (hooks_.on_event) {
    hooks_.on_event("group_reformed",
                    absl::StrFormat("a trainer group of %d formed again after %.1f s; resuming "
                                    "from %s",
                                    size, waited_seconds, from));
  }
}

absl::StatusOr<bool> RlLoop::resume_from_checkpoint(JobRun& run) {
  const JobRecord& job = run.job;
  const int64_t every = run.config.checkpoint.every_steps;
  std::string path = job.checkpoint;
  int64_t step = job.checkpoint_step;
  while (true) {
    set_phase("loading_checkpoint", 0, 0, path);
    absl::StatusOr<int64_t> version = run.trainer->load_checkpoint(path);
    if (version.ok()) break;
    const absl::Status error =
        trainer_error(version.status(), absl::StrCat("resume from checkpoint '", path, "': "));
    if (is_trainer_lost(error)) return error;
    // The trainer answered but could not read the folder (corrupt, truncated, deleted): the
    // checkpoint before it, which the same job wrote every_steps earlier, else the beginning.
    const int64_t previous = every > 0 ? step - every : 0;
    const std::string fallback =
        previous > 0 ? checkpoint_path(run.config, job.id, previous) : std::string();
    service::log_warn(kLog, "checkpoint unreadable; falling back to the previous one",
                      {{"job", job.id},
                       {"checkpoint", path},
                       {"error", std::string(version.status().message())},
                       {"fallback", fallback.empty() ? "(none: from the start)" : fallback}});
    if (hooks_.metrics != nullptr) hooks_.metrics->checkpoint_fallbacks->get().inc();
    if (hooks_.on_event) {
      hooks_.on_event(
          "checkpoint_fallback",
          absl::StrCat("checkpoint '", path, "' unreadable (", version.status().message(),
                       "); resuming from ",
                       fallback.empty() ? "the start" : absl::StrCat("'", fallback, "'")));
    }
    if (fallback.empty()) return false;
    path = fallback;
    step = previous;
  }
  if (path != job.checkpoint) {
    // A later resume starts from the checkpoint that loaded, not the unreadable one.
    if (absl::Status s =
            store_write("checkpoint", absl::StrCat("the checkpoint of step ", step),
                        [&] { return hooks_.store->set_checkpoint(job.id, path, step); });
        !s.ok()) {
      return s;
    }
  }
  run.start_step = step;
  // Steps after the checkpoint run again and record their rows again.
  if (absl::Status s = store_write("step", absl::StrCat("the progress of step ", step),
                                   [&] {
                                     if (absl::Status w = hooks_.store->set_step(job.id, step);
                                         !w.ok())
                                       return w;
                                     return hooks_.store->delete_metrics_after(job.id, step);
                                   });
      !s.ok()) {
    return s;
  }
  service::log_info(kLog, "resuming job",
                    {{"job", job.id}, {"from_step", absl::StrCat(run.start_step)}});
  return true;
}

absl::Status RlLoop::init_policy(JobRun& run) {
  const JobRecord& job = run.job;
  if (job.resume) {
    service::log_info(kLog, "resuming job from the beginning (no checkpoint yet)",
                      {{"job", job.id}});
    if (absl::Status s = store_write("step", "the progress of step 0",
                                     [&] {
                                       if (absl::Status w = hooks_.store->set_step(job.id, 0);
                                           !w.ok())
                                         return w;
                                       return hooks_.store->delete_metrics_after(job.id, -1);
                                     });
        !s.ok()) {
      return s;
    }
  }
  set_phase("initializing");
  absl::StatusOr<int64_t> version = run.trainer->init_policy(job.id, run.config);
  if (!version.ok()) return trainer_error(version.status(), "trainer init: ");
  return absl::OkStatus();
}

absl::Status RlLoop::sft_warm_start(JobRun& run) {
  if (!run.config.sft) return absl::OkStatus();
  const rl::SftConfig& sft = *run.config.sft;
  const auto start = Clock::now();
  double loss = 0.0;
  set_phase("sft", 0, sft.steps);
  for (int64_t step = 0; step < sft.steps; ++step) {
    if (absl::Status s = check_cancelled(); !s.ok()) return s;
    absl::StatusOr<std::vector<rl::TokenizedExample>> examples =
        rl::sft_batch(run.task.train(), run.config.task.seed, step, sft.batch_size, run.format);
    if (!examples.ok()) return examples.status();
    std::vector<TrainSequence> batch;
    for (rl::TokenizedExample& example : *examples) {
      TrainSequence seq;
      seq.tokens = std::move(example.tokens);
      seq.prompt_length = example.prompt_length;
      batch.push_back(std::move(seq));
    }
    absl::StatusOr<TrainStepStats> stats =
        run.trainer->sft_step(run.job.id, batch, sft.learning_rate);
    if (!stats.ok()) {
      return trainer_error(stats.status(), absl::StrCat("SFT step ", step + 1, ": "));
    }
    loss = stats->values.count("loss") ? stats->values.at("loss") : 0.0;
    ++progress_;
    set_phase("sft", step + 1, sft.steps, absl::StrFormat("loss %.4f", loss));
  }
  run.start_metrics.sft = rl::StartMetrics::Sft{loss, seconds_since(start)};
  return absl::OkStatus();
}

int64_t RlLoop::highest_held_version() {
  int64_t highest = 0;
  for (const WorkerRef& worker : cluster_->live_generation_workers()) {
    absl::StatusOr<int64_t> held = cluster_->generation_client(worker)->weight_version();
    if (held.ok()) highest = std::max(highest, *held);
  }
  return highest;
}

absl::StatusOr<int64_t> RlLoop::publish(JobRun& run) {
  absl::StatusOr<int64_t> version =
      run.trainer->publish(run.calibrate_kv_scales(), highest_held_version());
  if (!version.ok()) return trainer_error(version.status(), "publish: ");
  run.version = *version;
  if (hooks_.metrics != nullptr) {
    hooks_.metrics->weight_version->get().set(static_cast<double>(*version));
  }
  return version;
}

absl::Status RlLoop::publish_first_version(JobRun& run) {
  if (hooks_.metrics != nullptr) {
    hooks_.metrics->step->get().set(static_cast<double>(run.start_step));
  }
  set_phase("syncing_weights");
  if (absl::StatusOr<int64_t> version = publish(run); !version.ok()) return version.status();
  return wait_for_version(run.version);
}

absl::Status RlLoop::validate_start(JobRun& run) {
  set_phase("validating", 0, 0, "step 0");
  const auto start = Clock::now();
  absl::StatusOr<double> accuracy = validate(run, 0);
  if (!accuracy.ok()) return accuracy.status();
  rl::StartMetrics& row = run.start_metrics;
  row.val_accuracy = *accuracy;
  row.validate_seconds = seconds_since(start);
  row.weight_version = run.version;
  const rl::MetricsValues values = rl::to_row(row);
  if (absl::Status s =
          store_write("metrics_row", "the metrics row of step 0",
                      [&] { return hooks_.store->put_metrics(run.job.id, 0, values); });
      !s.ok()) {
    return s;
  }
  ++progress_;
  if (hooks_.metrics != nullptr) {
    hooks_.metrics->validation_accuracy->get().set(*accuracy);
    hooks_.metrics->record_phases(values);
  }
  if (hooks_.on_progress) hooks_.on_progress();
  return absl::OkStatus();
}

absl::StatusOr<RlLoop::Rollout> RlLoop::rollout(const JobRun& run, int64_t step,
                                                rl::StepMetrics& row) {
  set_phase("rl", step - 1, run.config.algorithm.steps, "rollout");
  absl::StatusOr<Rollout> out = generate_rollout(run, step, run.version);
  if (!out.ok()) return out.status();
  row.generate_seconds = out->generate_seconds;
  row.redispatched_samples = out->redispatched_samples;
  return out;
}

GenParams RlLoop::rollout_params(const JobRun& run, int64_t min_version) {
  const rl::AlgorithmConfig& alg = run.config.algorithm;
  GenParams params;
  params.temperature = alg.temperature;
  params.top_p = alg.top_p;
  params.max_new_tokens = alg.max_new_tokens;
  params.stop_token_ids = run.format.stop_ids;
  params.min_weight_version = min_version;
  return params;
}

absl::StatusOr<RlLoop::Rollout> RlLoop::generate_rollout(const JobRun& run, int64_t step,
                                                         int64_t min_version) {
  const rl::AlgorithmConfig& alg = run.config.algorithm;
  const auto start = Clock::now();
  Rollout out;
  out.step = step;
  const std::vector<int64_t> indices = rl::prompt_indices(
      static_cast<int64_t>(run.task.train().size()), alg.seed, step, alg.prompts_per_step);
  for (size_t p = 0; p < indices.size(); ++p) {
    out.prompts.push_back(run.task.train()[static_cast<size_t>(indices[p])]);
    absl::StatusOr<std::vector<int32_t>> encoded =
        rl::encode_prompt(out.prompts.back(), run.format);
    if (!encoded.ok()) return encoded.status();
    const std::vector<int32_t>& prompt = *encoded;
    for (int64_t g = 0; g < alg.samples_per_prompt; ++g) {
      out.samples.push_back({absl::StrCat("s", step, "-p", p, "-g", g), prompt,
                             rl::sample_seed(alg.seed, step, static_cast<int64_t>(p), g)});
    }
  }
  const GenParams params = rollout_params(run, min_version);
  DispatchStats stats;
  absl::StatusOr<std::map<std::string, GenResult>> results =
      dispatch_counted(absl::StrCat(run.job.id, "-s", step), out.samples, params, &stats);
  if (!results.ok()) return results.status();
  out.results = *std::move(results);
  out.generate_seconds = seconds_since(start);
  out.redispatched_samples = stats.redispatched_samples;
  return out;
}

absl::StatusOr<std::vector<TrainSequence>> RlLoop::score(const JobRun& run, Rollout rollout,
                                                         rl::StepMetrics& row) {
  const auto start = Clock::now();
  std::vector<std::vector<int32_t>> responses;
  responses.reserve(rollout.samples.size());
  for (const GenSample& sample : rollout.samples) {
    responses.push_back(rollout.results.at(sample.sample_id).tokens);
  }
  absl::StatusOr<rl::RolloutScores> scores = rl::score_rollout(
      run.task, rollout.prompts, responses, run.config.algorithm.samples_per_prompt, run.format);
  if (!scores.ok()) return scores.status();
  row.reward_mean = scores->reward_mean;
  row.reward_std = scores->reward_std;
  row.train_accuracy = scores->accuracy;
  row.response_length_mean = scores->response_length_mean;
  std::vector<TrainSequence> batch(rollout.samples.size());
  for (size_t i = 0; i < rollout.samples.size(); ++i) {
    GenSample& sample = rollout.samples[i];
    GenResult& result = rollout.results.at(sample.sample_id);
    batch[i].prompt_length = static_cast<int64_t>(sample.prompt_tokens.size());
    batch[i].tokens = std::move(sample.prompt_tokens);
    batch[i].tokens.insert(batch[i].tokens.end(), result.tokens.begin(), result.tokens.end());
    batch[i].advantage = scores->advantages[i];
    batch[i].gen_logprobs = std::move(result.logprobs);
    batch[i].routing = std::move(result.routing);
  }
  row.score_seconds = seconds_since(start);
  return batch;
}

absl::Status RlLoop::train(const JobRun& run, int64_t step, const std::vector<TrainSequence>& batch,
                           rl::StepMetrics& row) {
  set_phase("rl", step - 1, run.config.algorithm.steps, "train");
  const auto start = Clock::now();
  absl::StatusOr<TrainStepStats> stats =
      run.trainer->train_step(run.job.id, step, batch, run.config);
  if (!stats.ok()) return trainer_error(stats.status(), absl::StrCat("train step ", step, ": "));
  row.trainer = stats->values;
  row.train_seconds = seconds_since(start);
  if (hooks_.metrics != nullptr) hooks_.metrics->record_step_metrics(stats->values);
  return absl::OkStatus();
}

absl::Status RlLoop::publish_and_sync(JobRun& run, int64_t step, rl::StepMetrics& row) {
  set_phase("rl", step - 1, run.config.algorithm.steps, "publish");
  auto start = Clock::now();
  if (absl::StatusOr<int64_t> version = publish(run); !version.ok()) return version.status();
  row.weight_version = run.version;
  row.publish_seconds = seconds_since(start);
  start = Clock::now();
  if (absl::Status s = wait_for_version(run.version); !s.ok()) return s;
  row.sync_seconds = seconds_since(start);
  return absl::OkStatus();
}

absl::Status RlLoop::validate_and_checkpoint(const JobRun& run, int64_t step,
                                             rl::StepMetrics& row) {
  const rl::JobConfig& config = run.config;
  const int64_t steps = config.algorithm.steps;
  if (validates_at(config, step)) {
    set_phase("rl", step - 1, steps, "validate");
    const auto start = Clock::now();
    absl::StatusOr<double> accuracy = validate(run, step);
    if (!accuracy.ok()) return accuracy.status();
    row.validation = rl::StepMetrics::Validation{*accuracy, seconds_since(start)};
    if (hooks_.metrics != nullptr) hooks_.metrics->validation_accuracy->get().set(*accuracy);
  }
  if (config.checkpoint.every_steps > 0 && step % config.checkpoint.every_steps == 0) {
    set_phase("rl", step - 1, steps, "checkpoint");
    const auto start = Clock::now();
    const std::string path = checkpoint_path(config, run.job.id, step);
    if (absl::Status s = run.trainer->save_checkpoint(path); !s.ok()) {
      return trainer_error(s, absl::StrCat("checkpoint at step ", step, ": "));
    }
    if (absl::Status s =
            store_write("checkpoint", absl::StrCat("the checkpoint of step ", step),
                        [&] { return hooks_.store->set_checkpoint(run.job.id, path, step); });
        !s.ok()) {
      return s;
    }
    row.checkpoint_seconds = seconds_since(start);
  }
  return absl::OkStatus();
}

bool RlLoop::validates_at(const rl::JobConfig& config, int64_t step) {
  const int64_t every = config.validation.every_steps;
  return (every > 0 && step % every == 0) || step == config.algorithm.steps;
}

absl::Status RlLoop::record_step(const JobRun& run, int64_t step, const rl::StepMetrics& row) {
  const std::string& job_id = run.job.id;
  const rl::MetricsValues values = rl::to_row(row);
  if (absl::Status s = store_write("metrics_row", absl::StrCat("the metrics row of step ", step),
                                   [&] { return hooks_.store->put_metrics(job_id, step, values); });
      !s.ok()) {
    return s;
  }
  ++progress_;
  if (absl::Status s = store_write("step", absl::StrCat("the progress of step ", step),
                                   [&] { return hooks_.store->set_step(job_id, step); });
      !s.ok()) {
    return s;
  }
  if (CoordinatorMetrics* metrics = hooks_.metrics; metrics != nullptr) {
    const rl::AlgorithmConfig& alg = run.config.algorithm;
    metrics->step->get().set(static_cast<double>(step));
    metrics->reward_mean->get().set(row.reward_mean);
    metrics->steps->get().inc();
    metrics->samples->get().inc(static_cast<double>(alg.prompts_per_step * alg.samples_per_prompt));
    metrics->record_phases(values);
  }
  service::log_info(kLog, "step done",
                    {{"job", job_id},
                     {"step", absl::StrCat(step)},
                     {"reward_mean", absl::StrCat(row.reward_mean)},
                     {"seconds", absl::StrCat(row.step_seconds)}});
  if (hooks_.on_progress) hooks_.on_progress();
  return absl::OkStatus();
}

}  // namespace fp8rl::coordinator
