// The in-process GRPO step (see grpo_step.h).
#include "train/grpo_step.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "common/status_prefix.h"
#include "model/weight_view.h"
#include "rl/grpo.h"

namespace fp8rl::train {
namespace {

using Clock = std::chrono::steady_clock;

// The model a generation worker would hold for `e`: inference-only (codes and scales as
// received) for bf16 / fp8 payloads, a full model for fp32.
absl::StatusOr<std::shared_ptr<const model::Model>> generation_model(const Export& e) {
  if (e.policy.linear == Precision::kF32) {
    absl::StatusOr<std::unique_ptr<model::Model>> m =
        model::Model::FromWeightSet(e.weights, e.policy);
    if (!m.ok()) return m.status();
    return std::shared_ptr<const model::Model>(std::move(*m));
  }
  absl::StatusOr<model::WeightView> view = model::view_of(e.weights);
  if (!view.ok()) return view.status();
  absl::StatusOr<model::ModelConfig> config = model::parse_model_config(e.weights.config_json);
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::ForInference(*config, e.policy);
  if (!m.ok()) return m.status();
  if (auto s = (*m)->install(*view); !s.ok()) return s;
  return std::shared_ptr<const model::Model>(std::move(*m));
}

}  // namespace

absl::StatusOr<std::unique_ptr<InProcessGrpo>> InProcessGrpo::create(Learner* learner,
                                                                     const GrpoStepConfig& config,
                                                                     RewardFn reward) {
  if (learner == nullptr) return absl::InvalidArgumentError("learner: required");
  if (!reward) return absl::InvalidArgumentError("reward: required");
  if (config.samples_per_prompt < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples_per_prompt: must be >= 2, got ", config.samples_per_prompt));
  }
  if (config.new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("new_tokens: must be >= 1, got ", config.new_tokens));
  }
  if (!(config.temperature > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: must be > 0, got ", config.temperature));
  }
  std::unique_ptr<InProcessGrpo> g(new InProcessGrpo(learner, config, std::move(reward)));
  GrpoStepTimes ignored;
  if (auto s = g->publish(learner->version(), &ignored); !s.ok()) return s;
  return g;
}

absl::Status InProcessGrpo::publish(int64_t version, GrpoStepTimes* times) {
  absl::StatusOr<Export> e =
      learner_->export_for_generation(learner_->precision().generation, version, true);
  if (!e.ok()) return with_prefix(e.status(), "publish: ");
  times->calibrate += e->calibrate_seconds;
  times->export_weights += e->quantize_seconds;
  const auto start = Clock::now();
  absl::StatusOr<std::shared_ptr<const model::Model>> m = generation_model(*e);
  if (!m.ok()) return with_prefix(m.status(), "install: ");
  if (generator_ == nullptr) {
    model::BackendOptions options;
    options.memory_budget_bytes = config_.generation_memory_bytes;
    options.max_step_tokens = config_.max_step_tokens;
    absl::StatusOr<std::unique_ptr<model::InferenceBackend>> backend =
        config_.generation_device == model::Device::kCuda ? model::make_cuda_backend(*m, options)
                                                          : model::make_cpu_backend(*m, options);
    if (!backend.ok()) return with_prefix(backend.status(), "generation backend: ");
    generator_ =
        std::make_unique<model::BackendGenerator>(std::move(*backend), config_.max_step_tokens);
  } else if (auto s = generator_->set_model(*m); !s.ok()) {
    return with_prefix(s, "install: ");
  }
  times->install += seconds_since(start);
  learner_->set_published(version);
  return absl::OkStatus();
}

absl::StatusOr<GrpoStepReport> InProcessGrpo::step(std::span<const std::vector<int32_t>> prompts) {
  if (prompts.empty()) return absl::InvalidArgumentError("prompts: at least one");
  const int64_t G = config_.samples_per_prompt;
  GrpoStepReport report;
  GrpoStepTimes& t = report.times;

  // 1. Generate: sample g of prompt p is stream p * G + g.
  auto start = Clock::now();
  model::SamplingParams params;
  params.temperature = config_.temperature;
  params.max_new_tokens = config_.new_tokens;
  params.seed = config_.seed + static_cast<uint64_t>(steps_);
  // Every prompt is checked before any sample is queued (an error leaves the engine idle).
  const model::ModelConfig& mc = learner_->policy().config();
  for (size_t p = 0; p < prompts.size(); ++p) {
    if (prompts[p].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("prompts[", p, "]: empty"));
    }
    for (int32_t t : prompts[p]) {
      if (t < 0 || t >= mc.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompts[", p, "]: token ", t, " is not in [0, ", mc.vocab_size, ")"));
      }
    }
    if (static_cast<int64_t>(prompts[p].size()) + config_.new_tokens > mc.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompts[", p, "]: ", prompts[p].size(), " tokens + new_tokens ", config_.new_tokens,
          " exceed max_position_embeddings ", mc.max_position_embeddings));
    }
  }
  std::vector<int64_t> ids;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int64_t g = 0; g < G; ++g) {
      absl::StatusOr<int64_t> id =
          generator_->add(prompts[p], params, static_cast<uint64_t>(p) * G + g);
      if (!id.ok()) return with_prefix(id.status(), absl::StrCat("prompts[", p, "]: "));
      ids.push_back(*id);
    }
  }
  std::vector<model::GenerationResult> results;
  while (!generator_->idle()) {
    if (auto s = generator_->step(); !s.ok()) return with_prefix(s, "generate: ");
    for (model::GenerationResult& r : generator_->take_finished()) results.push_back(std::move(r));
  }
  for (model::GenerationResult& r : generator_->take_finished()) results.push_back(std::move(r));
  if (results.size() != ids.size()) {
    return absl::InternalError(
        absl::StrCat("generate: ", results.size(), " results for ", ids.size(), " samples"));
  }
  std::sort(results.begin(), results.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  t.generate = seconds_since(start);

  // 2. Score: rewards, then group-relative advantages.
  start = Clock::now();
  std::vector<float> rewards;
  for (const model::GenerationResult& r : results) {
    rewards.push_back(reward_(r.prompt, r.tokens));
    report.generated_tokens += static_cast<int64_t>(r.tokens.size());
    report.mean_reward += rewards.back() / static_cast<double>(results.size());
  }
  absl::StatusOr<std::vector<float>> advantages = rl::group_advantages(rewards, G);
  if (!advantages.ok()) return with_prefix(advantages.status(), "score: ");
  GrpoRequest request;
  request.loss = config_.loss;
  request.temperature = config_.temperature;
  request.minibatches = config_.minibatches;
  for (size_t i = 0; i < results.size(); ++i) {
    const model::GenerationResult& r = results[i];
    Sequence s;
    s.tokens = r.prompt;
    s.tokens.insert(s.tokens.end(), r.tokens.begin(), r.tokens.end());
    s.prompt_length = static_cast<int64_t>(r.prompt.size());
    s.gen_logprobs = r.full_logprobs;
    s.advantage = (*advantages)[i];
    request.batch.push_back(std::move(s));
  }
  t.score = seconds_since(start);
  report.samples = static_cast<int64_t>(results.size());

  // 3. Train: prev logprobs, forward/backward, AdamW (with the re-quantization).
  absl::StatusOr<GrpoResult> trained = learner_->grpo_update(request);
  if (!trained.ok()) return with_prefix(trained.status(), "train: ");
  t.logprobs = trained->logprob_seconds;
  t.forward_backward = trained->forward_backward_seconds;
  t.optimizer = trained->optimizer_seconds;
  report.train = std::move(*trained);
  // The re-quantization alone (idempotent: the same codes and scales again).
  start = Clock::now();
  learner_->backend().requantize();
  t.requantize = seconds_since(start);

  // 4. Publish: KV calibration from the update's forward, export, install for generation.
  ++steps_;
  const int64_t version = learner_->published_version() + 1;
  if (auto s = publish(version, &t); !s.ok()) return s;
  report.version = version;
  return report;
}

}  // namespace fp8rl::train
