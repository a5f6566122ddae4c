// Range checks of kJobNumericLimits (see job_limits.h).
#include "rl/job_limits.h"

#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace fp8rl::rl {
namespace {

// The value of a field of kJobNumericLimits; nullopt for an absent optional section (sft).
std::optional<double> field_value(const JobConfig& c, std::string_view field) {
  const AlgorithmConfig& a = c.algorithm;
  if (field == "algorithm.steps") return a.steps;
  if (field == "algorithm.prompts_per_step") return a.prompts_per_step;
  if (field == "algorithm.samples_per_prompt") return a.samples_per_prompt;
  if (field == "algorithm.temperature") return a.temperature;
  if (field == "algorithm.learning_rate") return a.learning_rate;
  if (field == "algorithm.warmup_steps") return a.warmup_steps;
  if (field == "algorithm.weight_decay") return a.weight_decay;
  if (field == "algorithm.max_grad_norm") return a.max_grad_norm;
  if (field == "algorithm.kl_beta") return a.kl_beta;
  if (field == "algorithm.adam_epsilon") return a.adam_epsilon;
  if (field == "precision.bf16_first_layers") return c.precision.bf16_first_layers;
  if (field == "precision.bf16_last_layers") return c.precision.bf16_last_layers;
  if (field == "validation.every_steps") return c.validation.every_steps;
  if (field == "validation.num_prompts") return c.validation.num_prompts;
  if (field == "checkpoint.every_steps") return c.checkpoint.every_steps;
  if (!c.sft.has_value()) return std::nullopt;
  if (field == "sft.steps") return c.sft->steps;
  if (field == "sft.learning_rate") return c.sft->learning_rate;
  if (field == "sft.batch_size") return c.sft->batch_size;
  return std::nullopt;
}

}  // namespace

absl::Status validate_job_limits(const JobConfig& config) {
  for (const NumericLimit& limit : kJobNumericLimits) {
    const std::optional<double> value = field_value(config, limit.field);
    if (!value.has_value()) continue;
    const bool above_lo = limit.lo_open ? *value > limit.lo : *value >= limit.lo;
    if (!(above_lo && *value <= limit.hi)) {  // false for NaN too
      return absl::InvalidArgumentError(absl::StrCat(limit.field, ": must be in ",
                                                     limit.lo_open ? "(" : "[", limit.lo, ", ",
                                                     limit.hi, "], got ", *value));
    }
  }
  return absl::OkStatus();
}

}  // namespace fp8rl::rl
