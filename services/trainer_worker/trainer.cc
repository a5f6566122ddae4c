// The Trainer: validation, the GRPO/SFT updates, publish (calibrate + re-quantize + upload) and
// checkpoints. See trainer.h for the contract.
#include "services/trainer_worker/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/safetensors.h"
#include "model/kv_calibration.h"
#include "rl/mismatch.h"

namespace fp8rl::trainer {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kNoPolicy[] = "no policy loaded: call InitPolicy or LoadCheckpoint first";
constexpr int64_t kMaxEpochs = 64;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

absl::Status prefixed(const absl::Status& s, const std::string& prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

const char* format_name(v1::WeightFormat f) { return f == v1::WEIGHT_FORMAT_FP8 ? "fp8" : "bf16"; }

absl::StatusOr<v1::WeightFormat> parse_format(const std::string& name, const std::string& field) {
  if (name == "fp8") return v1::WEIGHT_FORMAT_FP8;
  if (name == "bf16") return v1::WEIGHT_FORMAT_BF16;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown format '", name, "' (expected fp8 or bf16)"));
}

// Fills UNSPECIFIED formats with the defaults (training fp8, generation = training, KV cache
// bf16) and checks the layer counts.
absl::StatusOr<v1::PrecisionSpec> resolve_precision(const v1::PrecisionSpec& in) {
  v1::PrecisionSpec p = in;
  auto check = [](v1::WeightFormat f, const char* field) -> absl::Status {
    if (f == v1::WEIGHT_FORMAT_UNSPECIFIED || f == v1::WEIGHT_FORMAT_FP8 ||
        f == v1::WEIGHT_FORMAT_BF16) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": unknown weight format ", static_cast<int>(f)));
  };
  if (auto s = check(p.training(), "precision.training"); !s.ok()) return s;
  if (auto s = check(p.generation(), "precision.generation"); !s.ok()) return s;
  if (auto s = check(p.kv_cache(), "precision.kv_cache"); !s.ok()) return s;
  if (p.training() == v1::WEIGHT_FORMAT_UNSPECIFIED) p.set_training(v1::WEIGHT_FORMAT_FP8);
  if (p.generation() == v1::WEIGHT_FORMAT_UNSPECIFIED) p.set_generation(p.training());
  if (p.kv_cache() == v1::WEIGHT_FORMAT_UNSPECIFIED) p.set_kv_cache(v1::WEIGHT_FORMAT_BF16);
  if (p.bf16_first_layers() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("precision.bf16_first_layers: must be >= 0, got ", p.bf16_first_layers()));
  }
  if (p.bf16_last_layers() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("precision.bf16_last_layers: must be >= 0, got ", p.bf16_last_layers()));
  }
  return p;
}

// The model's precision policy for linears in `linear` (the training or generation format).
model::PrecisionPolicy to_policy(const v1::PrecisionSpec& p, v1::WeightFormat linear) {
  model::PrecisionPolicy policy;
  policy.linear =
      linear == v1::WEIGHT_FORMAT_FP8 ? model::Precision::kFP8 : model::Precision::kBF16;
  policy.kv_cache = p.kv_cache() == v1::WEIGHT_FORMAT_FP8 ? model::KvCacheDtype::kFP8
                                                          : model::KvCacheDtype::kBF16;
  policy.pow2_scales = p.pow2_scales();
  policy.bf16_first_layers = p.bf16_first_layers();
  policy.bf16_last_layers = p.bf16_last_layers();
  return policy;
}

// AdamW settings from the request; an absent message gives the AdamWConfig defaults, and 0 for
// beta2 / epsilon means their defaults (0.999 / 1e-8).
absl::StatusOr<model::AdamWConfig> to_adamw(const v1::InitPolicyRequest& request) {
  model::AdamWConfig c;
  if (request.has_optimizer()) {
    const v1::OptimizerParams& o = request.optimizer();
    if (!(o.learning_rate() > 0) || !std::isfinite(o.learning_rate())) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer.learning_rate: must be > 0, got ", o.learning_rate()));
    }
    c.lr = o.learning_rate();
    c.beta1 = o.beta1();
    c.beta2 = o.beta2() == 0 ? 0.999 : o.beta2();
    c.eps = o.epsilon() == 0 ? 1e-8 : o.epsilon();
    c.weight_decay = o.weight_decay();
    c.max_grad_norm = o.max_grad_norm();
  }
  if (auto s = model::validate_adamw_config(c); !s.ok()) return prefixed(s, "optimizer.");
  return c;
}

nlohmann::json adamw_to_json(const model::AdamWConfig& c) {
  return {{"lr", c.lr},
          {"beta1", c.beta1},
          {"beta2", c.beta2},
          {"eps", c.eps},
          {"weight_decay", c.weight_decay},
          {"max_grad_norm", c.max_grad_norm}};
}

absl::StatusOr<std::string> model_config_text(const std::string& value) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(value);
  if (trimmed.empty()) {
    return absl::InvalidArgumentError("model.init.model_config_json: required");
  }
  if (trimmed.front() == '{') return std::string(trimmed);
  // Not JSON text: a path to a config.json (the coordinator forwards job configs' paths).
  absl::StatusOr<std::string> text = read_text_file(std::string(trimmed));
  if (!text.ok()) return prefixed(text.status(), "model.init.model_config_json: ");
  return text;
}

// A checkpoint folder's trainer_state.json as JSON (an empty object when absent and optional).
absl::StatusOr<nlohmann::json> read_state(const std::string& dir, bool required) {
  const std::string path = (std::filesystem::path(dir) / kTrainerStateFile).string();
  if (!std::filesystem::exists(path)) {
    if (!required) return nlohmann::json::object();
    return absl::InvalidArgumentError(absl::StrCat("path: '", dir, "' has no ", kTrainerStateFile,
                                                   " (not written by SaveCheckpoint)"));
  }
  absl::StatusOr<std::string> text = read_text_file(path);
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  return j;
}

struct ScaleStats {
  double min = 0, mean = 0, max = 0;
  int64_t count = 0;
};
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

uint64_t folder_bytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  }
  return total;
}

// dLoss/dlogprob in the model's layout (value [i-1] belongs to token i) from the padded [B*L]
// gradient over response tokens.
model::TokenValues scatter_response(const PackedBatch& batch, const std::vector<float>& padded) {
  model::TokenValues out(batch.size());
  const int64_t L = batch.length;
  for (int64_t b = 0; b < batch.size(); ++b) {
    const int64_t n = static_cast<int64_t>(batch.tokens[b].size());
    const int64_t p = batch.prompt_length[b];
    out[b].assign(n - 1, 0.0f);
    for (int64_t j = 0; j < n - p; ++j) out[b][p - 1 + j] = padded[b * L + j];
  }
  return out;
}

// The temperature whose logits / T distribution the logprobs are taken of: the sampling
// temperature of the rollouts; 0 (unset, or greedy rollouts) means 1.
absl::StatusOr<float> logprob_temperature(double t, const char* field) {
  if (!std::isfinite(t) || t < 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must be >= 0 and finite, got ", t));
  }
  return t == 0 ? 1.0f : static_cast<float>(t);
}

}  // namespace

PackedBatch PackedBatch::slice(int64_t begin, int64_t end) const {
  PackedBatch out;
  out.length = length;
  out.tokens.assign(tokens.begin() + begin, tokens.begin() + end);
  out.prompt_length.assign(prompt_length.begin() + begin, prompt_length.begin() + end);
  out.mask.assign(mask.begin() + begin * length, mask.begin() + end * length);
  out.gen_logprobs.assign(gen_logprobs.begin() + begin * length,
                          gen_logprobs.begin() + end * length);
  out.advantages.assign(advantages.begin() + begin, advantages.begin() + end);
  out.temperature = temperature;
  for (uint8_t m : out.mask) out.valid_tokens += m;
  return out;
}

Trainer::Trainer(TrainerOptions options, WeightPublisher* publisher, TrainerMetrics* metrics)
    : options_(std::move(options)), publisher_(publisher), metrics_(metrics) {
  status_.set_worker_id(options_.worker_id);
}

absl::Status Trainer::check_job(const std::string& job_id) const {
  if (!model_) return absl::AbortedError(kNoPolicy);
  if (job_id != job_id_) {
    return absl::AbortedError(absl::StrCat("job_id: the policy belongs to job '", job_id_,
                                           "', not '", job_id, "' (call InitPolicy first)"));
  }
  if (stopping_.load()) return absl::UnavailableError("trainer is shutting down");
  return absl::OkStatus();
}

absl::StatusOr<PackedBatch> Trainer::pack(
    const google::protobuf::RepeatedPtrField<v1::TrainSequence>& seqs, const std::string& name,
    bool require_gen) const {
  if (seqs.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": must not be empty"));
  PackedBatch b;
  for (int i = 0; i < seqs.size(); ++i) {
    const v1::TrainSequence& s = seqs[i];
    const std::string field = absl::StrCat(name, "[", i, "]");
    const int64_t n = s.tokens_size();
    if (n < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".tokens: needs a prompt and a response (>= 2 tokens), got ", n));
    }
    if (s.prompt_length() < 1 || s.prompt_length() >= n) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".prompt_length: must be in [1, ",
                                                     n - 1, "], got ", s.prompt_length()));
    }
    std::vector<int32_t> tokens(s.tokens().begin(), s.tokens().end());
    if (auto st = model_->check_tokens(tokens); !st.ok()) {
      return prefixed(st, absl::StrCat(field, ".tokens: "));
    }
    const int64_t resp = n - s.prompt_length();
    if (s.loss_mask_size() != 0 && s.loss_mask_size() != resp) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".loss_mask: has ", s.loss_mask_size(),
                                                     " values, the response has ", resp,
                                                     " tokens"));
    }
    for (int j = 0; j < s.loss_mask_size(); ++j) {
      if (s.loss_mask(j) != 0.0f && s.loss_mask(j) != 1.0f) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".loss_mask[", j, "]: must be 0 or 1, got ", s.loss_mask(j)));
      }
    }
    if (s.gen_logprobs_size() != resp && (require_gen || s.gen_logprobs_size() != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".gen_logprobs: has ", s.gen_logprobs_size(), " values, the response has ", resp,
          " tokens", require_gen ? "" : " (or leave it empty)"));
    }
    if (!std::isfinite(s.advantage())) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".advantage: must be finite"));
    }
    b.length = std::max(b.length, resp);
    b.tokens.push_back(std::move(tokens));
    b.prompt_length.push_back(s.prompt_length());
    b.advantages.push_back(s.advantage());
  }
  const int64_t B = b.size(), L = b.length;
  b.mask.assign(B * L, 0);
  b.gen_logprobs.assign(B * L, 0.0f);
  for (int64_t i = 0; i < B; ++i) {
    const v1::TrainSequence& s = seqs[static_cast<int>(i)];
    const int resp =
        static_cast<int>(static_cast<int64_t>(b.tokens[i].size()) - b.prompt_length[i]);
    for (int j = 0; j < resp; ++j) {
      const bool on = s.loss_mask_size() == 0 || s.loss_mask(j) != 0.0f;
      b.mask[i * L + j] = on ? 1 : 0;
      b.valid_tokens += on ? 1 : 0;
      if (s.gen_logprobs_size() != 0) b.gen_logprobs[i * L + j] = s.gen_logprobs(j);
    }
  }
  return b;
}

absl::StatusOr<rl::PolicyLossConfig> Trainer::loss_config(const v1::AlgorithmParams& a) const {
  rl::PolicyLossConfig c;
  if (!(a.clip_epsilon() > 0 && a.clip_epsilon() < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm.clip_epsilon: must be in (0, 1), got ", a.clip_epsilon()));
  }
  c.clip_eps = a.clip_epsilon();
  if (!(a.kl_beta() >= 0) || !std::isfinite(a.kl_beta())) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm.kl_beta: must be >= 0, got ", a.kl_beta()));
  }
  if (a.kl_beta() > 0 && !reference_) {
    return absl::FailedPreconditionError(
        "algorithm.kl_beta: > 0 needs a reference policy (InitPolicy with keep_reference)");
  }
  c.kl_beta = a.kl_beta();
  const rl::IsConfig defaults;
  switch (a.is_rule()) {
    case v1::IS_RULE_UNSPECIFIED:
    case v1::IS_RULE_TIS:
      c.is.rule = rl::IsRule::kTis;
      break;
    case v1::IS_RULE_NONE:
      c.is.rule = rl::IsRule::kNone;
      break;
    case v1::IS_RULE_ICEPOP:
      c.is.rule = rl::IsRule::kIcepop;
      break;
    case v1::IS_RULE_SEQ_MASK_TIS:
      c.is.rule = rl::IsRule::kSeqMaskTis;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("algorithm.is_rule: unknown rule ", static_cast<int>(a.is_rule())));
  }
  // Bounds left at 0 take the defaults of rl/importance.h.
  if (!std::isfinite(a.is_lower()) || a.is_lower() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm.is_lower: must be >= 0, got ", a.is_lower()));
  }
  if (!std::isfinite(a.is_upper()) || a.is_upper() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm.is_upper: must be >= 0, got ", a.is_upper()));
  }
  c.is.cap = a.is_upper() > 0 ? a.is_upper() : defaults.cap;
  c.is.hi = a.is_upper() > 0 ? a.is_upper() : defaults.hi;
  c.is.lo = a.is_lower() > 0 ? a.is_lower() : defaults.lo;
  if (auto s = rl::validate_is_config(c.is, "algorithm.is"); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        s.message(), " (from algorithm.is_lower=", a.is_lower(), ", is_upper=", a.is_upper(), ")"));
  }
  return c;
}

absl::StatusOr<std::vector<float>> Trainer::response_logprobs(const model::Model& model,
                                                              const PackedBatch& batch,
                                                              model::ForwardContext* ctx) const {
  model::TrainForwardOptions options;
  options.temperature = batch.temperature;
  absl::StatusOr<model::TokenValues> lp = model.forward(batch.tokens, options, ctx);
  if (!lp.ok()) return lp.status();
  const int64_t L = batch.length;
  std::vector<float> out(batch.size() * L, 0.0f);
  for (int64_t b = 0; b < batch.size(); ++b) {
    const int64_t p = batch.prompt_length[b];
    const int64_t resp = static_cast<int64_t>(batch.tokens[b].size()) - p;
    for (int64_t j = 0; j < resp; ++j) out[b * L + j] = (*lp)[b][p - 1 + j];
  }
  return out;
}

absl::StatusOr<rl::PolicyLossResult> Trainer::minibatch_gradient(const PackedBatch& mb,
                                                                 std::span<const float> prev,
                                                                 std::span<const float> ref,
                                                                 const rl::PolicyLossConfig& config,
                                                                 std::vector<float>* grads) const {
  model::ForwardContext ctx;
  absl::StatusOr<std::vector<float>> cur = response_logprobs(*model_, mb, &ctx);
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
  if (!loss.ok()) return loss.status();
  grads->assign(model_->num_params(), 0.0f);
  if (auto s = model_->backward(ctx, scatter_response(mb, loss->dloss_dcur), grads->data());
      !s.ok()) {
    return s;
  }
  return loss;
}

absl::Status Trainer::set_learning_rate(double lr) {
  if (lr == optimizer_->config().lr) return absl::OkStatus();
  return optimizer_->set_lr(lr);
}

absl::StatusOr<v1::InitPolicyResponse> Trainer::init_policy(const v1::InitPolicyRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load()) return absl::UnavailableError("trainer is shutting down");
  if (request.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  absl::StatusOr<v1::PrecisionSpec> precision = resolve_precision(request.precision());
  if (!precision.ok()) return precision.status();
  absl::StatusOr<model::AdamWConfig> adamw = to_adamw(request);
  if (!adamw.ok()) return adamw.status();
  const model::PrecisionPolicy policy = to_policy(*precision, precision->training());

  std::unique_ptr<model::Model> model;
  int64_t version = 0;
  switch (request.model().source_case()) {
    case v1::ModelSpec::kCheckpointDir: {
      const std::string& dir = request.model().checkpoint_dir();
      absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Load(dir, policy);
      if (!m.ok()) return prefixed(m.status(), "model.checkpoint_dir: ");
      absl::StatusOr<nlohmann::json> state = read_state(dir, /*required=*/false);
      if (!state.ok()) return prefixed(state.status(), "model.checkpoint_dir: ");
      const nlohmann::json v = state->value("version", nlohmann::json(0));
      version = v.is_number_integer() ? v.get<int64_t>() : 0;
      model = std::move(*m);
      break;
    }
    case v1::ModelSpec::kInit: {
      absl::StatusOr<std::string> text =
          model_config_text(request.model().init().model_config_json());
      if (!text.ok()) return text.status();
      absl::StatusOr<model::ModelConfig> config = model::parse_model_config(*text);
      if (!config.ok()) return prefixed(config.status(), "model.init.model_config_json: ");
      absl::StatusOr<std::unique_ptr<model::Model>> m =
          model::Model::Init(*config, policy, request.model().init().seed());
      if (!m.ok()) return prefixed(m.status(), "model.init: ");
      model = std::move(*m);
      break;
    }
    default:
      return absl::InvalidArgumentError("model: set checkpoint_dir or init");
  }
  std::unique_ptr<model::Model> reference;
  if (request.keep_reference()) {
    absl::StatusOr<model::WeightSet> copy = model->export_weights(model::WeightFormat::kF32);
    if (!copy.ok()) return copy.status();
    absl::StatusOr<std::unique_ptr<model::Model>> r = model::Model::FromWeightSet(*copy, policy);
    if (!r.ok()) return r.status();
    reference = std::move(*r);
  }
  auto optimizer = std::make_unique<model::AdamW>(*model, *adamw);
  install(std::move(model), std::move(reference), std::move(optimizer), *precision,
          request.job_id(), version, version);

  v1::InitPolicyResponse response;
  response.set_version(version_);
  response.set_num_parameters(model_->num_params());
  response.set_model_config_json(model::model_config_to_json(model_->config()));
  return response;
}

absl::StatusOr<v1::ComputeLogprobsResponse> Trainer::compute_logprobs(
    const v1::ComputeLogprobsRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!model_) return absl::AbortedError(kNoPolicy);
  if (request.use_reference() && !reference_) {
    return absl::FailedPreconditionError(
        "use_reference: no reference policy (InitPolicy with keep_reference)");
  }
  absl::StatusOr<PackedBatch> batch = pack(request.sequences(), "sequences", false);
  if (!batch.ok()) return batch.status();
  absl::StatusOr<float> temperature = logprob_temperature(request.temperature(), "temperature");
  if (!temperature.ok()) return temperature.status();
  batch->temperature = *temperature;
  absl::StatusOr<std::vector<float>> lp =
      response_logprobs(request.use_reference() ? *reference_ : *model_, *batch, nullptr);
  if (!lp.ok()) return lp.status();
  v1::ComputeLogprobsResponse response;
  const int64_t L = batch->length;
  for (int64_t b = 0; b < batch->size(); ++b) {
    const int64_t resp = static_cast<int64_t>(batch->tokens[b].size()) - batch->prompt_length[b];
    auto* out = response.add_sequences()->mutable_logprobs();
    out->Add(lp->begin() + b * L, lp->begin() + b * L + resp);
  }
  response.set_version(version_);
  return response;
}

absl::StatusOr<Trainer::PreparedStep> Trainer::prepare_step(const v1::TrainStepRequest& request) {
  if (auto s = check_job(request.job_id()); !s.ok()) return s;
  PreparedStep p;
  absl::StatusOr<PackedBatch> batch = pack(request.batch(), "batch", /*require_gen=*/true);
  if (!batch.ok()) return batch.status();
  p.batch = std::move(*batch);
  const v1::AlgorithmParams& alg = request.algorithm();
  absl::StatusOr<float> temperature =
      logprob_temperature(alg.temperature(), "algorithm.temperature");
  if (!temperature.ok()) return temperature.status();
  p.batch.temperature = *temperature;
  absl::StatusOr<rl::PolicyLossConfig> config = loss_config(alg);
  if (!config.ok()) return config.status();
  p.config = *config;
  if (alg.minibatches() < 1 || alg.minibatches() > p.batch.size()) {
    return absl::InvalidArgumentError(absl::StrCat("algorithm.minibatches: must be in [1, ",
                                                   p.batch.size(), "] (the batch size), got ",
                                                   alg.minibatches()));
  }
  if (!std::isfinite(alg.learning_rate()) || alg.learning_rate() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm.learning_rate: must be >= 0, got ", alg.learning_rate()));
  }
  if (alg.epochs() < 0 || alg.epochs() > kMaxEpochs) {
    return absl::InvalidArgumentError(absl::StrCat("algorithm.epochs: must be in [0, ", kMaxEpochs,
                                                   "] (0 = 1), got ", alg.epochs()));
  }
  // prev_logprobs: the policy at the rollout version, before any update, same kernels.
  const auto start = Clock::now();
  absl::StatusOr<std::vector<float>> prev = response_logprobs(*model_, p.batch, nullptr);
  if (!prev.ok()) return prev.status();
  p.prev = std::move(*prev);
  if (p.config.kl_beta > 0) {
    absl::StatusOr<std::vector<float>> ref = response_logprobs(*reference_, p.batch, nullptr);
    if (!ref.ok()) return ref.status();
    p.ref = std::move(*ref);
  }
  p.logprob_seconds = seconds_since(start);
  return p;
}

absl::StatusOr<PolicyGradient> Trainer::gradient(const v1::TrainStepRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<PreparedStep> p = prepare_step(request);
  if (!p.ok()) return p.status();
  PolicyGradient out;
  absl::StatusOr<rl::PolicyLossResult> loss =
      minibatch_gradient(p->batch, p->prev, p->ref, p->config, &out.grads);
  if (!loss.ok()) return loss.status();
  out.loss = std::move(*loss);
  out.prev_logprobs = std::move(p->prev);
  return out;
}

absl::StatusOr<v1::TrainStepResponse> Trainer::train_step(const v1::TrainStepRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<PreparedStep> prepared = prepare_step(request);
  if (!prepared.ok()) return prepared.status();
  const PackedBatch& batch = prepared->batch;
  const rl::PolicyLossConfig& config = prepared->config;
  const std::vector<float>& prev = prepared->prev;
  const std::vector<float>& ref = prepared->ref;
  const double logprob_seconds = prepared->logprob_seconds;
  const v1::AlgorithmParams& alg = request.algorithm();
  if (alg.learning_rate() > 0) {
    if (auto s = set_learning_rate(alg.learning_rate()); !s.ok()) return s;
  }
  const int64_t B = batch.size(), L = batch.length;
  absl::StatusOr<rl::MismatchMetrics> mismatch =
      rl::mismatch_metrics(prev, batch.gen_logprobs, batch.mask, batch.layout(), config.is);
  if (!mismatch.ok()) return mismatch.status();

  const int64_t m = alg.minibatches();
  const int64_t epochs = std::max<int64_t>(1, alg.epochs());
  const int64_t updates = epochs * m;
  double loss = 0, pg = 0, kl = 0, grad_norm = 0, clipped_tokens = 0, lr = 0;
  double fb_seconds = 0, opt_seconds = 0;
  std::vector<float> grads;
  // Epoch e, minibatch i is update u = e * m + i; every pass sees the same minibatches in the
  // same order, against the same prev logprobs (PPO's ratio is relative to the rollout policy).
  for (int64_t u = 0; u < updates; ++u) {
    const int64_t i = u % m;
    if (stopping_.load()) {
      return interrupted(u, absl::UnavailableError(absl::StrCat("trainer is shutting down (after ",
                                                                u, " of ", updates, " updates)")));
    }
    const int64_t s0 = B * i / m, s1 = B * (i + 1) / m;
    const PackedBatch mb = batch.slice(s0, s1);
    const std::span<const float> prev_mb(prev.data() + s0 * L, (s1 - s0) * L);
    const std::span<const float> ref_mb =
        ref.empty() ? std::span<const float>()
                    : std::span<const float>(ref.data() + s0 * L, (s1 - s0) * L);
    auto start = Clock::now();
    absl::StatusOr<rl::PolicyLossResult> result =
        minibatch_gradient(mb, prev_mb, ref_mb, config, &grads);
    const std::string where = epochs > 1 ? absl::StrCat("epoch ", u / m, " minibatch ", i, ": ")
                                         : absl::StrCat("minibatch ", i, ": ");
    if (!result.ok()) return interrupted(u, prefixed(result.status(), where));
    fb_seconds += seconds_since(start);
    start = Clock::now();
    absl::StatusOr<model::OptimizerStepStats> step = optimizer_->step(*model_, grads.data());
    if (!step.ok()) return interrupted(u, prefixed(step.status(), where));
    opt_seconds += seconds_since(start);
    const double share = 1.0 / static_cast<double>(updates);
    loss += result->loss * share;
    pg += result->stats.policy_loss * share;
    kl += result->stats.kl * share;
    grad_norm += step->grad_norm * share;
    clipped_tokens += result->stats.clip_fraction *
                      static_cast<double>(result->stats.valid_tokens) / static_cast<double>(epochs);
    lr = step->lr;
  }
  ++version_;
  last_batch_ = batch.tokens;
  update_status();

  v1::TrainStepResponse response;
  response.set_loss(loss);
  response.set_pg_loss(pg);
  response.set_kl(kl);
  response.set_grad_norm(grad_norm);
  response.set_learning_rate(lr);
  response.set_clip_fraction(
      batch.valid_tokens > 0 ? clipped_tokens / static_cast<double>(batch.valid_tokens) : 0.0);
  response.set_tokens(batch.valid_tokens);
  v1::MismatchMetrics* mm = response.mutable_mismatch();
  mm->set_token_mult_prob_error(mismatch->token_mult_prob_error);
  mm->set_gen_kl_error(mismatch->gen_kl_error);
  mm->set_sampling_importance_ratio(mismatch->sampling_importance_ratio);
  mm->set_is_oob_ratio(mismatch->is_oob_ratio);
  mm->set_probs_ratio_min(mismatch->probs_ratio_min);
  mm->set_probs_ratio_max(mismatch->probs_ratio_max);
  response.set_version(version_);
  (*response.mutable_phase_seconds())["logprobs"] = logprob_seconds;
  (*response.mutable_phase_seconds())["forward_backward"] = fb_seconds;
  (*response.mutable_phase_seconds())["optimizer"] = opt_seconds;

  if (metrics_ != nullptr) {
    metrics_->steps->with({"grpo"}).inc(static_cast<double>(updates));
    metrics_->tokens->get().inc(static_cast<double>(batch.valid_tokens));
    metrics_->loss->get().set(loss);
    metrics_->grad_norm->get().set(grad_norm);
    metrics_->learning_rate->get().set(lr);
    metrics_->phase_seconds->with({"logprobs"}).set(logprob_seconds);
    metrics_->phase_seconds->with({"forward_backward"}).set(fb_seconds);
    metrics_->phase_seconds->with({"optimizer"}).set(opt_seconds);
    metrics_->is_weight->with({"mean"}).set(mismatch->sampling_importance_ratio);
    metrics_->is_weight->with({"min"}).set(mismatch->probs_ratio_min);
    metrics_->is_weight->with({"max"}).set(mismatch->probs_ratio_max);
    metrics_->token_mult_prob_error->get().set(mismatch->token_mult_prob_error);
    metrics_->gen_kl_error->get().set(mismatch->gen_kl_error);
    metrics_->sampling_importance_ratio->get().set(mismatch->sampling_importance_ratio);
    metrics_->is_oob_ratio->get().set(mismatch->is_oob_ratio);
    metrics_->probs_ratio_min->get().set(mismatch->probs_ratio_min);
    metrics_->probs_ratio_max->get().set(mismatch->probs_ratio_max);
  }
  return response;
}

absl::StatusOr<v1::SftStepResponse> Trainer::sft_step(const v1::SftStepRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto s = check_job(request.job_id()); !s.ok()) return s;
  absl::StatusOr<PackedBatch> batch = pack(request.batch(), "batch", /*require_gen=*/false);
  if (!batch.ok()) return batch.status();
  const int64_t B = batch->size();
  if (!(request.learning_rate() > 0) || !std::isfinite(request.learning_rate())) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning_rate: must be > 0, got ", request.learning_rate()));
  }
  if (request.minibatches() < 1 || request.minibatches() > B) {
    return absl::InvalidArgumentError(absl::StrCat(
        "minibatches: must be in [1, ", B, "] (the batch size), got ", request.minibatches()));
  }
  if (auto s = set_learning_rate(request.learning_rate()); !s.ok()) return s;

  const int64_t m = request.minibatches();
  double loss = 0, grad_norm = 0, lr = 0, fb_seconds = 0, opt_seconds = 0;
  std::vector<float> grads;
  for (int64_t i = 0; i < m; ++i) {
    if (stopping_.load()) return interrupted(i, absl::UnavailableError("trainer is shutting down"));
    const PackedBatch mb = batch->slice(B * i / m, B * (i + 1) / m);
    auto start = Clock::now();
    model::ForwardContext ctx;
    absl::StatusOr<std::vector<float>> cur = response_logprobs(*model_, mb, &ctx);
    if (!cur.ok()) return interrupted(i, cur.status());
    absl::StatusOr<rl::SftLossResult> nll = rl::sft_nll_loss(*cur, mb.mask);
    if (!nll.ok()) return interrupted(i, nll.status());
    grads.assign(model_->num_params(), 0.0f);
    if (auto s = model_->backward(ctx, scatter_response(mb, nll->dloss_dlogp), grads.data());
        !s.ok()) {
      return interrupted(i, s);
    }
    fb_seconds += seconds_since(start);
    start = Clock::now();
    absl::StatusOr<model::OptimizerStepStats> step = optimizer_->step(*model_, grads.data());
    if (!step.ok())
      return interrupted(i, prefixed(step.status(), absl::StrCat("minibatch ", i, ": ")));
    opt_seconds += seconds_since(start);
    loss += nll->loss / static_cast<double>(m);
    grad_norm += step->grad_norm / static_cast<double>(m);
    lr = step->lr;
  }
  ++version_;
  last_batch_ = batch->tokens;
  update_status();
  if (metrics_ != nullptr) {
    metrics_->steps->with({"sft"}).inc(static_cast<double>(m));
    metrics_->tokens->get().inc(static_cast<double>(batch->valid_tokens));
    metrics_->loss->get().set(loss);
    metrics_->grad_norm->get().set(grad_norm);
    metrics_->learning_rate->get().set(lr);
    metrics_->phase_seconds->with({"forward_backward"}).set(fb_seconds);
    metrics_->phase_seconds->with({"optimizer"}).set(opt_seconds);
  }
  v1::SftStepResponse response;
  response.set_loss(loss);
  response.set_grad_norm(grad_norm);
  response.set_tokens(batch->valid_tokens);
  response.set_version(version_);
  return response;
}

absl::StatusOr<model::WeightSet> Trainer::export_for_generation(v1::WeightFormat format,
                                                                int64_t version) const {
  if (format == v1::WEIGHT_FORMAT_BF16) {
    return model_->export_weights(model::WeightFormat::kBF16, version);
  }
  if (precision_.training() == v1::WEIGHT_FORMAT_FP8) {
    // The FP8 layers' codes and scales, re-derived from the master weights by the optimizer's
    // refresh() after the last update.
    return model_->export_weights(model::WeightFormat::kFP8, version);
  }
  // Training runs BF16 linears, generation FP8: quantize the master weights (exact fp32 copy)
  // with the generation policy's layer choices.
  absl::StatusOr<model::WeightSet> master = model_->export_weights(model::WeightFormat::kF32);
  if (!master.ok()) return master.status();
  absl::StatusOr<std::unique_ptr<model::Model>> generation =
      model::Model::FromWeightSet(*master, to_policy(precision_, v1::WEIGHT_FORMAT_FP8));
  if (!generation.ok()) return generation.status();
  return (*generation)->export_weights(model::WeightFormat::kFP8, version);
}

absl::StatusOr<v1::PublishResponse> Trainer::publish(const v1::PublishRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!model_) return absl::AbortedError(kNoPolicy);
  if (stopping_.load()) return absl::UnavailableError("trainer is shutting down");
  v1::WeightFormat format = request.format();
  if (format == v1::WEIGHT_FORMAT_UNSPECIFIED) format = precision_.generation();
  if (format != v1::WEIGHT_FORMAT_FP8 && format != v1::WEIGHT_FORMAT_BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("format: unknown weight format ", static_cast<int>(format)));
  }
  const std::string address = request.weight_sync_address().empty()
                                  ? options_.default_weight_sync_address
                                  : request.weight_sync_address();

  // KV scales on the data of the last update (FP8 KV cache only; nothing to do before one).
  auto start = Clock::now();
  const bool calibrate = request.calibrate_kv_scales() &&
                         precision_.kv_cache() == v1::WEIGHT_FORMAT_FP8 && !last_batch_.empty();
  if (calibrate) {
    model::KvCalibrator calibrator(model_->config().num_hidden_layers);
    model::TrainForwardOptions opts;
    opts.calibrator = &calibrator;
    if (auto lp = model_->forward(last_batch_, opts, nullptr); !lp.ok()) {
      return prefixed(lp.status(), "calibrating KV scales: ");
    }
    const model::KvScales scales =
        calibrator.scales(kKvCalibrationPercentile, kKvCalibrationMargin);
    if (auto s = model_->set_kv_scales(scales); !s.ok()) {
      return prefixed(s, "calibrating KV scales: ");
    }
  }
  const double calibrate_seconds = seconds_since(start);

  absl::StatusOr<int64_t> latest = publisher_->latest_version(address);
  if (!latest.ok()) return latest.status();
  const int64_t version = std::max({version_, published_version_ + 1, *latest + 1});

  start = Clock::now();
  absl::StatusOr<model::WeightSet> set = export_for_generation(format, version);
  if (!set.ok()) return set.status();
  // Tell generation workers the policy to run this payload with (services/generation_worker/
  // weight_loader.h reads the "fp8rl_precision" object), so both sides compute the same function.
  {
    nlohmann::json config = nlohmann::json::parse(set->config_json, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InternalError("exported config.json is not a JSON object");
    }
    config["fp8rl_precision"] = {
        {"linear", format == v1::WEIGHT_FORMAT_FP8 ? "fp8" : "bf16"},
        {"kv_cache", precision_.kv_cache() == v1::WEIGHT_FORMAT_FP8 ? "fp8" : "bf16"},
        {"pow2_scales", precision_.pow2_scales()},
        {"bf16_first_layers", precision_.bf16_first_layers()},
        {"bf16_last_layers", precision_.bf16_last_layers()}};
    set->config_json = config.dump(2);
  }
  const double quantize_seconds = seconds_since(start);

  start = Clock::now();
  absl::StatusOr<uint64_t> bytes = publisher_->upload(address, *set, format);
  if (!bytes.ok()) return bytes.status();
  const double upload_seconds = seconds_since(start);

  version_ = version;
  published_version_ = version;
  update_status();

  std::vector<float> block_scales;
  for (const model::NamedTensor& t : set->tensors) {
    if (!t.name.ends_with("_scale_inv")) continue;
    absl::StatusOr<std::vector<float>> values = model::tensor_to_f32(t);
    if (!values.ok()) return values.status();
    block_scales.insert(block_scales.end(), values->begin(), values->end());
  }
  const ScaleStats ws = stats_of(block_scales);
  const ScaleStats ks = stats_of(model_->kv_scales().k), vs = stats_of(model_->kv_scales().v);

  v1::PublishResponse response;
  response.set_version(version);
  response.set_bytes(*bytes);
  response.set_quantize_seconds(quantize_seconds);
  response.set_calibrate_seconds(calibrate_seconds);
  response.set_upload_seconds(upload_seconds);
  response.set_weight_scale_min(ws.min);
  response.set_weight_scale_max(ws.max);
  response.set_kv_scale_mean(ks.count + vs.count > 0 ? (ks.mean * static_cast<double>(ks.count) +
                                                        vs.mean * static_cast<double>(vs.count)) /
                                                           static_cast<double>(ks.count + vs.count)
                                                     : 0.0);
  if (metrics_ != nullptr) {
    metrics_->policy_version->get().set(static_cast<double>(version));
    metrics_->phase_seconds->with({"quantize"}).set(quantize_seconds);
    metrics_->phase_seconds->with({"calibrate"}).set(calibrate_seconds);
    metrics_->phase_seconds->with({"publish"}).set(upload_seconds);
    metrics_->recalibration_seconds->get().set(quantize_seconds + calibrate_seconds);
    metrics_->weight_scale_inv->with({"min"}).set(ws.min);
    metrics_->weight_scale_inv->with({"mean"}).set(ws.mean);
    metrics_->weight_scale_inv->with({"max"}).set(ws.max);
    for (const auto& [name, s] : {std::pair{"k", ks}, std::pair{"v", vs}}) {
      metrics_->kv_scale->with({name, "min"}).set(s.min);
      metrics_->kv_scale->with({name, "mean"}).set(s.mean);
      metrics_->kv_scale->with({name, "max"}).set(s.max);
    }
  }
  last_published_ = std::move(*set);
  return response;
}

absl::StatusOr<v1::SaveCheckpointResponse> Trainer::save_checkpoint(
    const v1::SaveCheckpointRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!model_) return absl::AbortedError(kNoPolicy);
  if (request.path().empty()) return absl::InvalidArgumentError("path: required");
  const std::filesystem::path dir = std::filesystem::absolute(resolve_path(request.path()));
  std::error_code ec;
  std::filesystem::create_directories(dir.parent_path(), ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("path: cannot create '", dir.parent_path().string(), "': ", ec.message()));
  }
  absl::StatusOr<model::WeightSet> set =
      model_->export_weights(model::WeightFormat::kF32, version_);
  if (!set.ok()) return set.status();
  const nlohmann::json state = {{"format", "fp8rl-trainer-checkpoint"},
                                {"version", version_},
                                {"published_version", published_version_},
                                {"job_id", job_id_},
                                {"precision",
                                 {{"training", format_name(precision_.training())},
                                  {"generation", format_name(precision_.generation())},
                                  {"kv_cache", format_name(precision_.kv_cache())},
                                  {"pow2_scales", precision_.pow2_scales()},
                                  {"bf16_first_layers", precision_.bf16_first_layers()},
                                  {"bf16_last_layers", precision_.bf16_last_layers()}}},
                                {"optimizer", adamw_to_json(optimizer_->config())},
                                {"optimizer_state", request.include_optimizer()},
                                {"reference", reference_ != nullptr}};
  absl::Status written = write_dir_atomic(dir.string(), [&](const std::string& tmp) {
    SafetensorsWriter writer;
    if (auto s = model::add_to_writer(*set, &writer); !s.ok()) return s;
    writer.set_metadata("format", "pt");
    if (auto s = writer.write(tmp + "/model.safetensors"); !s.ok()) return s;
    if (auto s = write_file_atomic(tmp + "/config.json", set->config_json); !s.ok()) return s;
    if (request.include_optimizer()) {
      if (auto s = optimizer_->save_state(tmp + "/" + kOptimizerStateFile); !s.ok()) return s;
    }
    if (reference_) {
      if (auto s = reference_->save(tmp + "/" + kReferenceDir, model::WeightFormat::kF32);
          !s.ok()) {
        return s;
      }
    }
    return write_file_atomic(tmp + "/" + kTrainerStateFile, state.dump(2));
  });
  if (!written.ok()) return prefixed(written, "SaveCheckpoint: ");
  v1::SaveCheckpointResponse response;
  response.set_path(dir.string());
  response.set_bytes(folder_bytes(dir.string()));
  response.set_version(version_);
  return response;
}

absl::StatusOr<v1::LoadCheckpointResponse> Trainer::load_checkpoint(
    const v1::LoadCheckpointRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load()) return absl::UnavailableError("trainer is shutting down");
  if (request.path().empty()) return absl::InvalidArgumentError("path: required");
  const std::string dir = resolve_path(request.path());
  absl::StatusOr<nlohmann::json> state = read_state(dir, /*required=*/true);
  if (!state.ok()) return state.status();
  const std::string what = absl::StrCat(dir, "/", kTrainerStateFile, ": ");
  v1::PrecisionSpec precision;
  model::AdamWConfig adamw;
  int64_t version = 0, published = 0;
  std::string job_id;
  bool has_optimizer = false;
  try {
    const nlohmann::json& p = state->at("precision");
    absl::StatusOr<v1::WeightFormat> training =
        parse_format(p.at("training").get<std::string>(), "precision.training");
    absl::StatusOr<v1::WeightFormat> generation =
        parse_format(p.at("generation").get<std::string>(), "precision.generation");
    absl::StatusOr<v1::WeightFormat> kv_cache =
        parse_format(p.at("kv_cache").get<std::string>(), "precision.kv_cache");
    for (const auto* f : {&training, &generation, &kv_cache}) {
      if (!f->ok()) return prefixed(f->status(), what);
    }
    precision.set_training(*training);
    precision.set_generation(*generation);
    precision.set_kv_cache(*kv_cache);
    precision.set_pow2_scales(p.at("pow2_scales").get<bool>());
    precision.set_bf16_first_layers(p.at("bf16_first_layers").get<int32_t>());
    precision.set_bf16_last_layers(p.at("bf16_last_layers").get<int32_t>());
    const nlohmann::json& o = state->at("optimizer");
    adamw.lr = o.at("lr").get<double>();
    adamw.beta1 = o.at("beta1").get<double>();
    adamw.beta2 = o.at("beta2").get<double>();
    adamw.eps = o.at("eps").get<double>();
    adamw.weight_decay = o.at("weight_decay").get<double>();
    adamw.max_grad_norm = o.at("max_grad_norm").get<double>();
    version = state->at("version").get<int64_t>();
    published = state->at("published_version").get<int64_t>();
    job_id = state->at("job_id").get<std::string>();
    has_optimizer = state->at("optimizer_state").get<bool>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, e.what()));
  }
  if (auto s = model::validate_adamw_config(adamw); !s.ok()) return prefixed(s, what);
  absl::StatusOr<v1::PrecisionSpec> resolved = resolve_precision(precision);
  if (!resolved.ok()) return prefixed(resolved.status(), what);
  const model::PrecisionPolicy policy = to_policy(*resolved, resolved->training());

  // Everything is loaded into locals first: a failure leaves the held policy untouched.
  absl::StatusOr<std::unique_ptr<model::Model>> model = model::Model::Load(dir, policy);
  if (!model.ok()) return model.status();
  auto optimizer = std::make_unique<model::AdamW>(**model, adamw);
  if (has_optimizer) {
    if (auto s = optimizer->load_state(dir + "/" + kOptimizerStateFile); !s.ok()) return s;
  }
  std::unique_ptr<model::Model> reference;
  const std::string ref_dir = dir + "/" + kReferenceDir;
  if (std::filesystem::exists(ref_dir)) {
    absl::StatusOr<std::unique_ptr<model::Model>> r = model::Model::Load(ref_dir, policy);
    if (!r.ok()) return r.status();
    reference = std::move(*r);
  }
  install(std::move(*model), std::move(reference), std::move(optimizer), *resolved, job_id, version,
          published);
  v1::LoadCheckpointResponse response;
  response.set_version(version_);
  response.set_optimizer_restored(has_optimizer);
  return response;
}

void Trainer::install(std::unique_ptr<model::Model> model, std::unique_ptr<model::Model> reference,
                      std::unique_ptr<model::AdamW> optimizer, const v1::PrecisionSpec& precision,
                      const std::string& job_id, int64_t version, int64_t published_version) {
  model_ = std::move(model);
  reference_ = std::move(reference);
  optimizer_ = std::move(optimizer);
  precision_ = precision;
  job_id_ = job_id;
  version_ = version;
  published_version_ = published_version;
  last_batch_.clear();
  update_status();
}

absl::Status Trainer::interrupted(int64_t applied, const absl::Status& error) {
  if (applied > 0) ++version_;
  update_status();
  return error;
}

std::string Trainer::resolve_path(const std::string& path) const {
  const std::filesystem::path p(path);
  if (p.is_absolute()) return path;
  return (std::filesystem::path(options_.data_dir) / p).string();
}

v1::TrainerStatus Trainer::status() const {
  std::lock_guard<std::mutex> lock(status_mu_);
  return status_;
}

void Trainer::update_status() {
  std::lock_guard<std::mutex> lock(status_mu_);
  status_.set_ready(model_ != nullptr);
  status_.set_version(version_);
  status_.set_published_version(published_version_);
  status_.set_job_id(job_id_);
  status_.set_num_parameters(model_ ? model_->num_params() : 0);
}

}  // namespace fp8rl::trainer
