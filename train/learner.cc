// The learner's updates and export (see learner.h for the contract).
#include "train/learner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/status_macros.h"
#include "common/status_prefix.h"
#include "engine/cpu/train_ops.h"
#include "model/kv_calibration.h"
#include "train/checkpoint.h"
#include "train/data_parallel.h"
#include "train/unit_gather.h"

namespace fp8rl::train {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<std::string> model_config_text(const std::string& value) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(value);
  if (trimmed.empty()) {
    return absl::InvalidArgumentError("model.init.model_config_json: required");
  }
  if (trimmed.front() == '{') return std::string(trimmed);
  // Not JSON text: a path to a config.json (the coordinator forwards job configs' paths).
  absl::StatusOr<std::string> text = read_text_file(std::string(trimmed));
  if (!text.ok()) return with_prefix(text.status(), "model.init.model_config_json: ");
  return text;
}

ScaleStats stats_of(std::span<const float> values) {
  ScaleStats s;
  if (values.empty()) return s;
  s.min = std::numeric_limits<double>::infinity();
  s.max = -s.min;
  double sum = 0;
  for (float v : values) {
    s.min = std::min<double>(s.min, v);
    s.max = std::max<double>(s.max, v);
    sum += v;
  }
  s.count = static_cast<int64_t>(values.size());
  s.mean = sum / static_cast<double>(s.count);
  return s;
}

// A call one rank of a ZeRO-3 group cannot serve alone: its forward gathers every unit from the
// other ranks, which do not take part.
absl::Status params_refusal(std::string_view call) {
  return absl::FailedPreconditionError(
      absl::StrCat(std::string(call),
                   ": under trainer.shard params the policy's working weights are spread "
                   "over the group's ranks; its forward runs only inside an update or an "
                   "export, which every rank runs"));
}

bool stopped(const std::atomic<bool>* stop) { return stop != nullptr && stop->load(); }

// Valid (loss) tokens of sequences [begin, end) of `batch`.
int64_t valid_tokens(const PackedBatch& batch, int64_t begin, int64_t end) {
  int64_t n = 0;
  for (int64_t i = begin * batch.length; i < end * batch.length; ++i) n += batch.mask[i];
  return n;
}

// Copies the [rows x L] `part` into rows [begin, end) of the [B*L] `full`.
void put_rows(std::span<const float> part, int64_t begin, int64_t L, std::vector<float>* full) {
  std::copy(part.begin(), part.end(), full->begin() + begin * L);
}

// The loss statistics of one minibatch summed over the group: loss and policy loss are already
// normalized by the whole minibatch's tokens (so they add up), kl and the clip fraction are
// per-rank means (weighted by tokens), the PPO ratio range is a min / max over ranks that had
// tokens. `stats` becomes the whole minibatch's.
absl::Status reduce_loss_stats(Collectives& group, rl::PolicyLossResult* result) {
  rl::PolicyLossStats& s = result->stats;
  const double valid = static_cast<double>(s.valid_tokens);
  std::vector<double> sums = {result->loss, s.policy_loss, s.kl * valid, s.clip_fraction * valid,
                              valid};
  if (absl::Status st =
          group.all_reduce(std::span<double>(sums), ReduceOp::kSum, "loss statistics all-reduce");
      !st.ok()) {
    return st;
  }
  const bool has = s.valid_tokens > 0;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> hi = {has ? s.probs_ratio_max : -inf, has ? -s.probs_ratio_min : -inf};
  if (absl::Status st =
          group.all_reduce(std::span<double>(hi), ReduceOp::kMax, "PPO ratio range all-reduce");
      !st.ok()) {
    return st;
  }
  result->loss = sums[0];
  s.loss = sums[0];
  s.policy_loss = sums[1];
  s.valid_tokens = static_cast<int64_t>(sums[4]);
  s.kl = sums[4] > 0 ? sums[2] / sums[4] : 0.0;
  s.clip_fraction = sums[4] > 0 ? sums[3] / sums[4] : 0.0;
  s.probs_ratio_max = sums[4] > 0 ? hi[0] : 1.0;
  s.probs_ratio_min = sums[4] > 0 ? -hi[1] : 1.0;
  return absl::OkStatus();
}

}  // namespace

absl::Status validate_precision(const PrecisionConfig& p, std::string_view where) {
  for (const auto& [name, format] :
       {std::pair{"training", p.training}, std::pair{"generation", p.generation},
        std::pair{"kv_cache", p.kv_cache}}) {
    if (format != Precision::kFP8 && format != Precision::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(where), ".", name, ": ",
                                                     std::string(precision_name(format)),
                                                     " is not supported (expected fp8 or bf16)"));
    }
  }
  if (p.bf16_first_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(where), ".bf16_first_layers: must be >= 0, got ", p.bf16_first_layers));
  }
  if (p.bf16_last_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(where), ".bf16_last_layers: must be >= 0, got ", p.bf16_last_layers));
  }
  return absl::OkStatus();
}

absl::StatusOr<InitialShard> initial_shard(const model::ParamLayout& layout,
                                           const TrainPlacement& placement) {
  if (placement.trainers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainers: must be >= 1, got ", placement.trainers));
  }
  if (placement.rank < 0 || placement.rank >= placement.trainers) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: must be in [0, ", placement.trainers, "), got ", placement.rank));
  }
  if (placement.device == model::Device::kCpu || placement.trainers == 1 ||
      placement.shard == ShardMode::kNone) {
    return InitialShard{};
  }
  absl::StatusOr<ShardLayout> cut = shard_parameters(layout, placement.trainers);
  if (!cut.ok()) return cut.status();
  return InitialShard{cut->begin(placement.rank), cut->end(placement.rank)};
}

absl::StatusOr<MemoryPlan> plan_for(const model::ModelConfig& config,
                                    const PrecisionConfig& precision,
                                    const TrainPlacement& placement) {
  if (placement.max_step_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_step_tokens: must be >= 1, got ", placement.max_step_tokens));
  }
  MemoryPlanInput in;
  in.config = config;
  in.policy = precision.training_policy();
  in.step_tokens = placement.max_step_tokens;
  in.kv_cache_tokens =
      placement.kv_cache_tokens > 0 ? placement.kv_cache_tokens : placement.max_step_tokens;
  in.recompute_layers = placement.recompute == Recompute::kLayers;
  in.trainers = placement.trainers;
  in.shard = placement.shard;
  absl::StatusOr<MemoryPlan> plan = plan_training_memory(in);
  if (!plan.ok()) return plan.status();
  if (auto s = check_memory_plan(*plan, placement.memory_budget_bytes); !s.ok()) return s;
  return plan;
}

absl::StatusOr<std::unique_ptr<Learner>> Learner::create(const InitRequest& request) {
  if (request.job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  if (auto s = validate_precision(request.precision, "precision"); !s.ok()) return s;
  if (auto s = model::validate_adamw_config(request.adamw); !s.ok()) {
    return with_prefix(s, "optimizer.");
  }
  const PrecisionPolicy policy = request.precision.training_policy();

  std::unique_ptr<model::Model> model;
  int64_t version = 0;
  if (!request.checkpoint_dir.empty()) {
    const std::string& dir = request.checkpoint_dir;
    absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Load(dir, policy);
    if (!m.ok()) return with_prefix(m.status(), "model.checkpoint_dir: ");
    absl::StatusOr<int64_t> v = checkpoint_version(dir);
    if (!v.ok()) return with_prefix(v.status(), "model.checkpoint_dir: ");
    version = *v;
    model = std::move(*m);
  } else {
    absl::StatusOr<std::string> text = model_config_text(request.model_config_json);
    if (!text.ok()) return text.status();
    absl::StatusOr<model::ModelConfig> config = model::parse_model_config(*text);
    if (!config.ok()) return with_prefix(config.status(), "model.init.model_config_json: ");
    absl::StatusOr<std::unique_ptr<model::Model>> m =
        model::Model::Init(*config, policy, request.seed);
    if (!m.ok()) return with_prefix(m.status(), "model.init: ");
    model = std::move(*m);
  }
  absl::StatusOr<std::unique_ptr<Learner>> learner = create(request, std::move(model));
  if (learner.ok()) (*learner)->version_ = (*learner)->published_version_ = version;
  return learner;
}

absl::StatusOr<std::unique_ptr<Learner>> Learner::create(const InitRequest& request,
                                                         std::unique_ptr<model::Model> model) {
  if (request.job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  if (auto s = validate_precision(request.precision, "precision"); !s.ok()) return s;
  if (auto s = model::validate_adamw_config(request.adamw); !s.ok()) {
    return with_prefix(s, "optimizer.");
  }
  const PrecisionPolicy policy = request.precision.training_policy();
  if (model == nullptr || model->inference_only() || !(model->policy() == policy)) {
    return absl::InvalidArgumentError(
        "model: a training model under precision's training policy is required");
  }
  const int64_t version = 0;
  std::unique_ptr<model::Model> reference;
  if (request.keep_reference) {
    absl::StatusOr<model::WeightSet> copy = model->export_weights(model::WeightFormat::kF32);
    if (!copy.ok()) return copy.status();
    absl::StatusOr<std::unique_ptr<model::Model>> r = model::Model::FromWeightSet(*copy, policy);
    if (!r.ok()) return r.status();
    reference = std::move(*r);
  }
  model::TokenBatch calibration;
  for (size_t i = 0; i < request.calibration.size(); ++i) {
    const std::vector<int32_t>& tokens = request.calibration[i].tokens;
    if (auto s = model->check_tokens(tokens); !s.ok()) {
      return with_prefix(s, absl::StrCat("calibration[", i, "].tokens: "));
    }
    calibration.push_back(tokens);
  }
  // The plan is checked before the backend allocates anything on its device.
  const TrainPlacement& place = request.placement;
  absl::StatusOr<MemoryPlan> plan = plan_for(model->config(), request.precision, place);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<InitialShard> initial = initial_shard(model->layout(), place);
  if (!initial.ok()) return initial.status();
  absl::StatusOr<std::unique_ptr<TrainBackend>> backend = make_train_backend(
      place.device, std::move(model), request.adamw, place.memory_budget_bytes, *initial);
  if (!backend.ok()) return with_prefix(backend.status(), "device: ");
  (*backend)->set_recompute(place.recompute);
  auto learner = std::make_unique<Learner>(request.job_id, request.precision, std::move(*backend),
                                           std::move(reference), version, version);
  learner->calibration_ = std::move(calibration);
  learner->memory_plan_ = std::move(*plan);
  return learner;
}

Learner::Learner(std::string job_id, PrecisionConfig precision, std::unique_ptr<model::Model> model,
                 std::unique_ptr<model::Model> reference, std::unique_ptr<model::AdamW> optimizer,
                 int64_t version, int64_t published_version)
    : job_id_(std::move(job_id)),
      precision_(precision),
      backend_(make_cpu_train_backend(std::move(model), std::move(optimizer))),
      reference_(std::move(reference)),
      version_(version),
      published_version_(published_version) {}

Learner::Learner(std::string job_id, PrecisionConfig precision,
                 std::unique_ptr<TrainBackend> backend, std::unique_ptr<model::Model> reference,
                 int64_t version, int64_t published_version)
    : job_id_(std::move(job_id)),
      precision_(precision),
      backend_(std::move(backend)),
      reference_(std::move(reference)),
      version_(version),
      published_version_(published_version) {}

absl::StatusOr<std::vector<std::vector<float>>> Learner::logprobs(std::span<const Sequence> seqs,
                                                                  double temperature,
                                                                  bool use_reference) const {
  if (use_reference && !reference_) {
    return absl::FailedPreconditionError(
        "use_reference: no reference policy (InitPolicy with keep_reference)");
  }
  if (!use_reference && backend_->sharded_units() != nullptr) return params_refusal("logprobs");
  absl::StatusOr<PackedBatch> batch = pack_sequences(seqs, policy(), "sequences", false);
  if (!batch.ok()) return batch.status();
  absl::StatusOr<float> t = logprob_temperature(temperature, "temperature");
  if (!t.ok()) return t.status();
  batch->temperature = *t;
  absl::StatusOr<std::vector<float>> lp =
      use_reference ? response_logprobs(*reference_, *batch) : backend_->logprobs(*batch, nullptr);
  if (!lp.ok()) return lp.status();
  std::vector<std::vector<float>> out(batch->size());
  const int64_t L = batch->length;
  for (int64_t b = 0; b < batch->size(); ++b) {
    const int64_t resp = static_cast<int64_t>(batch->tokens[b].size()) - batch->prompt_length[b];
    out[b].assign(lp->begin() + b * L, lp->begin() + b * L + resp);
  }
  return out;
}

std::unique_ptr<model::KvCalibrator> Learner::new_kv_records() const {
  if (precision_.kv_cache != Precision::kFP8) return nullptr;
  return std::make_unique<model::KvCalibrator>(policy().config().num_hidden_layers);
}

std::vector<std::pair<int64_t, int64_t>> Learner::rank_shares(const PackedBatch& batch,
                                                              int64_t m) const {
  const int64_t B = batch.size();
  const int ranks = data_parallel() ? group_->size() : 1;
  const int rank = data_parallel() ? group_->rank() : 0;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t s0 = B * i / m, s1 = B * (i + 1) / m;
    std::vector<int64_t> lengths;
    for (int64_t b = s0; b < s1; ++b) lengths.push_back(std::ssize(batch.tokens[b]));
    const std::vector<int64_t> bounds = token_balanced_shares(lengths, ranks);
    out.emplace_back(s0 + bounds[rank], s0 + bounds[rank + 1]);
  }
  return out;
}

absl::StatusOr<Learner::Prepared> Learner::prepare(const GrpoRequest& request,
                                                   model::KvCalibrator* calibrator,
                                                   bool data_parallel) const {
  Prepared p;
  absl::StatusOr<PackedBatch> batch =
      pack_sequences(request.batch, policy(), "batch", /*require_gen=*/true);
  if (!batch.ok()) return batch.status();
  p.batch = std::move(*batch);
  p.batch.replay_routing = request.routing_replay;
  if (!(request.router_aux_loss_coef >= 0) || !std::isfinite(request.router_aux_loss_coef)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm.router_aux_loss_coef: must be >= 0, got ", request.router_aux_loss_coef));
  }
  p.batch.router_aux_loss_coef = request.router_aux_loss_coef;
  absl::StatusOr<float> temperature =
      logprob_temperature(request.temperature, "algorithm.temperature");
  if (!temperature.ok()) return temperature.status();
  p.batch.temperature = *temperature;
  const rl::PolicyLossConfig& c = request.loss;
  if (!(c.clip_eps > 0 && c.clip_eps < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm.clip_eps: must be in (0, 1), got ", c.clip_eps));
  }
  if (!(c.kl_beta >= 0) || !std::isfinite(c.kl_beta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm.kl_beta: must be >= 0, got ", c.kl_beta));
  }
  if (c.kl_beta > 0 && !reference_) {
    return absl::FailedPreconditionError(
        "algorithm.kl_beta: > 0 needs a reference policy (InitPolicy with keep_reference)");
  }
  if (auto s = rl::validate_is_config(c.is, "algorithm.is"); !s.ok()) return s;
  if (request.minibatches < 1 || request.minibatches > p.batch.size()) {
    return absl::InvalidArgumentError(absl::StrCat("algorithm.minibatches: must be in [1, ",
                                                   p.batch.size(), "] (the batch size), got ",
                                                   request.minibatches));
  }
  if (!std::isfinite(request.learning_rate) || request.learning_rate < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm.learning_rate: must be >= 0, got ", request.learning_rate));
  }
  if (request.epochs < 0 || request.epochs > kMaxEpochs) {
    return absl::InvalidArgumentError(absl::StrCat("algorithm.epochs: must be in [0, ", kMaxEpochs,
                                                   "] (0 = 1), got ", request.epochs));
  }
  // prev_logprobs: the policy at the rollout version, before any update, same kernels.
  const auto start = Clock::now();
  if (data_parallel) {
    if (policy().routing_width() > 0) {
      // Routing records, replay and MoE statistics are not split across ranks or reduced yet.
      return absl::FailedPreconditionError(
          "trainer.data_parallel: mixture-of-experts models train on one trainer for now");
    }
    // This rank's rows only, then a gather through a sum (the other rows are 0 here).
    const int64_t L = p.batch.length;
    p.prev.assign(static_cast<size_t>(p.batch.size() * L), 0.0f);
    if (c.kl_beta > 0) p.ref.assign(p.prev.size(), 0.0f);
    for (const auto& [begin, end] : rank_shares(p.batch, request.minibatches)) {
      if (begin == end) {
        // ZeRO-3: no sequence here, but every rank runs the forward's unit gathers.
        if (ShardedUnitWeights* units = backend_->sharded_units()) {
          if (absl::Status s = units->idle_forward(); !s.ok()) return s;
        }
        continue;
      }
      const PackedBatch share = p.batch.slice(begin, end);
      absl::StatusOr<std::vector<float>> prev = backend_->logprobs(share, nullptr, calibrator);
      if (!prev.ok()) return prev.status();
      put_rows(*prev, begin, L, &p.prev);
      if (c.kl_beta > 0) {
        absl::StatusOr<std::vector<float>> ref = response_logprobs(*reference_, share);
        if (!ref.ok()) return ref.status();
        put_rows(*ref, begin, L, &p.ref);
      }
    }
    if (auto s =
            group_->all_reduce(std::span<float>(p.prev), ReduceOp::kSum, "prev logprobs gather");
        !s.ok()) {
      return s;
    }
    if (c.kl_beta > 0) {
      if (auto s = group_->all_reduce(std::span<float>(p.ref), ReduceOp::kSum,
                                      "reference logprobs gather");
          !s.ok()) {
        return s;
      }
    }
    if (auto s = gather_kv_records(*group_, calibrator); !s.ok()) return s;
    p.logprob_seconds = seconds_since(start);
    return p;
  }
  model::ForwardRouting routing;
  absl::StatusOr<std::vector<float>> prev =
      backend_->logprobs(p.batch, nullptr, calibrator, &routing);
  if (!prev.ok()) return prev.status();
  p.prev = std::move(*prev);
  if (const int64_t width = policy().routing_width(); width > 0) {
    // Training-time routing against the generation's: with replay the forward reports where the
    // router would have chosen otherwise; without, the routing it took is compared.
    MoeStepStats& moe = p.moe;
    moe.present = true;
    moe.replay = request.routing_replay;
    if (moe.replay) {
      moe.routed_tokens = routing.replayed_tokens;
      moe.differ_tokens = routing.replay_overrode;
    } else {
      const model::RoutingDifference d = model::routing_difference(
          routing.used, p.batch.routing, width, policy().config().moe.num_experts_per_tok);
      moe.routed_tokens = d.tokens;
      moe.differ_tokens = d.differ;
    }
    moe.aux_loss = routing.aux_loss;
    moe.num_experts = policy().config().moe.num_experts;
    moe.expert_tokens = std::move(routing.expert_tokens);
    p.router_choice = std::move(routing.chosen);
  }
  if (c.kl_beta > 0) {
    absl::StatusOr<std::vector<float>> ref = response_logprobs(*reference_, p.batch);
    if (!ref.ok()) return ref.status();
    p.ref = std::move(*ref);
  }
  p.logprob_seconds = seconds_since(start);
  return p;
}

absl::StatusOr<rl::PolicyLossResult> Learner::minibatch_gradient(
    const PackedBatch& mb, std::span<const float> prev, std::span<const float> ref,
    const rl::PolicyLossConfig& config, std::vector<float>* grads, BucketedAllReduce* bucketed,
    const std::string& what, std::span<float> shard, GradientBuckets* sink) const {
  std::unique_ptr<ForwardState> saved = backend_->new_forward_state();
  absl::StatusOr<std::vector<float>> cur = backend_->logprobs(mb, saved.get());
  if (!cur.ok()) return cur.status();
  rl::PolicyLossInput in;
  in.layout = mb.layout();
  in.cur_logprobs = *cur;
  in.prev_logprobs = prev;
  in.gen_logprobs = mb.gen_logprobs;
  in.ref_logprobs = config.kl_beta > 0 ? ref : std::span<const float>();
  in.mask = mb.mask;
  in.advantages = mb.advantages;
  absl::StatusOr<rl::PolicyLossResult> loss = rl::grpo_policy_loss(in, config);
  if (!loss.ok()) {
    // Under ZeRO-3 the other ranks' backward gathers still run; the error wins.
    idle_pass(/*forward=*/false, shard, what, /*finish=*/true).IgnoreError();
    return loss.status();
  }
  if (sink != nullptr) {
    // ZeRO-2's buckets: no whole gradient array on this rank.
    sink->begin(shard, what);
    if (auto s = backend_->backward_to_sink(*saved, mb, loss->dloss_dcur, *sink); !s.ok()) {
      sink->finish().IgnoreError();  // every rank runs the same collectives; the error wins
      return s;
    }
    return loss;
  }
  float* out = nullptr;  // null: the backend's own buffer (see the header)
  if (grads != nullptr) {
    grads->assign(backend_->num_params(), 0.0f);
    out = grads->data();
  }
  model::GradientsFinal on_final;
  if (bucketed != nullptr) {
    begin_buckets(bucketed, grads, shard, what);
    on_final = [bucketed](int64_t from) { bucketed->final_from(from); };
  }
  if (auto s = backend_->backward(*saved, mb, loss->dloss_dcur, out, on_final); !s.ok()) {
    // The buckets begun still run (every rank runs the same collectives); the error wins.
    if (bucketed != nullptr) bucketed->finish().IgnoreError();
    return s;
  }
  return loss;
}

absl::Status Learner::idle_pass(bool forward, std::span<float> shard, const std::string& what,
                                bool finish) const {
  ShardedUnitWeights* units = backend_->sharded_units();
  if (units == nullptr) return absl::OkStatus();
  if (forward) {
    if (absl::Status s = units->idle_forward(); !s.ok()) return s;
  }
  GradientBuckets* sink = gradient_buckets_.get();
  if (sink != nullptr) sink->begin(shard, what);
  absl::Status s = units->idle_backward(sink);
  // The buckets never written go out as zeros (GradientBuckets::finish), here or, on success
  // without `finish`, in reduce_gradients (idle_begins_buckets).
  if (sink != nullptr && (finish || !s.ok())) sink->finish().IgnoreError();
  return s;
}

void Learner::set_group(Collectives* group, int64_t bucket_bytes) {
  if (ShardedUnitWeights* units = backend_->sharded_units()) {
    units->set_buckets(nullptr);
    units->set_group(group);
  }
  gradient_buckets_.reset();
  bucketed_.reset();
  group_ = group;
  if (group != nullptr && group->size() > 1 && bucket_bytes > 0) {
    const auto floats = static_cast<int64_t>(sizeof(float));
    bucketed_ = std::make_unique<BucketedAllReduce>(group, (bucket_bytes + floats - 1) / floats);
  }
  make_gradient_buckets();
}

void Learner::make_gradient_buckets() {
  if (ShardedUnitWeights* units = backend_->sharded_units()) units->set_buckets(nullptr);
  gradient_buckets_.reset();
  if (!sharded() || bucketed_ == nullptr || group_ == nullptr ||
      group_->size() != shard_layout_->ranks()) {
    return;
  }
  gradient_buckets_ = std::make_unique<GradientBuckets>(
      group_, *shard_layout_, backend_->host_model().layout(), bucketed_->bucket_elements());
  if (ShardedUnitWeights* units = backend_->sharded_units()) {
    units->set_buckets(gradient_buckets_.get());
  }
}

int64_t Learner::gradient_bytes(const std::vector<float>& grads, std::span<const float> shard,
                                bool backend_buffer) const {
  const auto f = static_cast<int64_t>(sizeof(float));
  if (gradient_buckets_ != nullptr) {
    return std::ssize(shard) * f + gradient_buckets_->last_peak_bytes();
  }
  if (backend_buffer) return backend_->num_params() * f;
  return (static_cast<int64_t>(grads.capacity()) + std::ssize(shard)) * f;
}

void Learner::begin_buckets(BucketedAllReduce* bucketed, std::vector<float>* grads,
                            std::span<float> shard, const std::string& what) const {
  if (sharded()) {
    bucketed->begin_scatter(std::span<const float>(*grads), *shard_layout_, shard, what);
  } else {
    bucketed->begin(std::span<float>(*grads), what);
  }
}

absl::Status Learner::reduce_gradients(std::vector<float>* grads, bool begun,
                                       const std::string& what, double* wait_seconds,
                                       std::span<float> shard) {
  const auto start = Clock::now();
  absl::Status s;
  if (gradient_buckets_ != nullptr) {
    if (!begun) gradient_buckets_->begin(shard, what);
    s = gradient_buckets_->finish();
  } else if (bucketed_ != nullptr) {
    if (!begun) begin_buckets(bucketed_.get(), grads, shard, what);
    s = bucketed_->finish();
  } else if (sharded()) {
    const std::vector<int64_t> counts = shard_layout_->counts();
    s = group_->reduce_scatter(std::span<const float>(*grads), shard, counts, what);
  } else {
    s = group_->all_reduce(std::span<float>(*grads), ReduceOp::kSum, what);
  }
  *wait_seconds += seconds_since(start);
  return s;
}

absl::Status Learner::set_shard_mode(ShardMode mode) {
  if (mode == ShardMode::kNone) {
    if (sharded()) {
      return absl::FailedPreconditionError(
          "trainer.shard: this learner's optimizer is already sharded; it cannot return to none");
    }
    shard_mode_ = mode;
    return restore_optimizer_shards();
  }
  // Already sharded: kept as it is; outside its group the updates refuse (check_shard_group)
  // until a checkpoint is loaded into a new learner (which re-cuts the optimizer state).
  if (sharded()) {
    if (mode == shard_mode_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("trainer.shard: this learner is sharded as ",
                     std::string(shard_mode_name(shard_mode_)), "; it cannot change to ",
                     std::string(shard_mode_name(mode)), " (load a checkpoint into a new policy)"));
  }
  shard_mode_ = mode;
  if (!data_parallel()) return restore_optimizer_shards();  // one trainer shards nothing
  absl::StatusOr<ShardLayout> layout =
      shard_parameters(backend_->host_model().layout(), group_->size());
  if (!layout.ok()) return layout.status();
  const int rank = group_->rank();
  if (absl::Status s = backend_->shard_optimizer(layout->begin(rank), layout->end(rank)); !s.ok()) {
    shard_mode_ = ShardMode::kNone;
    return s;
  }
  shard_layout_ = std::move(*layout);
  shard_rank_ = rank;
  if (mode == ShardMode::kParams) {
    // ZeRO-3: the working copies too. On failure the updates fail: check_shard_group passes, but
    // the working copies stay whole and the mode says params, so refuse them here instead.
    if (absl::Status s = backend_->shard_working(*shard_layout_, rank); !s.ok()) return s;
    ShardedUnitWeights* units = backend_->sharded_units();
    units->set_group(group_);
    if (absl::Status s = units->refresh("working weights (sharding)", /*fingerprint=*/false);
        !s.ok()) {
      return s;
    }
  }
  make_gradient_buckets();
  return restore_optimizer_shards();
}

void Learner::set_pending_optimizer_shards(std::string dir, OptimizerShardManifest manifest) {
  pending_shards_dir_ = std::move(dir);
  pending_shards_ = std::move(manifest);
}

absl::Status Learner::restore_optimizer_shards() {
  if (!pending_shards_.has_value()) return absl::OkStatus();
  // The range the optimizer holds: this rank's shard, or every parameter.
  const int64_t begin = sharded() ? shard_layout_->begin(shard_rank_) : 0;
  const int64_t end = sharded() ? shard_layout_->end(shard_rank_) : backend_->num_params();
  absl::StatusOr<model::AdamW::RangeState> state =
      read_optimizer_range(pending_shards_dir_, *pending_shards_, begin, end);
  if (!state.ok()) return state.status();
  if (absl::Status s = backend_->set_optimizer_range_state(std::move(*state)); !s.ok()) return s;
  pending_shards_.reset();
  return absl::OkStatus();
}

absl::Status Learner::check_shard_group() const {
  if (!sharded()) return absl::OkStatus();
  const int size = group_ != nullptr ? group_->size() : 1;
  const int rank = group_ != nullptr ? group_->rank() : 0;
  if (size == shard_layout_->ranks() && rank == shard_rank_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "trainer.shard ", std::string(shard_mode_name(shard_mode_)),
      ": the optimizer holds the shard of rank ", shard_rank_, " of ", shard_layout_->ranks(),
      ", and this trainer is now rank ", rank, " of ", size,
      "; its optimizer is re-cut only when loaded from a checkpoint (LoadCheckpoint)"));
}

absl::StatusOr<double> Learner::sharded_grad_norm(std::span<const float> shard,
                                                  const std::string& what) {
  // running: the sum of squares over the shards of ranks [0, r), added element by element from
  // the first parameter on, as model::AdamW::step adds them. The other ranks add 0 (exact).
  double running = 0;
  for (int r = 0; r < group_->size(); ++r) {
    std::vector<double> v = {0.0};
    if (r == group_->rank()) {
      double sq = running;
      for (float g : shard) sq += static_cast<double>(g) * g;
      v[0] = sq;
    }
    if (absl::Status s = group_->all_reduce(std::span<double>(v), ReduceOp::kSum, what); !s.ok()) {
      return s;
    }
    running = v[0];
  }
  return std::sqrt(running);
}

absl::StatusOr<model::OptimizerStepStats> Learner::step_optimizer(std::vector<float>* grads,
                                                                  std::span<float> shard,
                                                                  const std::string& where) {
  if (!data_parallel()) return backend_->optimizer_step(nullptr);
  if (!sharded()) return backend_->optimizer_step(grads->data());
  absl::StatusOr<double> norm = sharded_grad_norm(shard, absl::StrCat(where, "gradient norm"));
  if (!norm.ok()) return norm.status();
  // The norm is the same on every rank, so a non-finite one fails every rank before the gather.
  absl::StatusOr<model::OptimizerStepStats> stats = backend_->optimizer_step_shard(shard, *norm);
  if (!stats.ok()) return stats.status();
  if (ShardedUnitWeights* units = backend_->sharded_units()) {
    // ZeRO-3: each rank keeps its own shard's working copies; units are gathered as they run.
    if (absl::Status s = units->refresh(absl::StrCat(where, "working weights"),
                                        /*fingerprint=*/true);
        !s.ok()) {
      return s;
    }
    return stats;
  }
  if (absl::Status s = backend_->gather_working(*group_, *shard_layout_,
                                                absl::StrCat(where, "working weights all-gather"));
      !s.ok()) {
    return s;
  }
  return stats;
}

absl::StatusOr<std::vector<float>> Learner::whole_master(std::string_view what) const {
  const model::Model& m = backend_->host_model();
  if (!sharded()) {
    if (m.description_only()) {
      return absl::FailedPreconditionError(
          absl::StrCat(std::string(what), ": the master is on the device (export_weights)"));
    }
    return std::vector<float>(m.params().begin(), m.params().end());
  }
  if (absl::Status s = check_shard_group(); !s.ok()) return s;
  absl::StatusOr<std::vector<float>> mine = backend_->master_shard();
  if (!mine.ok()) return mine.status();
  std::vector<float> whole(static_cast<size_t>(m.num_params()));
  if (absl::Status s = group_->all_gather(std::span<const float>(*mine), std::span<float>(whole),
                                          shard_layout_->counts(),
                                          absl::StrCat(std::string(what), " master all-gather"));
      !s.ok()) {
    return s;
  }
  return whole;
}

absl::StatusOr<model::WeightSet> Learner::export_weights(model::WeightFormat format,
                                                         int64_t version) const {
  if (ShardedUnitWeights* units = backend_->sharded_units();
      units != nullptr && !backend_->host_model().export_needs_master(format)) {
    // ZeRO-3: the working copies are whole only while exported (a collective on every rank, like
    // the master's gather below).
    if (absl::Status s = check_shard_group(); !s.ok()) return s;
    if (absl::Status s = units->acquire_all("export working weights"); !s.ok()) return s;
    absl::StatusOr<model::WeightSet> set = backend_->export_weights(format, version);
    units->release_all();
    return set;
  }
  if (!sharded() || !backend_->host_model().export_needs_master(format)) {
    return backend_->export_weights(format, version);
  }
  absl::StatusOr<std::vector<float>> master = whole_master("export");
  if (!master.ok()) return master.status();
  return backend_->export_weights_with_master(format, version, *master);
}

absl::Status Learner::set_learning_rate(double lr) {
  if (lr == backend_->optimizer_config().lr) return absl::OkStatus();
  return backend_->set_learning_rate(lr);
}

absl::StatusOr<PolicyGradient> Learner::gradient(const GrpoRequest& request) const {
  if (backend_->sharded_units() != nullptr) return params_refusal("gradient");
  absl::StatusOr<Prepared> p = prepare(request, nullptr);
  if (!p.ok()) return p.status();
  PolicyGradient out;
  absl::StatusOr<rl::PolicyLossResult> loss =
      minibatch_gradient(p->batch, p->prev, p->ref, request.loss, &out.grads);
  if (!loss.ok()) return loss.status();
  out.loss = std::move(*loss);
  out.prev_logprobs = std::move(p->prev);
  return out;
}

absl::StatusOr<GrpoResult> Learner::grpo_update(const GrpoRequest& request,
                                                const std::atomic<bool>* stop) {
  // The KV calibration of the next export rides on the prev-logprobs forward.
  if (absl::Status s = check_shard_group(); !s.ok()) return s;
  if (absl::Status s = restore_optimizer_shards(); !s.ok()) return s;
  gradient_peak_bytes_ = data_parallel() ? 0 : gradient_bytes({}, {}, /*backend_buffer=*/true);
  std::unique_ptr<model::KvCalibrator> records = new_kv_records();
  const bool dp = data_parallel();
  const CollectiveStats group_before = dp ? group_->stats() : CollectiveStats{};
  absl::StatusOr<Prepared> prepared = prepare(request, records.get(), dp);
  if (!prepared.ok()) return prepared.status();
  const PackedBatch& batch = prepared->batch;
  const rl::PolicyLossConfig& config = request.loss;
  const std::vector<float>& prev = prepared->prev;
  const std::vector<float>& ref = prepared->ref;
  if (request.learning_rate > 0) {
    if (auto s = set_learning_rate(request.learning_rate); !s.ok()) return s;
  }
  const int64_t B = batch.size(), L = batch.length;
  GrpoResult r;
  absl::StatusOr<rl::MismatchMetrics> mismatch =
      rl::mismatch_metrics(prev, batch.gen_logprobs, batch.mask, batch.layout(), config.is);
  if (!mismatch.ok()) return mismatch.status();
  r.mismatch = *mismatch;
  r.logprob_seconds = prepared->logprob_seconds;
  r.moe = prepared->moe;

  const int64_t m = request.minibatches;
  const int64_t epochs = std::max<int64_t>(1, request.epochs);
  const int64_t updates = epochs * m;
  // An update that fails after `applied` optimizer steps still makes a new version.
  auto interrupted = [&](int64_t applied, const absl::Status& error) {
    if (applied > 0) {
      ++version_;
      kv_records_ = std::move(records);
    }
    return error;
  };
  double clipped_tokens = 0;
  // The gradient buffer of a group (all-reduced on the host); alone, the gradients stay in the
  // backend's own buffer (on a device backend they never leave the device).
  std::vector<float> grads;
  // Sharded: this rank's shard of the summed gradient (the reduce-scatter's output).
  std::vector<float> shard(sharded() ? static_cast<size_t>(shard_layout_->size(group_->rank()))
                                     : 0);
  // In a group: this rank's sequences of each minibatch (the whole minibatch when alone).
  const std::vector<std::pair<int64_t, int64_t>> shares = rank_shares(batch, m);
  // Epoch e, minibatch i is update u = e * m + i; every pass sees the same minibatches in the
  // same order, against the same prev logprobs (PPO's ratio is relative to the rollout policy).
  for (int64_t u = 0; u < updates; ++u) {
    const int64_t i = u % m;
    if (stopped(stop)) {
      return interrupted(u, absl::UnavailableError(absl::StrCat("trainer is shutting down (after ",
                                                                u, " of ", updates, " updates)")));
    }
    const auto [s0, s1] = shares[static_cast<size_t>(i)];
    const std::string where = epochs > 1 ? absl::StrCat("epoch ", u / m, " minibatch ", i, ": ")
                                         : absl::StrCat("minibatch ", i, ": ");
    rl::PolicyLossConfig mb_config = config;
    if (dp) {
      // Every rank normalizes by the whole minibatch's tokens; the sum over ranks is then the
      // single-trainer gradient.
      mb_config.token_normalizer =
          std::max<int64_t>(1, valid_tokens(batch, B * i / m, B * (i + 1) / m));
    }
    auto start = Clock::now();
    absl::StatusOr<rl::PolicyLossResult> result;
    if (s1 > s0) {
      const PackedBatch mb = batch.slice(s0, s1);
      const std::span<const float> prev_mb(prev.data() + s0 * L, (s1 - s0) * L);
      const std::span<const float> ref_mb =
          ref.empty() ? std::span<const float>()
                      : std::span<const float>(ref.data() + s0 * L, (s1 - s0) * L);
      result = minibatch_gradient(
          mb, prev_mb, ref_mb, mb_config, dp ? &grads : nullptr, dp ? bucketed_.get() : nullptr,
          absl::StrCat(where, "gradient all-reduce"), shard, gradient_buckets_.get());
    } else {
      // No sequence of this minibatch fell to this rank: it adds nothing but still takes part
      // (with ZeRO-2's buckets, reduce_gradients sends zero buckets; under ZeRO-3 it runs the
      // unit gathers of a forward and a backward, the buckets going out as the backward's would).
      result = rl::PolicyLossResult{};
      if (gradient_buckets_ == nullptr) grads.assign(backend_->num_params(), 0.0f);
      if (absl::Status s = idle_pass(/*forward=*/true, shard,
                                     absl::StrCat(where, "gradient all-reduce"), /*finish=*/false);
          !s.ok()) {
        result = s;
      }
    }
    if (!result.ok()) return interrupted(u, with_prefix(result.status(), where));
    r.forward_backward_seconds += seconds_since(start);
    if (dp) {
      if (auto s = reduce_gradients(&grads, s1 > s0 || idle_begins_buckets(),
                                    absl::StrCat(where, "gradient all-reduce"),
                                    &r.gradient_wait_seconds, shard);
          !s.ok()) {
        return interrupted(u, s);
      }
      gradient_peak_bytes_ =
          std::max(gradient_peak_bytes_, gradient_bytes(grads, shard, /*backend_buffer=*/false));
      if (auto s = reduce_loss_stats(*group_, &*result); !s.ok()) return interrupted(u, s);
    }
    start = Clock::now();
    absl::StatusOr<model::OptimizerStepStats> step = step_optimizer(&grads, shard, where);
    if (!step.ok()) return interrupted(u, with_prefix(step.status(), where));
    r.optimizer_seconds += seconds_since(start);
    if (dp) {
      // A rank that cannot read its weights still takes part (hash 0), so the others fail too
      // instead of waiting for it.
      absl::StatusOr<uint64_t> fingerprint = backend_->master_fingerprint();
      if (auto s = check_same_weights(*group_, fingerprint.ok() ? *fingerprint : 0,
                                      absl::StrCat("after ", where));
          !s.ok()) {
        return interrupted(u + 1, s);
      }
      if (!fingerprint.ok()) return interrupted(u + 1, fingerprint.status());
    }
    const double share = 1.0 / static_cast<double>(updates);
    r.loss += result->loss * share;
    r.pg_loss += result->stats.policy_loss * share;
    r.kl += result->stats.kl * share;
    r.grad_norm += step->grad_norm * share;
    clipped_tokens += result->stats.clip_fraction *
                      static_cast<double>(result->stats.valid_tokens) / static_cast<double>(epochs);
    r.learning_rate = step->lr;
    rl::fold_probs_ratio(result->stats, &r.mismatch);
  }
  ++version_;
  kv_records_ = std::move(records);
  r.logprobs.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    GrpoResult::SequenceLogprobs& out = r.logprobs[static_cast<size_t>(b)];
    for (int64_t t = 0; t < L; ++t) {
      const size_t i = static_cast<size_t>(b * L + t);
      if (batch.mask[i] == 0) continue;
      out.gen.push_back(batch.gen_logprobs[i]);
      out.prev.push_back(prev[i]);
    }
    if (!prepared->router_choice.empty()) {
      out.gen_routing = batch.routing[static_cast<size_t>(b)];
      out.router_routing = std::move(prepared->router_choice[static_cast<size_t>(b)]);
    }
  }
  r.updates = updates;
  r.tokens = batch.valid_tokens;
  if (dp) {
    const CollectiveStats after = group_->stats();
    r.all_reduce_seconds = after.seconds - group_before.seconds;
    r.all_reduce_bytes = after.bytes - group_before.bytes;
    r.group_size = group_->size();
  }
  r.clip_fraction =
      batch.valid_tokens > 0 ? clipped_tokens / static_cast<double>(batch.valid_tokens) : 0.0;
  return r;
}

absl::StatusOr<SftResult> Learner::sft_update(const SftRequest& request,
                                              const std::atomic<bool>* stop) {
  if (absl::Status s = check_shard_group(); !s.ok()) return s;
  if (absl::Status s = restore_optimizer_shards(); !s.ok()) return s;
  gradient_peak_bytes_ = data_parallel() ? 0 : gradient_bytes({}, {}, /*backend_buffer=*/true);
  absl::StatusOr<PackedBatch> batch =
      pack_sequences(request.batch, policy(), "batch", /*require_gen=*/false);
  if (!batch.ok()) return batch.status();
  const int64_t B = batch->size();
  if (!(request.learning_rate > 0) || !std::isfinite(request.learning_rate)) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning_rate: must be > 0, got ", request.learning_rate));
  }
  if (request.minibatches < 1 || request.minibatches > B) {
    return absl::InvalidArgumentError(absl::StrCat(
        "minibatches: must be in [1, ", B, "] (the batch size), got ", request.minibatches));
  }
  if (auto s = set_learning_rate(request.learning_rate); !s.ok()) return s;
  // The KV calibration of the next export rides on the training forwards.
  std::unique_ptr<model::KvCalibrator> records = new_kv_records();
  auto interrupted = [&](int64_t applied, const absl::Status& error) {
    if (applied > 0) {
      ++version_;
      kv_records_ = std::move(records);
    }
    return error;
  };

  const int64_t m = request.minibatches;
  SftResult r;
  std::vector<float> grads;  // a group's all-reduce buffer (alone: the backend's own buffer)
  const bool dp = data_parallel();
  // Sharded: this rank's shard of the summed gradient (the reduce-scatter's output).
  std::vector<float> shard(sharded() ? static_cast<size_t>(shard_layout_->size(group_->rank()))
                                     : 0);
  const CollectiveStats group_before = dp ? group_->stats() : CollectiveStats{};
  // In a group: this rank's sequences of each minibatch (the whole minibatch when alone).
  const std::vector<std::pair<int64_t, int64_t>> shares = rank_shares(*batch, m);
  for (int64_t i = 0; i < m; ++i) {
    if (stopped(stop)) return interrupted(i, absl::UnavailableError("trainer is shutting down"));
    const auto [s0, s1] = shares[static_cast<size_t>(i)];
    // In a group every rank normalizes by the whole minibatch's tokens (0: this call's own).
    const int64_t normalizer =
        dp ? std::max<int64_t>(1, valid_tokens(*batch, B * i / m, B * (i + 1) / m)) : 0;
    auto start = Clock::now();
    if (dp && gradient_buckets_ == nullptr) grads.assign(backend_->num_params(), 0.0f);
    double loss = 0;
    if (s1 > s0) {
      const PackedBatch mb = batch->slice(s0, s1);
      std::unique_ptr<ForwardState> saved = backend_->new_forward_state();
      absl::StatusOr<std::vector<float>> cur = backend_->logprobs(mb, saved.get(), records.get());
      if (!cur.ok()) return interrupted(i, cur.status());
      const std::string what = absl::StrCat("minibatch ", i, ": gradient all-reduce");
      absl::StatusOr<rl::SftLossResult> nll = rl::sft_nll_loss(*cur, mb.mask, normalizer);
      if (!nll.ok()) {
        // Under ZeRO-3 the other ranks' backward gathers still run; the error wins.
        idle_pass(/*forward=*/false, shard, what, /*finish=*/true).IgnoreError();
        return interrupted(i, nll.status());
      }
      if (gradient_buckets_ != nullptr) {
        // ZeRO-2's buckets: no whole gradient array on this rank.
        gradient_buckets_->begin(shard, what);
        if (auto s = backend_->backward_to_sink(*saved, mb, nll->dloss_dlogp, *gradient_buckets_);
            !s.ok()) {
          gradient_buckets_->finish().IgnoreError();  // every rank runs the same collectives
          return interrupted(i, s);
        }
      } else {
        model::GradientsFinal on_final;
        if (dp && bucketed_ != nullptr) {
          begin_buckets(bucketed_.get(), &grads, shard, what);
          on_final = [this](int64_t from) { bucketed_->final_from(from); };
        }
        if (auto s = backend_->backward(*saved, mb, nll->dloss_dlogp, dp ? grads.data() : nullptr,
                                        on_final);
            !s.ok()) {
          if (on_final) bucketed_->finish().IgnoreError();  // every rank runs the same collectives
          return interrupted(i, s);
        }
      }
      loss = nll->loss;
    } else if (absl::Status s = idle_pass(/*forward=*/true, shard,
                                          absl::StrCat("minibatch ", i, ": gradient all-reduce"),
                                          /*finish=*/false);
               !s.ok()) {
      return interrupted(i, s);
    }
    r.forward_backward_seconds += seconds_since(start);
    if (dp) {
      const std::string where = absl::StrCat("minibatch ", i, ": ");
      if (auto s = reduce_gradients(&grads, s1 > s0 || idle_begins_buckets(),
                                    absl::StrCat(where, "gradient all-reduce"),
                                    &r.gradient_wait_seconds, shard);
          !s.ok()) {
        return interrupted(i, s);
      }
      gradient_peak_bytes_ =
          std::max(gradient_peak_bytes_, gradient_bytes(grads, shard, /*backend_buffer=*/false));
      std::vector<double> sum = {loss};
      if (auto s = group_->all_reduce(std::span<double>(sum), ReduceOp::kSum,
                                      absl::StrCat(where, "loss all-reduce"));
          !s.ok()) {
        return interrupted(i, s);
      }
      loss = sum[0];
    }
    start = Clock::now();
    absl::StatusOr<model::OptimizerStepStats> step =
        step_optimizer(&grads, shard, absl::StrCat("minibatch ", i, ": "));
    if (!step.ok()) {
      return interrupted(i, with_prefix(step.status(), absl::StrCat("minibatch ", i, ": ")));
    }
    r.optimizer_seconds += seconds_since(start);
    if (dp) {
      // A rank that cannot read its weights still takes part (hash 0), so the others fail too
      // instead of waiting for it.
      absl::StatusOr<uint64_t> fingerprint = backend_->master_fingerprint();
      if (auto s = check_same_weights(*group_, fingerprint.ok() ? *fingerprint : 0,
                                      absl::StrCat("after SFT minibatch ", i));
          !s.ok()) {
        return interrupted(i + 1, s);
      }
      if (!fingerprint.ok()) return interrupted(i + 1, fingerprint.status());
    }
    r.loss += loss / static_cast<double>(m);
    r.grad_norm += step->grad_norm / static_cast<double>(m);
    r.learning_rate = step->lr;
  }
  if (dp) {
    if (auto s = gather_kv_records(*group_, records.get()); !s.ok()) return interrupted(m, s);
    const CollectiveStats after = group_->stats();
    r.all_reduce_seconds = after.seconds - group_before.seconds;
    r.all_reduce_bytes = after.bytes - group_before.bytes;
    r.group_size = group_->size();
  }
  ++version_;
  kv_records_ = std::move(records);
  r.updates = m;
  r.tokens = batch->valid_tokens;
  return r;
}

absl::StatusOr<Export> Learner::export_for_generation(Precision format, int64_t version,
                                                      bool calibrate_kv) {
  if (format != Precision::kFP8 && format != Precision::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("format: ", std::string(precision_name(format)),
                     " is not a weight format (expected fp8 or bf16)"));
  }
  Export out;
  out.policy = precision_.policy(format);
  // The model generation runs: the policy itself when the linear formats agree, else the master
  // weights under the generation policy (exact fp32 copy, then quantized by its own layers).
  std::unique_ptr<model::Model> generation;
  auto start = Clock::now();
  auto build_generation = [&]() -> absl::Status {
    if (out.policy.linear == precision_.training) return absl::OkStatus();
    absl::StatusOr<model::WeightSet> master = export_weights(model::WeightFormat::kF32, 0);
    if (!master.ok()) return master.status();
    absl::StatusOr<std::unique_ptr<model::Model>> g =
        model::Model::FromWeightSet(*master, out.policy);
    if (!g.ok()) return g.status();
    generation = std::move(*g);
    return absl::OkStatus();
  };
  // KV scales (FP8 KV cache only): from the last update's own forward; before any update, one
  // forward over the init request's calibration sequences on the model generation runs. Nothing
  // to calibrate on without either.
  const bool recorded = kv_calibration_records() > 0;
  out.calibrated =
      calibrate_kv && precision_.kv_cache == Precision::kFP8 && (recorded || !calibration_.empty());
  if (out.calibrated) {
    model::KvScales scales;
    if (recorded) {
      scales = kv_records_->scales(kKvCalibrationPercentile, kKvCalibrationMargin);
    } else {
      if (auto s = build_generation(); !s.ok()) return with_prefix(s, "calibrating KV scales: ");
      model::KvCalibrator calibrator(policy().config().num_hidden_layers);
      engine::TrainStepOptions opts;
      opts.calibrator = &calibrator;
      const absl::Status ran = generation
                                   ? engine::cpu_logprobs(*generation, calibration_, opts).status()
                                   : backend_->calibration_forward(calibration_, &calibrator);
      if (!ran.ok()) return with_prefix(ran, "calibrating KV scales: ");
      scales = calibrator.scales(kKvCalibrationPercentile, kKvCalibrationMargin);
    }
    if (auto s = backend_->set_kv_scales(scales); !s.ok()) {
      return with_prefix(s, "calibrating KV scales: ");
    }
    if (generation) {
      if (auto s = generation->set_kv_scales(scales); !s.ok()) {
        return with_prefix(s, "calibrating KV scales: ");
      }
    }
  }
  out.calibrate_seconds = seconds_since(start);

  start = Clock::now();
  absl::StatusOr<model::WeightSet> set;
  if (format == Precision::kBF16) {
    set = export_weights(model::WeightFormat::kBF16, version);
  } else if (precision_.training == Precision::kFP8) {
    // The FP8 layers' codes and scales, re-derived from the master weights by the optimizer's
    // refresh() after the last update (sharded: gathered from the ranks' shards).
    set = export_weights(model::WeightFormat::kFP8, version);
  } else {
    // Training runs BF16 linears, generation FP8: quantize the master weights with the
    // generation policy's layer choices.
    if (!generation) {
      if (auto s = build_generation(); !s.ok()) return s;
    }
    set = generation->export_weights(model::WeightFormat::kFP8, version);
  }
  if (!set.ok()) return set.status();
  // Tell generation workers the policy to run this payload with (services/generation_worker/
  // weight_loader.h reads the "fp8rl_precision" object), so both sides compute the same function.
  nlohmann::json config = nlohmann::json::parse(set->config_json, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InternalError("exported config.json is not a JSON object");
  }
  config[kPrecisionConfigKey] = nlohmann::json::parse(precision_policy_to_json(out.policy).dump());
  set->config_json = config.dump(2);
  out.quantize_seconds = seconds_since(start);

  std::vector<float> block_scales;
  for (const model::NamedTensor& t : set->tensors) {
    if (!t.name.ends_with("_scale_inv")) continue;
    absl::StatusOr<std::vector<float>> values = model::tensor_to_f32(t);
    if (!values.ok()) return values.status();
    block_scales.insert(block_scales.end(), values->begin(), values->end());
  }
  out.weight_scale_inv = stats_of(block_scales);
  out.k_scale = stats_of(backend_->kv_scales().k);
  out.v_scale = stats_of(backend_->kv_scales().v);
  out.weights = std::move(*set);
  return out;
}

}  // namespace fp8rl::train
