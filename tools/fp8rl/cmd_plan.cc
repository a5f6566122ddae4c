// `fp8rl plan`: the per-rank training memory of a model config in a trainer group of N ranks
// with a shard mode (train/memory_plan.h, docs/design/sharding.md), and whether it fits a device,
// before anything is started. The verdict line is the text a trainer refuses a policy with. Exit
// status: 0 fits, 3 does not fit, 2 bad flags, 1 an unreadable or unsupported config.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fs.h"
#include "model/config.h"
#include "model/device.h"
#include "tools/fp8rl/args.h"
#include "tools/fp8rl/command.h"
#include "train/memory_plan.h"
#include "train/shard.h"

namespace fp8rl::cli {
namespace {

constexpr char kName[] = "plan";
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(int64_t bytes) {
  return absl::StrFormat("%10.3f GiB", static_cast<double>(bytes) / kGiB);
}

void print_row(const char* what, int64_t bytes) {
  std::printf("  %-44s %s\n", what, gib(bytes).c_str());
}

}  // namespace

int plan_main(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.value_flags = {"model",       "trainers", "shard", "gpu-memory", "gpu-memory-fraction",
                      "step-tokens", "training"};
  spec.bool_flags = {"recompute"};
  auto args = Args::Parse(argv, spec);
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  auto model_path = args->required("model");
  if (!model_path.ok()) return usage_error(kName, std::string(model_path.status().message()));
  auto trainers = args->get_int("trainers", 1);
  if (!trainers.ok()) return usage_error(kName, std::string(trainers.status().message()));
  if (*trainers < 1 || *trainers > train::kMaxPlanTrainers) {
    return usage_error(kName, absl::StrCat("--trainers: must be in [1, ", train::kMaxPlanTrainers,
                                           "], got ", *trainers));
  }
  auto shard = train::parse_shard_mode(args->get("shard").value_or("none"), "--shard");
  if (!shard.ok()) return usage_error(kName, std::string(shard.status().message()));
  auto gpu_memory = args->required("gpu-memory");
  if (!gpu_memory.ok()) return usage_error(kName, std::string(gpu_memory.status().message()));
  auto gib_total = args->get_double("gpu-memory", 0);
  if (!gib_total.ok()) return usage_error(kName, std::string(gib_total.status().message()));
  if (!(*gib_total > 0) || !std::isfinite(*gib_total) || *gib_total > 1e6) {
    return usage_error(kName, absl::StrCat("--gpu-memory: must be a size in GiB in (0, 1e6], got '",
                                           *gpu_memory, "'"));
  }
  auto fraction =
      model::parse_gpu_memory_fraction(args->get("gpu-memory-fraction").value_or("0.9"));
  if (!fraction.ok()) return usage_error(kName, std::string(fraction.status().message()));
  auto step_tokens = args->get_int("step-tokens", 16384);
  if (!step_tokens.ok()) return usage_error(kName, std::string(step_tokens.status().message()));
  if (*step_tokens < 1 || *step_tokens > (int64_t{1} << 30)) {
    return usage_error(kName,
                       absl::StrCat("--step-tokens: must be in [1, 2^30], got ", *step_tokens));
  }
  const std::string training = args->get("training").value_or("fp8");
  if (training != "fp8" && training != "bf16") {
    return usage_error(kName,
                       absl::StrCat("--training: must be fp8 or bf16, got '", training, "'"));
  }

  auto text = read_text_file(*model_path);
  if (!text.ok()) return failure(kName, std::string(text.status().message()));
  auto config = model::parse_model_config(*text);
  if (!config.ok()) {
    return failure(kName, absl::StrCat(*model_path, ": ", config.status().message()));
  }
  PrecisionConfig precision;  // the job default: fp8 linears and KV cache, no bf16 edge layers
  if (training == "bf16") precision.training = Precision::kBF16;
  train::MemoryPlanInput in;
  in.config = *config;
  in.policy = precision.training_policy();
  in.step_tokens = *step_tokens;
  in.kv_cache_tokens = *step_tokens;  // as the trainer's plan (TrainPlacement::kv_cache_tokens)
  in.recompute_layers = args->has("recompute");
  in.trainers = static_cast<int>(*trainers);
  in.shard = *shard;
  auto plan = train::plan_training_memory(in);
  if (!plan.ok()) return failure(kName, std::string(plan.status().message()));
  const auto budget = static_cast<int64_t>(std::floor(*fraction * *gib_total * kGiB));

  std::printf("model %s: %s, %ld parameters, %s training\n", model_path->c_str(),
              config->model_type.c_str(), static_cast<long>(plan->parameters), training.c_str());
  std::printf("group: %ld trainer(s), shard %s, %ld step tokens, recompute %s\n",
              static_cast<long>(*trainers), std::string(train::shard_mode_name(*shard)).c_str(),
              static_cast<long>(*step_tokens), in.recompute_layers ? "layers" : "none");
  std::printf("per rank (rank %d, %ld of %ld parameters in its shard):\n", plan->rank,
              static_cast<long>(plan->shard_parameters), static_cast<long>(plan->parameters));
  print_row("FP8 working weights (codes x2: fprop + dgrad)", plan->weight_parts.fp8);
  print_row("bf16 embedding / lm_head (and bf16 linears)", plan->weight_parts.bf16);
  print_row("fp32 norms / biases / routers", plan->weight_parts.fp32);
  if (plan->gathered > 0) print_row("gathered weights (2 units, ZeRO-3)", plan->gathered);
  print_row("fp32 master", plan->master);
  print_row("AdamW moments (m, v fp32)", plan->moments);
  print_row("fp32 grads (+ bucket pool when sharded)", plan->grads);
  print_row("activations (training step buffers, fp32)", plan->activations);
  print_row("kv cache (step tokens)", plan->kv_cache);
  print_row("total", plan->total());
  std::printf("budget: %.3f GiB (%.2f x %g GiB)\n", static_cast<double>(budget) / kGiB, *fraction,
              *gib_total);
  std::printf("%s\n", train::memory_verdict(*plan, budget).c_str());
  return plan->total() <= budget ? 0 : 3;
}

}  // namespace fp8rl::cli
