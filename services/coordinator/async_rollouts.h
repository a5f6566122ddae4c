// The rollout producer of asynchronous RL (docs/design/rl-step.md "Asynchronous RL"): one thread
// generates the rollouts of the next steps, in step order, while the RL loop trains, and hands
// them over through a bounded ready queue. Back-pressure is the staleness gate
// (rl/staleness.h): the rollout of step s starts only once the version published after step
// s-1-K exists, so at most K rollouts are ready or in flight beyond the step being trained.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/coordinator/rl_loop.h"

namespace fp8rl::coordinator {

class RolloutQueue {
 public:
  // Generates the rollout of `step` with workers holding at least `min_version` (blocking; may
  // fail). Runs on the producer thread.
  using Produce = std::function<absl::StatusOr<StepRollout>(int64_t step, int64_t min_version)>;

  struct Options {
    int64_t first_step = 1;     // the first step to generate
    int64_t last_step = 1;      // the last step to generate
    int64_t max_staleness = 1;  // K >= 1
    // The version published before first_step (the run's first version).
    int64_t first_version = 0;
    // How often take() re-checks cancellation while it waits.
    std::chrono::milliseconds poll_interval{50};
  };

  RolloutQueue(Options options, Produce produce);
  // Stops the producer and joins it: the running Produce call must return (the caller makes it
  // see a stop, e.g. through its cancellation check).
  ~RolloutQueue();
  RolloutQueue(const RolloutQueue&) = delete;
  RolloutQueue& operator=(const RolloutQueue&) = delete;

  // Starts the producer thread.
  void start();
  // The loop trained step `step` and published `version`: rollouts up to step + 1 + K may start.
  void published(int64_t step, int64_t version);
  // Waits for the rollout of `step` (the next in order). Fails with the producer's error, or
  // with `check_cancelled`'s (asked every poll_interval), never waits forever.
  absl::StatusOr<StepRollout> take(int64_t step,
                                   const std::function<absl::Status()>& check_cancelled);
  // Seconds the producer waited at the gate since the last call (0 at first).
  double take_generation_idle_seconds();
  // Ready rollouts now (<= K).
  size_t ready_size();

 private:
  void run();
  // The version the rollout of `step` must be generated with, at least; nullopt while that
  // version is not published yet. Caller holds mu_.
  std::optional<int64_t> gate_version_locked(int64_t step) const;

  const Options options_;
  const Produce produce_;
  std::mutex mu_;
  // Signalled (under mu_) on published(), on a ready rollout, on the producer's end and on stop.
  std::condition_variable cv_;
  std::map<int64_t, int64_t> published_;  // guarded by mu_: step -> version published after it
  std::deque<StepRollout> ready_;         // guarded by mu_: in step order
  absl::Status error_;                    // guarded by mu_: the producer's failure
  bool producer_done_ = false;            // guarded by mu_
  bool stopping_ = false;                 // guarded by mu_
  double idle_seconds_ = 0.0;             // guarded by mu_: gate waits not yet taken
  std::thread thread_;
};

}  // namespace fp8rl::coordinator
