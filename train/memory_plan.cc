// The training memory plan (see memory_plan.h for what each part counts).
#include "train/memory_plan.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/train_step.h"
#include "model/params.h"
#include "train/gradient_buckets.h"

namespace fp8rl::train {
namespace {

constexpr int64_t kBlock = 128;     // FP8 weight blocks are 128x128
constexpr int64_t kLogitRows = 64;  // lm_head rows per chunk (engine TrainStepOptions::head_chunk)

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

// Working-copy bytes of `rows` rows of parameter p (every row of a 2-D tensor; a 1-D tensor is
// whole or nothing, rows > 0 meaning whole), by storage: an FP8 linear its codes and 128x128
// block scales twice (fprop and the transposed dgrad blocks); BF16 linears, the embedding and
// lm_head 2 B per value (4 with an fp32 policy); norms, biases and routers 4 B.
WeightBytes working_bytes(const model::ParamInfo& p, int64_t rows, const PrecisionPolicy& policy,
                          const model::ModelConfig& c) {
  WeightBytes w;
  if (p.shape.size() != 2) {
    if (rows > 0 || p.shape.empty()) w.fp32 = 4 * p.numel;
    return w;
  }
  const int64_t cols = p.shape[1], values = rows * cols;
  auto by_value = [&](int64_t value_bytes) {
    (value_bytes == 2 ? w.bf16 : w.fp32) += value_bytes * values;
  };
  switch (p.kind) {
    case model::ParamKind::kLinear: {
      const Precision f = policy.layer_linear(p.layer, c.num_hidden_layers);
      if (f == Precision::kFP8) {
        w.fp8 = 2 * (values + 4 * ceil_div(rows, kBlock) * ceil_div(cols, kBlock));
      } else {
        by_value(format_bytes(f));
      }
      break;
    }
    case model::ParamKind::kEmbedding:
    case model::ParamKind::kLmHead:
      by_value(policy.linear == Precision::kF32 ? 4 : 2);
      break;
    default:
      by_value(4);
  }
  return w;
}

// Working-copy bytes of the parameters in [begin, end) of the flat buffer (cut at tensor starts
// and 128-row boundaries: train/shard.h).
WeightBytes shard_working_bytes(const model::ParamLayout& layout, int64_t begin, int64_t end,
                                const PrecisionPolicy& policy, const model::ModelConfig& c) {
  WeightBytes bytes;
  for (const model::ParamInfo& p : layout.params()) {
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    const int64_t cols = p.shape.size() == 2 ? p.shape[1] : p.numel;
    bytes += working_bytes(p, p.shape.size() == 2 ? (hi - lo) / cols : 1, policy, c);
  }
  return bytes;
}

// The most bytes of bucket buffers the sharded gradient pool (train::GradientBuckets) holds at
// once during one backward, modelled on what the training backward (engine/train_step.cc
// train_backward) asks for and when it says gradients are final: the
// backward visits the units head (lm_head, then
// the final norm), decoder layers n-1 .. 0, then the embedding's token lookup; it asks for each
// of a unit's tensors while computing it and, after it, says every bucket starting at or after
// the unit's first parameter is final (after the embedding: everything). A bucket holds a buffer
// from the first unit that writes it until the unit after which it is final; a tied lm_head
// writes into the embedding's bucket, which is therefore held through the whole backward.
// Buffers of final buckets are reused by the next unit (the pool waits for one in flight rather
// than allocating), so the peak is the largest sum of bucket sizes held while one unit runs.
// Not counted: Gloo's receive buffer of a reduce-scatter call (ranks x at most one bucket).
int64_t gradient_pool_bytes(const model::ParamLayout& layout, const model::ModelConfig& c,
                            int64_t bucket_elements) {
  const std::vector<GradientBuckets::Bucket> buckets =
      GradientBuckets::cut(layout, bucket_elements);
  struct Unit {
    std::vector<std::pair<int64_t, int64_t>> ranges;  // parameter ranges it writes
    int64_t final_from = 0;                           // after it: buckets with first >= this
  };
  std::vector<Unit> units;  // in backward order
  const model::ParamInfo* head = nullptr;
  const model::ParamInfo* norm = nullptr;
  const model::ParamInfo* embed = nullptr;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> layers(
      static_cast<size_t>(c.num_hidden_layers));
  for (const model::ParamInfo& p : layout.params()) {
    if (p.layer >= 0) {
      layers[static_cast<size_t>(p.layer)].emplace_back(p.offset, p.offset + p.numel);
    } else if (p.kind == model::ParamKind::kEmbedding) {
      embed = &p;
    } else if (p.kind == model::ParamKind::kLmHead) {
      head = &p;
    } else {
      norm = &p;
    }
  }
  if (embed == nullptr || norm == nullptr) return 0;
  Unit u_head;
  const model::ParamInfo& lm = head != nullptr ? *head : *embed;  // tied: the embedding
  u_head.ranges = {{lm.offset, lm.offset + lm.numel}, {norm->offset, norm->offset + norm->numel}};
  u_head.final_from = norm->offset;
  units.push_back(u_head);
  for (auto l = static_cast<int64_t>(layers.size()) - 1; l >= 0; --l) {
    Unit u;
    u.ranges = layers[static_cast<size_t>(l)];
    u.final_from = u.ranges.empty() ? layout.total() : u.ranges.front().first;
    for (const auto& [b, e] : u.ranges) u.final_from = std::min(u.final_from, b);
    units.push_back(u);
  }
  units.push_back(Unit{{{embed->offset, embed->offset + embed->numel}}, 0});
  // Per bucket: the first unit writing it and the unit after which it is final. Buckets descend
  // (bucket 0 holds the last tensors).
  const int64_t n_units = std::ssize(units);
  std::vector<int64_t> first_use(buckets.size(), n_units), final_after(buckets.size(), n_units);
  for (int64_t u = 0; u < n_units; ++u) {
    for (const auto& [b, e] : units[static_cast<size_t>(u)].ranges) {
      // Buckets overlapping [b, e): from the first with first < e to the last with end > b.
      auto it =
          std::partition_point(buckets.begin(), buckets.end(),
                               [e](const GradientBuckets::Bucket& k) { return k.first >= e; });
      for (; it != buckets.end() && it->end > b; ++it) {
        int64_t& f = first_use[static_cast<size_t>(it - buckets.begin())];
        f = std::min(f, u);
      }
    }
  }
  std::vector<int64_t> held(static_cast<size_t>(n_units) + 1, 0);  // differences per unit
  for (size_t k = 0; k < buckets.size(); ++k) {
    for (int64_t u = 0; u < n_units; ++u) {
      if (buckets[k].first >= units[static_cast<size_t>(u)].final_from) {
        final_after[k] = u;
        break;
      }
    }
    if (first_use[k] > final_after[k]) continue;  // never written: sent as zeros at the end
    const int64_t size = buckets[k].end - buckets[k].first;
    held[static_cast<size_t>(first_use[k])] += size;
    held[static_cast<size_t>(final_after[k]) + 1] -= size;
  }
  int64_t peak = 0, now = 0;
  for (int64_t u = 0; u < n_units; ++u) {
    now += held[static_cast<size_t>(u)];
    peak = std::max(peak, now);
  }
  return 4 * peak;
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
  if (in.trainers < 1 || in.trainers > kMaxPlanTrainers) {
    return absl::InvalidArgumentError(absl::StrCat("memory plan: trainers must be in [1, ",
                                                   kMaxPlanTrainers, "], got ", in.trainers));
  }
  if (in.grad_bucket_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan: grad_bucket_bytes must be >= 0, got ", in.grad_bucket_bytes));
  }
  MemoryPlan plan;
  plan.input = in;
  const model::ParamLayout layout(c);
  const int64_t n = layout.total();
  plan.parameters = n;
  // Working-weight bytes per parameter tensor, and per unit a ZeRO-3 rank gathers at once
  // (decoder layer l at l + 1; 0: the embedding; layers + 1: final norm and lm_head).
  std::vector<int64_t> unit_bytes(static_cast<size_t>(c.num_hidden_layers) + 2, 0);
  WeightBytes whole_weights;
  for (const model::ParamInfo& p : layout.params()) {
    const WeightBytes w = working_bytes(p, p.shape.empty() ? 0 : p.shape[0], in.policy, c);
    const int64_t b = w.total();
    whole_weights += w;
    const size_t unit = p.layer >= 0                             ? static_cast<size_t>(p.layer) + 1
                        : p.kind == model::ParamKind::kEmbedding ? 0
                                                                 : unit_bytes.size() - 1;
    unit_bytes[unit] += b;
  }
  const bool sharded = in.shard != ShardMode::kNone && in.trainers > 1;
  absl::StatusOr<ShardLayout> shards = shard_parameters(layout, sharded ? in.trainers : 1);
  if (!shards.ok()) return shards.status();
  // The sharded gradients besides the shard: the bucket pool, or the whole array without buckets.
  const int64_t pool = !sharded ? 0
                       : in.grad_bucket_bytes > 0
                           ? gradient_pool_bytes(layout, c, ceil_div(in.grad_bucket_bytes, 4))
                           : 4 * n;
  // Per rank r: the parts that depend on its shard; the plan keeps the rank with the largest
  // total (the others differ only in these parts).
  int64_t best = -1;
  for (int r = 0; r < shards->ranks(); ++r) {
    const int64_t s = shards->size(r);
    WeightBytes weights = whole_weights;
    int64_t gathered = 0, grads = 4 * s;
    if (sharded) grads += pool;
    if (sharded && in.shard == ShardMode::kParams) {
      weights = shard_working_bytes(layout, shards->begin(r), shards->end(r), in.policy, c);
      std::vector<int64_t> sorted = unit_bytes;
      std::sort(sorted.rbegin(), sorted.rend());
      gathered = sorted[0] + (sorted.size() > 1 ? sorted[1] : 0);
    }
    const int64_t sum = weights.total() + gathered + 12 * s + grads;
    if (sum > best) {
      best = sum;
      plan.rank = r;
      plan.shard_parameters = s;
      plan.weights = weights.total();
      plan.weight_parts = weights;
      plan.gathered = gathered;
      plan.master = 4 * s;
      plan.moments = 8 * s;
      plan.grads = grads;
    }
  }
  // Exactly what the training step carves for step_tokens rows (engine/train_step.h: padded
  // rows, every saved activation, the backward's scratch and one lm_head logits chunk), plus
  // what the ops keep beside it for each sparse layer (an estimate: top_k x 3 x
  // moe_intermediate expert values and the E router probabilities per token).
  const int64_t t = in.step_tokens;
  engine::TrainStepOptions step;
  step.recompute_layers = in.recompute_layers;
  step.head_chunk = kLogitRows;
  int64_t values = engine::train_buffer_floats(c, t, step);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.sparse_layer(l)) continue;
    values += t * (c.moe.num_experts_per_tok * 3 * c.moe.moe_intermediate_size + c.moe.num_experts);
  }
  plan.activations = in.activation_value_bytes * values;
  plan.kv_cache =
      2 * c.num_hidden_layers * c.kv_dim() * in.kv_cache_tokens * format_bytes(in.policy.kv_cache);
  return plan;
}

std::string MemoryPlan::describe() const {
  std::string out = absl::StrCat("memory plan: weights ", gib(weights));
  if (gathered > 0) absl::StrAppend(&out, ", gathered weights ", gib(gathered));
  absl::StrAppend(&out, ", master ", gib(master), ", moments ", gib(moments), ", grads ",
                  gib(grads), ", activations ", gib(activations), ", kv cache ", gib(kv_cache),
                  " = ", gib(total()), " (", input.step_tokens, " step tokens, ",
                  input.kv_cache_tokens, " cached tokens, recompute ",
                  input.recompute_layers ? "layers" : "none", ")");
  if (input.trainers > 1) {
    absl::StrAppend(&out, ", per rank: rank ", rank, " of ", input.trainers, ", shard ",
                    std::string(shard_mode_name(input.shard)), ", ", shard_parameters, " of ",
                    parameters, " parameters");
  }
  return out;
}

namespace {

// One way to change a plan's input, and the total it would need.
struct Change {
  std::string what;  // "shard grads_optimizer + recompute layers"
  int changes = 0;
  int64_t total = 0;
};

std::string describe_change(const MemoryPlanInput& from, const MemoryPlanInput& to) {
  std::vector<std::string> parts;
  if (to.shard != from.shard)
    parts.push_back(absl::StrCat("shard ", std::string(shard_mode_name(to.shard))));
  if (to.trainers != from.trainers) parts.push_back(absl::StrCat(to.trainers, " trainers"));
  if (to.recompute_layers != from.recompute_layers) parts.push_back("recompute layers");
  if (to.step_tokens != from.step_tokens) {
    parts.push_back(absl::StrCat(to.step_tokens, " step tokens"));
  }
  return absl::StrJoin(parts, " + ");
}

int count_changes(const MemoryPlanInput& from, const MemoryPlanInput& to) {
  return (to.shard != from.shard) + (to.trainers != from.trainers) +
         (to.recompute_layers != from.recompute_layers) + (to.step_tokens != from.step_tokens);
}

// The total of `in`'s plan, or -1 when it cannot be planned.
int64_t total_of(const MemoryPlanInput& in) {
  absl::StatusOr<MemoryPlan> p = plan_training_memory(in);
  return p.ok() ? p->total() : -1;
}

bool fits(int64_t total, int64_t budget) { return total >= 0 && total <= budget; }

// Changes that make `in` fit `budget`: recompute and shard modes (with the smallest group that
// fits when a shard mode alone does not), then fewer step tokens (halving) alone.
std::vector<Change> fitting_changes(const MemoryPlanInput& in, int64_t budget) {
  std::vector<Change> out;
  auto consider = [&](const MemoryPlanInput& to) {
    const int64_t t = total_of(to);
    if (!fits(t, budget)) return false;
    out.push_back({describe_change(in, to), count_changes(in, to), t});
    return true;
  };
  for (bool recompute : {in.recompute_layers, true}) {
    for (ShardMode mode : {in.shard, ShardMode::kGradsOptimizer, ShardMode::kParams}) {
      MemoryPlanInput to = in;
      to.recompute_layers = recompute;
      to.shard = mode;
      if (count_changes(in, to) == 0 || (mode != in.shard && mode == ShardMode::kGradsOptimizer &&
                                         in.shard == ShardMode::kParams)) {
        continue;  // nothing changed, or a step back from params
      }
      if (consider(to) || to.shard == ShardMode::kNone) continue;
      for (int n = in.trainers + 1; n <= kMaxPlanTrainers; ++n) {
        to.trainers = n;
        if (consider(to)) break;
      }
    }
  }
  for (int64_t t = in.step_tokens / 2; t >= 1; t /= 2) {
    MemoryPlanInput to = in;
    to.step_tokens = t;
    to.kv_cache_tokens = std::min(in.kv_cache_tokens, t);
    if (consider(to)) break;
  }
  std::sort(out.begin(), out.end(), [](const Change& a, const Change& b) {
    return a.changes != b.changes ? a.changes < b.changes : a.total < b.total;
  });
  std::vector<Change> unique;
  for (Change& c : out) {
    if (std::none_of(unique.begin(), unique.end(),
                     [&](const Change& u) { return u.what == c.what; })) {
      unique.push_back(std::move(c));
    }
  }
  return unique;
}

}  // namespace

std::string memory_verdict(const MemoryPlan& plan, int64_t budget_bytes) {
  if (budget_bytes <= 0) return "no budget";
  if (plan.total() <= budget_bytes) {
    return absl::StrCat("fits: ", gib(plan.total()), " of ", gib(budget_bytes));
  }
  std::string out =
      absl::StrCat("does not fit: ", gib(plan.total()), " > ", gib(budget_bytes), "; ");
  const std::vector<Change> changes = fitting_changes(plan.input, budget_bytes);
  if (changes.empty()) {
    absl::StrAppend(&out, "no change tried fits (recompute, sharding, up to ", kMaxPlanTrainers,
                    " trainers, fewer step tokens)");
  } else {
    absl::StrAppend(&out, "would fit with: ");
    for (size_t i = 0; i < changes.size() && i < 3; ++i) {
      absl::StrAppend(&out, i > 0 ? "; " : "", changes[i].what, " (", gib(changes[i].total), ")");
    }
  }
  absl::StrAppend(&out, "; or a larger budget (--gpu-memory-fraction, a larger device)");
  return out;
}

absl::Status check_memory_plan(const MemoryPlan& plan, int64_t budget_bytes) {
  if (budget_bytes <= 0 || plan.total() <= budget_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(plan.describe(), ": ", memory_verdict(plan, budget_bytes)));
}

}  // namespace fp8rl::train
