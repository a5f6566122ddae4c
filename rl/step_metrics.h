// The metrics rows of an RL job (docs/design/rl-step.md "The RL step"): row 0 describes the start
// (SFT warm start, first validation), row s >= 1 describes RL step s. The job store keeps each row
// as a flat {key: number} object and the REST and gRPC APIs serve it as is, so the key names
// are user-visible (dashboards, tools/fp8rl): to_row() below is the one place that spells them.
// Phase times are keyed time_<phase>_seconds, the phases of the coordinator's metrics.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace fp8rl::rl {

// A stored or served metrics row.
using MetricsValues = std::map<std::string, double>;

// Row 0, recorded once the first published version is validated (a job that resumes from a
// checkpoint does not record it again).
struct StartMetrics {
  struct Sft {
    double loss = 0.0;     // sft_loss: the last SFT step's loss
    double seconds = 0.0;  // time_sft_seconds: the whole warm start
  };
  std::optional<Sft> sft;  // only with an SFT warm start
  double val_accuracy = 0.0;
  double validate_seconds = 0.0;
  int64_t weight_version = 0;  // the first published version
};

// Row s >= 1: RL step s.
struct StepMetrics {
  // Steps 1-2, rollout.
  double generate_seconds = 0.0;
  int64_t redispatched_samples = 0;  // samples of failed or lost calls that were sent again
  // Step 3, scoring (rl/scoring.h).
  double reward_mean = 0.0;
  double reward_std = 0.0;
  double train_accuracy = 0.0;  // fraction of exactly right samples
  double response_length_mean = 0.0;
  double score_seconds = 0.0;
  // Steps 4-5, training: the trainer's statistics under the trainer's names (loss, grad_norm,
  // learning_rate, the mismatch metrics, trainer_<phase>_seconds, ...), stored as they come.
  MetricsValues trainer;
  double train_seconds = 0.0;
  // Steps 6-7, publish and sync.
  int64_t weight_version = 0;  // the version published after this step
  double publish_seconds = 0.0;
  double sync_seconds = 0.0;
  // Step 8, at their cadence.
  struct Validation {
    double accuracy = 0.0;  // val_accuracy
    double seconds = 0.0;   // time_validate_seconds
  };
  std::optional<Validation> validation;
  std::optional<double> checkpoint_seconds;
  // The whole step, wall clock.
  double step_seconds = 0.0;
  // Asynchronous RL only (algorithm.max_staleness = K >= 1; docs/design/rl-step.md "Asynchronous
  // RL"): absent from a synchronous job's rows.
  struct Async {
    int64_t max_staleness = 0;  // K
    // samples_staleness_<k>, k = 0..K: trained samples generated k versions before the trained
    // one; their sum is the batch size.
    std::map<int64_t, int64_t> staleness_histogram;
    int64_t staleness_max = 0;
    double staleness_mean = 0.0;
    int64_t regenerated_samples = 0;  // stale_regenerated_samples: older than K, generated again
    // trainer_idle_seconds: the loop waited for this step's rollout (and its regeneration).
    double trainer_idle_seconds = 0.0;
    // generation_idle_seconds: since the previous row, time the rollout producer waited for a
    // version (nothing it was allowed to generate).
    double generation_idle_seconds = 0.0;
  };
  std::optional<Async> async;
};

// The stored form. For a StepMetrics, the trainer's keys come first and the loop's own keys win
// over a trainer key of the same name.
MetricsValues to_row(const StartMetrics& metrics);
MetricsValues to_row(const StepMetrics& metrics);

}  // namespace fp8rl::rl
