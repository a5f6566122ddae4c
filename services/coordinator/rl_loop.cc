// The RL loop and its sample dispatcher (see rl_loop.h).
#include "services/coordinator/rl_loop.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/service/log.h"
#include "rl/grpo.h"
#include "rl/tasks.h"
#include "rl/tokenizer.h"
#include "services/coordinator/coordinator_metrics.h"

namespace fp8rl::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kLog[] = "rl_loop";

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// State shared between dispatch() and its (detached) worker-call threads, so a call that
// outlives the dispatch (a hung worker) never touches freed memory.
struct DispatchState {
  struct Call {
    std::string worker_id;
    std::vector<GenSample> chunk;
    bool finished = false;
    bool abandoned = false;  // its samples were handed back early (worker expired)
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<GenSample> pending;
  std::map<std::string, GenResult> results;
  std::set<std::string> wanted;
  std::map<int64_t, Call> calls;  // by call number
  std::set<std::string> busy_workers;
  std::set<std::string> failed_workers;
  bool closed = false;
  DispatchStats stats;
  int64_t min_version = 0;

  // Puts the unfinished samples of a call back in the queue (caller holds mu).
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

uint64_t sample_seed(uint64_t job_seed, int64_t step, int64_t prompt, int64_t sample) {
  uint64_t h = splitmix64(job_seed);
  h = splitmix64(h ^ static_cast<uint64_t>(step));
  h = splitmix64(h ^ static_cast<uint64_t>(prompt));
  return splitmix64(h ^ static_cast<uint64_t>(sample));
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
  if (hooks_.cancelled && hooks_.cancelled()) return absl::CancelledError("cancelled by user");
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, GenResult>> RlLoop::dispatch(
    const std::string& request_prefix, const std::vector<GenSample>& samples,
    const GenParams& params) {
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
    dispatch_stats_ = state->stats;
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
        state->stats.redispatched_samples += state->requeue_locked(call);
      }
    }
    if (state->results.size() != results_seen) {
      results_seen = state->results.size();
      last_progress = Clock::now();
    }
    // Workers that failed earlier get another chance after a back-off (they may have caught up
    // with the weights, or come back).
    if (Clock::now() - failed_cleared_at > options_.poll_interval * 20) {
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
  const auto deadline = Clock::now() + options_.sync_wait;
  while (true) {
    int64_t live = 0, holding = 0;
    for (const WorkerRef& worker : cluster_->live_generation_workers()) {
      ++live;
      absl::StatusOr<int64_t> held = cluster_->generation_client(worker)->weight_version();
      if (held.ok() && *held >= version) ++holding;
    }
    if (holding == live) return absl::OkStatus();
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

absl::StatusOr<double> RlLoop::validate(const std::string& job_id, int64_t step,
                                        const rl::JobConfig& config, int64_t version) {
  absl::StatusOr<rl::Task> task = rl::make_task(config.task);
  if (!task.ok()) return task.status();
  const rl::ByteTokenizer tokenizer;
  const auto& examples = task->validation();
  const size_t n = config.validation.num_prompts > 0
                       ? std::min<size_t>(examples.size(), config.validation.num_prompts)
                       : examples.size();
  std::vector<GenSample> samples(n);
  for (size_t i = 0; i < n; ++i) {
    samples[i] = {absl::StrCat("v", step, "-", i), tokenizer.encode(examples[i].prompt, true),
                  sample_seed(config.algorithm.seed, -step - 1, static_cast<int64_t>(i), 0)};
  }
  GenParams params;
  params.temperature = 0.0;
  params.max_new_tokens = config.algorithm.max_new_tokens;
  params.stop_token_ids = {rl::kEosId};
  params.min_weight_version = version;
  auto results = dispatch(absl::StrCat(job_id, "-val", step), samples, params);
  if (!results.ok()) return results.status();
  if (n == 0) return 0.0;
  int64_t correct = 0;
  for (size_t i = 0; i < n; ++i) {
    const GenResult& r = results->at(samples[i].sample_id);
    correct += task->correct(examples[i], tokenizer.decode(r.tokens)) ? 1 : 0;
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

absl::Status RlLoop::run(const JobRecord& job, const rl::JobConfig& config) {
  JobStore* store = hooks_.store;
  CoordinatorMetrics* metrics = hooks_.metrics;
  const rl::ByteTokenizer tokenizer;
  absl::StatusOr<rl::Task> task = rl::make_task(config.task);
  if (!task.ok()) return task.status();
  if (task->train().empty()) return absl::FailedPreconditionError("task: empty training split");

  // The trainer (wait for one to register).
  set_phase("waiting_for_trainer");
  std::shared_ptr<TrainerClient> trainer;
  for (auto start = Clock::now();;) {
    absl::StatusOr<std::shared_ptr<TrainerClient>> t = cluster_->trainer();
    if (t.ok()) {
      trainer = *t;
      break;
    }
    if (Clock::now() - start > options_.worker_wait) {
      const absl::Status none =
          absl::UnavailableError(absl::StrCat("no trainer registered: ", t.status().message()));
      // While resuming, a missing trainer is the lost one not back yet.
      return job.resume ? trainer_error(none, "") : none;
    }
    if (absl::Status s = check_cancelled(); !s.ok()) return s;
    std::this_thread::sleep_for(options_.poll_interval);
  }

  int64_t start_step = 0;
  std::map<std::string, double> row0;
  if (job.resume && !job.checkpoint.empty()) {
    set_phase("loading_checkpoint", 0, 0, job.checkpoint);
    absl::StatusOr<int64_t> v = trainer->load_checkpoint(job.checkpoint);
    if (!v.ok()) {
      return trainer_error(v.status(),
                           absl::StrCat("resume from checkpoint '", job.checkpoint, "': "));
    }
    start_step = job.checkpoint_step;
    // Steps after the checkpoint run again and record their rows again.
    if (absl::Status s = store->set_step(job.id, start_step); !s.ok()) return s;
    if (absl::Status s = store->delete_metrics_after(job.id, start_step); !s.ok()) return s;
    service::log_info(kLog, "resuming job",
                      {{"job", job.id}, {"from_step", absl::StrCat(start_step)}});
  } else {
    if (job.resume) {
      service::log_info(kLog, "resuming job from the beginning (no checkpoint yet)",
                        {{"job", job.id}});
      if (absl::Status s = store->set_step(job.id, 0); !s.ok()) return s;
      if (absl::Status s = store->delete_metrics_after(job.id, -1); !s.ok()) return s;
    }
    set_phase("initializing");
    absl::StatusOr<int64_t> v = trainer->init_policy(job.id, config);
    if (!v.ok()) return trainer_error(v.status(), "trainer init: ");
    if (config.sft) {
      const auto start = Clock::now();
      double loss = 0.0;
      set_phase("sft", 0, config.sft->steps);
      for (int64_t s = 0; s < config.sft->steps; ++s) {
        if (absl::Status st = check_cancelled(); !st.ok()) return st;
        std::vector<TrainSequence> batch;
        for (int64_t index :
             rl::prompt_indices(static_cast<int64_t>(task->train().size()), config.task.seed + 7919,
                                s, config.sft->batch_size)) {
          const rl::Example& ex = task->train()[static_cast<size_t>(index)];
          TrainSequence seq;
          seq.tokens = tokenizer.encode(ex.prompt, true);
          seq.prompt_length = static_cast<int64_t>(seq.tokens.size());
          for (int32_t t : tokenizer.encode(ex.answer, false, true)) seq.tokens.push_back(t);
          batch.push_back(std::move(seq));
        }
        absl::StatusOr<TrainStepStats> stats =
            trainer->sft_step(job.id, batch, config.sft->learning_rate);
        if (!stats.ok())
          return trainer_error(stats.status(), absl::StrCat("SFT step ", s + 1, ": "));
        loss = stats->values.count("loss") ? stats->values.at("loss") : 0.0;
        ++progress_;
        set_phase("sft", s + 1, config.sft->steps, absl::StrFormat("loss %.4f", loss));
      }
      row0["sft_loss"] = loss;
      row0["time_sft_seconds"] = seconds_since(start);
    }
  }

  if (metrics != nullptr) metrics->step->get().set(static_cast<double>(start_step));

  // Give every generation worker the starting weights.
  auto publish = [&](bool calibrate) -> absl::StatusOr<int64_t> {
    absl::StatusOr<int64_t> v = trainer->publish(calibrate);
    if (!v.ok()) return trainer_error(v.status(), "publish: ");
    if (metrics != nullptr) metrics->weight_version->get().set(static_cast<double>(*v));
    return v;
  };
  const bool calibrate = config.precision.kv_cache == rl::Precision::kFP8;
  set_phase("syncing_weights");
  absl::StatusOr<int64_t> version = publish(calibrate);
  if (!version.ok()) return version.status();
  if (absl::Status s = wait_for_version(*version); !s.ok()) return s;

  if (start_step == 0) {
    set_phase("validating", 0, 0, "step 0");
    const auto start = Clock::now();
    absl::StatusOr<double> accuracy = validate(job.id, 0, config, *version);
    if (!accuracy.ok()) return accuracy.status();
    row0["val_accuracy"] = *accuracy;
    row0["time_validate_seconds"] = seconds_since(start);
    row0["weight_version"] = static_cast<double>(*version);
    if (absl::Status s = store->put_metrics(job.id, 0, row0); !s.ok()) return s;
    ++progress_;
    if (metrics != nullptr) {
      metrics->validation_accuracy->get().set(*accuracy);
      metrics->record_phases(row0);
    }
    if (hooks_.on_progress) hooks_.on_progress();
  }

  const rl::AlgorithmConfig& alg = config.algorithm;
  for (int64_t step = start_step + 1; step <= alg.steps; ++step) {
    const auto step_start = Clock::now();
    std::map<std::string, double> row;
    if (absl::Status s = check_cancelled(); !s.ok()) return s;
    set_phase("rl", step - 1, alg.steps, "rollout");

    // 1-2. Rollout: P prompts x G samples over the live workers.
    auto start = Clock::now();
    const std::vector<int64_t> indices = rl::prompt_indices(
        static_cast<int64_t>(task->train().size()), alg.seed, step, alg.prompts_per_step);
    std::vector<GenSample> samples;
    for (size_t p = 0; p < indices.size(); ++p) {
      const auto prompt =
          tokenizer.encode(task->train()[static_cast<size_t>(indices[p])].prompt, true);
      for (int64_t g = 0; g < alg.samples_per_prompt; ++g) {
        samples.push_back({absl::StrCat("s", step, "-p", p, "-g", g), prompt,
                           sample_seed(alg.seed, step, static_cast<int64_t>(p), g)});
      }
    }
    GenParams params;
    params.temperature = alg.temperature;
    params.top_p = alg.top_p;
    params.max_new_tokens = alg.max_new_tokens;
    params.stop_token_ids = {rl::kEosId};
    params.min_weight_version = *version;
    auto results = dispatch(absl::StrCat(job.id, "-s", step), samples, params);
    if (!results.ok()) return results.status();
    row["time_generate_seconds"] = seconds_since(start);
    row["redispatched_samples"] = static_cast<double>(dispatch_stats_.redispatched_samples);
    if (absl::Status s = check_cancelled(); !s.ok()) return s;

    // 3. Rewards and group advantages.
    start = Clock::now();
    std::vector<float> rewards(samples.size());
    double reward_sum = 0.0, correct = 0.0, length_sum = 0.0;
    for (size_t i = 0; i < samples.size(); ++i) {
      const GenResult& r = results->at(samples[i].sample_id);
      const rl::Example& ex = task->train()[static_cast<size_t>(
          indices[i / static_cast<size_t>(alg.samples_per_prompt)])];
      const std::string completion = tokenizer.decode(r.tokens);
      rewards[i] = static_cast<float>(task->reward(ex, completion));
      reward_sum += rewards[i];
      correct += task->correct(ex, completion) ? 1.0 : 0.0;
      length_sum += static_cast<double>(r.tokens.size());
    }
    absl::StatusOr<std::vector<float>> advantages =
        rl::group_advantages(rewards, alg.samples_per_prompt);
    if (!advantages.ok()) return advantages.status();
    const double n = static_cast<double>(samples.size());
    row["reward_mean"] = reward_sum / n;
    row["train_accuracy"] = correct / n;
    row["response_length_mean"] = length_sum / n;
    double var = 0.0;
    for (float r : rewards) var += (r - row["reward_mean"]) * (r - row["reward_mean"]);
    row["reward_std"] = std::sqrt(var / n);
    std::vector<TrainSequence> batch(samples.size());
    for (size_t i = 0; i < samples.size(); ++i) {
      GenResult& r = results->at(samples[i].sample_id);
      batch[i].tokens = samples[i].prompt_tokens;
      batch[i].prompt_length = static_cast<int64_t>(samples[i].prompt_tokens.size());
      batch[i].tokens.insert(batch[i].tokens.end(), r.tokens.begin(), r.tokens.end());
      batch[i].advantage = (*advantages)[i];
      batch[i].gen_logprobs = std::move(r.logprobs);
    }
    row["time_score_seconds"] = seconds_since(start);

    // 4-5. Train.
    set_phase("rl", step - 1, alg.steps, "train");
    start = Clock::now();
    absl::StatusOr<TrainStepStats> stats = trainer->train_step(job.id, step, batch, config);
    if (!stats.ok()) return trainer_error(stats.status(), absl::StrCat("train step ", step, ": "));
    for (const auto& [key, value] : stats->values) row[key] = value;
    row["time_train_seconds"] = seconds_since(start);
    if (metrics != nullptr) metrics->record_mismatch(stats->values);
    if (absl::Status s = check_cancelled(); !s.ok()) return s;

    // 6-7. Publish and wait until every live worker holds the new version.
    set_phase("rl", step - 1, alg.steps, "publish");
    start = Clock::now();
    version = publish(calibrate);
    if (!version.ok()) return version.status();
    row["weight_version"] = static_cast<double>(*version);
    row["time_publish_seconds"] = seconds_since(start);
    start = Clock::now();
    if (absl::Status s = wait_for_version(*version); !s.ok()) return s;
    row["time_sync_seconds"] = seconds_since(start);

    // 8. Validation and checkpoint at their cadence.
    const int64_t every = config.validation.every_steps;
    if ((every > 0 && step % every == 0) || step == alg.steps) {
      set_phase("rl", step - 1, alg.steps, "validate");
      start = Clock::now();
      absl::StatusOr<double> accuracy = validate(job.id, step, config, *version);
      if (!accuracy.ok()) return accuracy.status();
      row["val_accuracy"] = *accuracy;
      row["time_validate_seconds"] = seconds_since(start);
      if (metrics != nullptr) metrics->validation_accuracy->get().set(*accuracy);
    }
    if (config.checkpoint.every_steps > 0 && step % config.checkpoint.every_steps == 0) {
      set_phase("rl", step - 1, alg.steps, "checkpoint");
      start = Clock::now();
      const std::string path =
          (std::filesystem::path(config.checkpoint.dir) / job.id / absl::StrCat("step-", step))
              .string();
      if (absl::Status s = trainer->save_checkpoint(path); !s.ok()) {
        return trainer_error(s, absl::StrCat("checkpoint at step ", step, ": "));
      }
      if (absl::Status s = store->set_checkpoint(job.id, path, step); !s.ok()) return s;
      row["time_checkpoint_seconds"] = seconds_since(start);
    }
    row["time_step_seconds"] = seconds_since(step_start);
    if (absl::Status s = store->put_metrics(job.id, step, row); !s.ok()) return s;
    ++progress_;
    if (absl::Status s = store->set_step(job.id, step); !s.ok()) return s;
    if (metrics != nullptr) {
      metrics->step->get().set(static_cast<double>(step));
      metrics->reward_mean->get().set(row["reward_mean"]);
      metrics->steps->get().inc();
      metrics->samples->get().inc(n);
      metrics->record_phases(row);
    }
    service::log_info(kLog, "step done",
                      {{"job", job.id},
                       {"step", absl::StrCat(step)},
                       {"reward_mean", absl::StrCat(row["reward_mean"])},
                       {"seconds", absl::StrCat(row["time_step_seconds"])}});
    if (hooks_.on_progress) hooks_.on_progress();
  }
  return absl::OkStatus();
}

}  // namespace fp8rl::coordinator
