// The training memory plan (see memory_plan.h for what each part counts).
#include "train/memory_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/params.h"

namespace fp8rl::train {
namespace {

constexpr int64_t kBlock = 128;     // FP8 weight blocks are 128x128
constexpr int64_t kLogitRows = 64;  // lm_head rows per chunk (model/model_forward.cc kHeadChunk)

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t format_bytes(Precision p) {
  switch (p) {
    case Precision::kFP8:
      return 1;
    case Precision::kBF16:
      return 2;
    default:
      return 4;
  }
}

std::string gib(int64_t bytes) {
  return absl::StrFormat("%.3f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

// Values per token a layer's training forward keeps (model::LayerActivations).
int64_t layer_values_per_token(const model::ModelConfig& c, bool sparse) {
  const int64_t h = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim();
  // x, h1, x2, h2; q, o; k, v; inv1, inv2
  int64_t n = 4 * h + 2 * qd + 2 * kvd + 2;
  if (c.qk_norm()) n += qd + kvd + c.num_attention_heads + c.num_key_value_heads;
  if (sparse) {
    n += c.moe.num_experts_per_tok * 3 * c.moe.moe_intermediate_size + c.moe.num_experts;
  } else {
    n += 3 * c.intermediate_size;  // g, u, act
  }
  return n;
}

}  // namespace

absl::StatusOr<MemoryPlan> plan_training_memory(const MemoryPlanInput& in) {
  const model::ModelConfig& c = in.config;
  if (c.num_hidden_layers < 1 || c.hidden_size < 1 || c.vocab_size < 1) {
    return absl::InvalidArgumentError("memory plan: the model config has no layers");
  }
  if (in.step_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan: step_tokens must be >= 0, got ", in.step_tokens));
  }
  if (in.kv_cache_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan: kv_cache_tokens must be >= 0, got ", in.kv_cache_tokens));
  }
  if (in.activation_value_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory plan: activation_value_bytes must be >= 1, got ", in.activation_value_bytes));
  }
  MemoryPlan plan;
  plan.input = in;
  const model::ParamLayout layout(c);
  const int64_t n = layout.total();
  plan.master = 4 * n;
  plan.moments = 8 * n;
  plan.grads = 4 * n;
  for (const model::ParamInfo& p : layout.params()) {
    switch (p.kind) {
      case model::ParamKind::kLinear: {
        const Precision f = in.policy.layer_linear(p.layer, c.num_hidden_layers);
        if (f == Precision::kFP8 && p.shape.size() == 2) {
          const int64_t blocks = ceil_div(p.shape[0], kBlock) * ceil_div(p.shape[1], kBlock);
          plan.weights += 2 * (p.numel + 4 * blocks);
        } else {
          plan.weights += format_bytes(f == Precision::kFP8 ? Precision::kBF16 : f) * p.numel;
        }
        break;
      }
      case model::ParamKind::kEmbedding:
      case model::ParamKind::kLmHead:
        plan.weights += (in.policy.linear == Precision::kF32 ? 4 : 2) * p.numel;
        break;
      default:
        plan.weights += 4 * p.numel;
    }
  }
  const int64_t h = c.hidden_size, t = in.step_tokens;
  int64_t per_token = 2 * h + 2;  // final norm: x, h, inv, lse
  int64_t dense_full = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const bool sparse = c.sparse_layer(l);
    const int64_t full = layer_values_per_token(c, sparse);
    if (in.recompute_layers && !sparse) {
      per_token += h;
      dense_full = std::max(dense_full, full);
    } else {
      per_token += full;
    }
  }
  per_token += dense_full;
  plan.activations = in.activation_value_bytes * (per_token * t + kLogitRows * c.vocab_size);
  plan.kv_cache =
      2 * c.num_hidden_layers * c.kv_dim() * in.kv_cache_tokens * format_bytes(in.policy.kv_cache);
  return plan;
}

std::string MemoryPlan::describe() const {
  return absl::StrCat("memory plan: weights ", gib(weights), ", master ", gib(master), ", moments ",
                      gib(moments), ", grads ", gib(grads), ", activations ", gib(activations),
                      ", kv cache ", gib(kv_cache), " = ", gib(total()), " (", input.step_tokens,
                      " step tokens, ", input.kv_cache_tokens, " cached tokens, recompute ",
                      input.recompute_layers ? "layers" : "none", ")");
}

absl::Status check_memory_plan(const MemoryPlan& plan, int64_t budget_bytes) {
  if (budget_bytes <= 0 || plan.total() <= budget_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      plan.describe(), " does not fit the device budget of ", gib(budget_bytes),
      " (--gpu-memory-fraction); lower --max-step-tokens, set --recompute layers, or raise "
      "--gpu-memory-fraction"));
}

}  // namespace fp8rl::train
