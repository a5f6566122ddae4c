// The RL loop's asynchronous mode (algorithm.max_staleness = K >= 1, docs/design/rl-step.md
// "Asynchronous RL"): the same phases as RlLoop::run's synchronous steps, but the rollouts come
// from a RolloutQueue whose producer generates up to K steps ahead, the staleness rule
// (rl/staleness.h) is applied to each taken rollout, and a publish does not wait for the workers
// (the producer waits for the version it needs, validation for the one it validates).
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/service/log.h"
#include "rl/staleness.h"
#include "services/coordinator/async_rollouts.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/rl_loop.h"

namespace fp8rl::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kLog[] = "rl_loop";

}  // namespace

absl::Status RlLoop::run_async(JobRun& run) {
  const rl::AlgorithmConfig& alg = run.config.algorithm;
  RolloutQueue::Options options;
  options.first_step = run.start_step + 1;
  options.last_step = alg.steps;
  options.max_staleness = alg.max_staleness;
  options.first_version = run.version;
  options.poll_interval = options_.poll_interval;
  service::log_info(kLog, "asynchronous RL",
                    {{"job", run.job.id},
                     {"max_staleness", absl::StrCat(alg.max_staleness)},
                     {"first_step", absl::StrCat(options.first_step)},
                     {"first_version", absl::StrCat(run.version)}});
  stop_generation_ = false;
  auto queue =
      std::make_unique<RolloutQueue>(options, [this, &run](int64_t step, int64_t min_version) {
        return produce_rollout(run, step, min_version);
      });
  queue->start();
  const absl::Status status = run_async_steps(run, *queue);
  // Whatever ended the steps, the producer stops: its dispatch or version wait sees
  // check_cancelled() fail, its worker calls are abandoned (dispatch() never waits for them),
  // and the rollouts it made ahead are dropped (a resumed job generates them again).
  stop_generation_ = true;
  queue.reset();
  stop_generation_ = false;
  return status;
}

absl::StatusOr<RlLoop::Rollout> RlLoop::produce_rollout(const JobRun& run, int64_t step,
                                                        int64_t min_version) {
  if (absl::Status s = wait_for_version(min_version); !s.ok()) return s;
  return generate_rollout(run, step, min_version);
}

absl::Status RlLoop::run_async_steps(JobRun& run, RolloutQueue& queue) {
  const rl::JobConfig& config = run.config;
  const int64_t steps = config.algorithm.steps;
  for (int64_t step = run.start_step + 1; step <= steps; ++step) {
    const auto step_start = Clock::now();
    rl::StepMetrics row;
    // Not async.emplace(): clang 14 (the sanitizer builds) rejects default-constructing a nested
    // struct with member initializers inside std::optional.
    row.async = rl::StepMetrics::Async{};
    if (absl::Status s = check_cancelled(); !s.ok()) return s;
    // Steps 1-2: the rollout the producer made ahead (or is finishing), within the bound.
    set_phase("rl", step - 1, steps, "rollout");
    absl::StatusOr<Rollout> rollout = queue.take(step, [this] { return check_cancelled(); });
    if (!rollout.ok()) return rollout.status();
    row.generate_seconds = rollout->generate_seconds;
    row.redispatched_samples = rollout->redispatched_samples;
    if (absl::Status s = enforce_staleness(run, *rollout, row); !s.ok()) return s;
    row.async->trainer_idle_seconds = seconds_since(step_start);
    row.async->generation_idle_seconds = queue.take_generation_idle_seconds();
    if (absl::Status s = check_cancelled(); !s.ok()) return s;
    // Step 3: score.
    absl::StatusOr<std::vector<TrainSequence>> batch = score(run, *std::move(rollout), row);
    if (!batch.ok()) return batch.status();
    // Steps 4-5: train, against the behaviour version's gen_logprobs (the IS weight sees the
    // staleness).
    if (absl::Status s = train(run, step, *batch, row); !s.ok()) return s;
    if (absl::Status s = check_cancelled(); !s.ok()) return s;
    // Step 6: publish; the producer may now start the rollout of step + 1 + K.
    set_phase("rl", step - 1, steps, "publish");
    auto start = Clock::now();
    if (absl::StatusOr<int64_t> version = publish(run); !version.ok()) return version.status();
    row.weight_version = run.version;
    row.publish_seconds = seconds_since(start);
    queue.published(step, run.version);
    // Step 7: only validation waits for the workers to hold the new version.
    if (validates_at(config, step)) {
      start = Clock::now();
      if (absl::Status s = wait_for_version(run.version); !s.ok()) return s;
      row.sync_seconds = seconds_since(start);
    }
    // Step 8: validate and checkpoint, then the step's metrics row.
    if (absl::Status s = validate_and_checkpoint(run, step, row); !s.ok()) return s;
    row.step_seconds = seconds_since(step_start);
    if (absl::Status s = record_step(run, step, row); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RlLoop::enforce_staleness(const JobRun& run, Rollout& rollout, rl::StepMetrics& row) {
  const int64_t max_staleness = run.config.algorithm.max_staleness;
  auto versions_of = [&rollout] {
    std::vector<int64_t> versions;
    versions.reserve(rollout.samples.size());
    for (const GenSample& s : rollout.samples) {
      versions.push_back(rollout.results.at(s.sample_id).weight_version);
    }
    return versions;
  };
  absl::StatusOr<rl::StalenessVerdict> verdict =
      rl::apply_staleness_bound(versions_of(), run.version, max_staleness);
  if (!verdict.ok()) return verdict.status();
  int64_t regenerated = 0;
  if (!verdict->regenerate.empty()) {
    // Older than the bound: generated again (same ids and seeds) by workers holding the
    // trained version; the trainer waits for them.
    std::vector<GenSample> again;
    for (size_t i : verdict->regenerate) again.push_back(rollout.samples[i]);
    service::log_warn(kLog, "regenerating samples older than max_staleness",
                      {{"job", run.job.id},
                       {"step", absl::StrCat(rollout.step)},
                       {"samples", absl::StrCat(again.size())},
                       {"trained_version", absl::StrCat(run.version)}});
    if (absl::Status s = wait_for_version(run.version); !s.ok()) return s;
    DispatchStats stats;
    absl::StatusOr<std::map<std::string, GenResult>> results =
        dispatch_counted(absl::StrCat(run.job.id, "-s", rollout.step, "-regen"), again,
                         rollout_params(run, run.version), &stats);
    if (!results.ok()) return results.status();
    for (auto& [id, result] : *results) rollout.results[id] = std::move(result);
    row.redispatched_samples += stats.redispatched_samples;
    regenerated = static_cast<int64_t>(again.size());
    verdict = rl::apply_staleness_bound(versions_of(), run.version, max_staleness);
    if (!verdict.ok()) return verdict.status();
    if (!verdict->regenerate.empty()) {
      return absl::InternalError(absl::StrCat("step ", rollout.step, ": ",
                                              verdict->regenerate.size(),
                                              " regenerated samples are still too stale"));
    }
  }
  rl::StepMetrics::Async& async = *row.async;
  async.max_staleness = max_staleness;
  async.staleness_histogram = verdict->histogram;
  async.staleness_max = verdict->max_used;
  async.regenerated_samples = regenerated;
  double sum = 0.0;
  for (const auto& [staleness, n] : verdict->histogram) {
    sum += static_cast<double>(staleness * n);
  }
  async.staleness_mean =
      rollout.samples.empty() ? 0.0 : sum / static_cast<double>(rollout.samples.size());
  if (hooks_.metrics != nullptr) hooks_.metrics->record_staleness(async);
  return absl::OkStatus();
}

}  // namespace fp8rl::coordinator
