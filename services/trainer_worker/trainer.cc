// The Trainer: proto <-> train/ translation, locking, publishing and metrics. See trainer.h for
// the contract; the updates themselves are in train/learner.cc.
#include "services/trainer_worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/path_roots.h"
#include "common/service/log.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "proto/algorithm_proto.h"
#include "proto/precision_proto.h"
#include "proto/step_metrics_proto.h"
#include "rl/mismatch.h"
#include "services/trainer_worker/rendezvous_client.h"
#include "services/weight_sync/payload.h"
#include "train/checkpoint.h"
#include "train/collectives.h"
#ifdef FP8RL_HAVE_NCCL
#include "train/collectives_nccl.h"
#endif

namespace fp8rl::trainer {
namespace {

// Removes the temporary step folders ("step-K.tmp.<pid>") that cut-off saves (a killed trainer, a
// disk that turned read-only) left in the job folder of `path` (".../<job>/step-K"). No resume
// reads them; without this nothing would remove them. Other live processes' folders are kept.
// `own_are_stale`: also this process's own (a save cut off by a disk that turned read-only leaves
// the live trainer's pid); only when loading (LoadCheckpoint, or a job starting from a checkpoint
// with model.checkpoint), since in-process groups (tests) run several trainers
// in one process and one may be saving while another enters save_checkpoint.
void remove_cut_off_saves(const std::string& path, bool own_are_stale) {
  const std::filesystem::path p(path);
  if (!p.filename().string().starts_with("step-")) return;
  for (const std::string& gone :
       remove_dead_temp_dirs(p.parent_path().string(), "step-", own_are_stale)) {
    service::log_warn("trainer", "removed the temporary folder of a cut-off checkpoint save",
                      {{"path", gone}});
  }
}

using Clock = std::chrono::steady_clock;

constexpr char kNoPolicy[] = "no policy loaded: call InitPolicy or LoadCheckpoint first";
constexpr char kShuttingDown[] = "trainer is shutting down";

std::vector<train::Sequence> to_sequences(
    const google::protobuf::RepeatedPtrField<v1::TrainSequence>& seqs) {
  std::vector<train::Sequence> out(seqs.size());
  for (int i = 0; i < seqs.size(); ++i) {
    const v1::TrainSequence& s = seqs[i];
    out[i].tokens.assign(s.tokens().begin(), s.tokens().end());
    out[i].prompt_length = s.prompt_length();
    out[i].loss_mask.assign(s.loss_mask().begin(), s.loss_mask().end());
    out[i].gen_logprobs.assign(s.gen_logprobs().begin(), s.gen_logprobs().end());
    out[i].advantage = s.advantage();
    out[i].routing.assign(s.routed_experts().begin(), s.routed_experts().end());
  }
  return out;
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
    c.beta1 = o.adam_beta1();
    c.beta2 = o.adam_beta2() == 0 ? 0.999 : o.adam_beta2();
    c.eps = o.adam_epsilon() == 0 ? 1e-8 : o.adam_epsilon();
    c.weight_decay = o.weight_decay();
    c.max_grad_norm = o.max_grad_norm();
  }
  return c;
}

}  // namespace

Trainer::Trainer(TrainerOptions options, WeightPublisher* publisher, TrainerMetrics* metrics)
    : options_(std::move(options)), publisher_(publisher), metrics_(metrics) {
  status_.set_worker_id(options_.worker_id);
}

absl::Status Trainer::attach_group(train::Learner& learner) {
  learner.set_group(group_.get(), options_.allreduce_bucket_bytes);
  return learner.set_shard_mode(shard_);
}

train::TrainPlacement Trainer::placement() const {
  train::TrainPlacement p;
  p.device = options_.device == "cuda" ? model::Device::kCuda : model::Device::kCpu;
  p.memory_budget_bytes = p.device == model::Device::kCuda ? options_.gpu_memory_budget_bytes : 0;
  p.recompute = options_.recompute;
  p.max_step_tokens = options_.max_step_tokens;
  // The group joined before InitPolicy / LoadCheckpoint: the plan counts this rank's shard, and a
  // device backend allocates only its shard's optimizer state.
  if (group_ != nullptr) {
    p.trainers = group_->size();
    p.rank = group_->rank();
  }
  p.shard = shard_;
  return p;
}

absl::Status Trainer::check_job(const std::string& job_id) const {
  if (!learner_) return absl::AbortedError(kNoPolicy);
  if (job_id != learner_->job_id()) {
    return absl::AbortedError(absl::StrCat("job_id: the policy belongs to job '",
                                           learner_->job_id(), "', not '", job_id,
                                           "' (call InitPolicy first)"));
  }
  if (stopping_.load()) return absl::UnavailableError(kShuttingDown);
  return absl::OkStatus();
}

absl::StatusOr<v1::InitPolicyResponse> Trainer::init_policy(const v1::InitPolicyRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load()) return absl::UnavailableError(kShuttingDown);
  if (request.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  train::InitRequest init;
  init.job_id = request.job_id();
  absl::StatusOr<PrecisionConfig> precision =
      precision_from_proto(request.precision(), "precision");
  if (!precision.ok()) return precision.status();
  init.precision = *precision;
  absl::StatusOr<model::AdamWConfig> adamw = to_adamw(request);
  if (!adamw.ok()) return adamw.status();
  init.adamw = *adamw;
  switch (request.model().source_case()) {
    case v1::ModelSpec::kCheckpointDir:
      init.checkpoint_dir = request.model().checkpoint_dir();
      if (init.checkpoint_dir.empty()) {
        return absl::InvalidArgumentError("model.checkpoint_dir: required");
      }
      if (!options_.models_root.empty()) {
        absl::StatusOr<std::string> confined = resolve_under_root(
            "model.checkpoint_dir", init.checkpoint_dir, {"--models-root", options_.models_root});
        if (!confined.ok()) return confined.status();
        init.checkpoint_dir = *confined;
      }
      remove_cut_off_saves(init.checkpoint_dir, /*own_are_stale=*/true);
      break;
    case v1::ModelSpec::kInit:
      init.model_config_json = request.model().init().model_config_json();
      init.seed = request.model().init().seed();
      break;
    default:
      return absl::InvalidArgumentError("model: set checkpoint_dir or init");
  }
  init.keep_reference = request.keep_reference();
  init.calibration = to_sequences(request.calibration_sequences());
  init.placement = placement();
  absl::StatusOr<std::unique_ptr<train::Learner>> learner = train::Learner::create(init);
  if (!learner.ok()) return learner.status();
  // Joined before it becomes the held policy: a policy the group's shard mode refuses (ZeRO-3 on
  // a cuda trainer) is not kept half-sharded.
  if (absl::Status s = attach_group(**learner); !s.ok()) {
    if (learner_) learner_->set_group(group_.get(), options_.allreduce_bucket_bytes);
    return s;
  }
  learner_ = std::move(*learner);
  service::log_info("trainer", learner_->memory_plan().describe(),
                    {{"job", learner_->job_id()}, {"device", options_.device}});
  update_status();

  v1::InitPolicyResponse response;
  response.set_version(learner_->version());
  response.set_num_parameters(learner_->policy().num_params());
  response.set_model_config_json(model::model_config_to_json(learner_->policy().config()));
  return response;
}

absl::StatusOr<v1::ComputeLogprobsResponse> Trainer::compute_logprobs(
    const v1::ComputeLogprobsRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!learner_) return absl::AbortedError(kNoPolicy);
  absl::StatusOr<std::vector<std::vector<float>>> lp = learner_->logprobs(
      to_sequences(request.sequences()), request.temperature(), request.use_reference());
  if (!lp.ok()) return lp.status();
  v1::ComputeLogprobsResponse response;
  for (const std::vector<float>& seq : *lp) {
    response.add_sequences()->mutable_logprobs()->Add(seq.begin(), seq.end());
  }
  response.set_version(learner_->version());
  return response;
}

absl::StatusOr<train::GrpoRequest> Trainer::grpo_request(
    const v1::TrainStepRequest& request) const {
  const v1::AlgorithmParams& a = request.algorithm();
  train::GrpoRequest r;
  r.batch = to_sequences(request.batch());
  r.loss.clip_eps = a.clip_eps();
  r.loss.kl_beta = a.kl_beta();
  absl::StatusOr<rl::IsConfig> is = is_config_from_proto(a);
  if (!is.ok()) return is.status();
  r.loss.is = *is;
  r.temperature = a.temperature();
  r.minibatches = a.minibatches();
  r.epochs = a.epochs();
  r.learning_rate = a.learning_rate();
  r.routing_replay = a.routing_replay();
  r.router_aux_loss_coef = a.router_aux_loss_coef();
  return r;
}

absl::StatusOr<PolicyGradient> Trainer::gradient(const v1::TrainStepRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto s = check_job(request.job_id()); !s.ok()) return s;
  absl::StatusOr<train::GrpoRequest> r = grpo_request(request);
  if (!r.ok()) return r.status();
  return learner_->gradient(*r);
}

absl::StatusOr<v1::TrainStepResponse> Trainer::train_step(const v1::TrainStepRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto s = check_job(request.job_id()); !s.ok()) return s;
  absl::StatusOr<train::GrpoRequest> r = grpo_request(request);
  if (!r.ok()) return r.status();
  absl::StatusOr<train::GrpoResult> result = learner_->grpo_update(*r, &stopping_);
  update_status();
  if (!result.ok()) return result.status();
  if (absl::Status s = write_logprob_log(request.job_id(), request.step(), *result); !s.ok()) {
    // The update is applied; a log that cannot be written must not fail the step.
    service::log_warn("trainer", "logprob log not written", {{"error", std::string(s.message())}});
  }

  v1::TrainStepResponse response;
  // The step metrics of rl/step_metric_schema.h, by name.
  rl::MetricsValues values = {{"loss", result->loss},
                              {"pg_loss", result->pg_loss},
                              {"kl", result->kl},
                              {"grad_norm", result->grad_norm},
                              {"learning_rate", result->learning_rate},
                              {"clip_fraction", result->clip_fraction},
                              {"train_tokens", static_cast<double>(result->tokens)}};
  const rl::MismatchMetrics& mismatch = result->mismatch;
  rl::append_values(mismatch, &values);
  step_metrics_to_proto(values, &response);
  response.set_version(learner_->version());
  (*response.mutable_phase_seconds())["logprobs"] = result->logprob_seconds;
  (*response.mutable_phase_seconds())["forward_backward"] = result->forward_backward_seconds;
  (*response.mutable_phase_seconds())["optimizer"] = result->optimizer_seconds;
  if (result->group_size > 1) {
    (*response.mutable_phase_seconds())["all_reduce"] = result->all_reduce_seconds;
  }
  if (result->moe.present) {
    v1::MoeStats* moe = response.mutable_moe();
    moe->set_routed_tokens(result->moe.routed_tokens);
    moe->set_routing_differ_tokens(result->moe.differ_tokens);
    moe->set_routing_replay(result->moe.replay);
    moe->set_aux_loss(result->moe.aux_loss);
    moe->set_num_experts(static_cast<int32_t>(result->moe.num_experts));
    moe->mutable_expert_tokens()->Add(result->moe.expert_tokens.begin(),
                                      result->moe.expert_tokens.end());
  }

  if (metrics_ != nullptr) {
    metrics_->steps->with({"grpo"}).inc(static_cast<double>(result->updates));
    metrics_->tokens->get().inc(static_cast<double>(result->tokens));
    metrics_->loss->get().set(result->loss);
    metrics_->grad_norm->get().set(result->grad_norm);
    metrics_->learning_rate->get().set(result->learning_rate);
    metrics_->phase_seconds->with({"logprobs"}).set(result->logprob_seconds);
    metrics_->phase_seconds->with({"forward_backward"}).set(result->forward_backward_seconds);
    metrics_->phase_seconds->with({"optimizer"}).set(result->optimizer_seconds);
    metrics_->is_weight->with({"mean"}).set(mismatch.sampling_importance_ratio);
    metrics_->is_weight->with({"min"}).set(mismatch.is_weight_min);
    metrics_->is_weight->with({"max"}).set(mismatch.is_weight_max);
    metrics_->record_step(values);
    metrics_->all_reduce_seconds->get().set(result->all_reduce_seconds);
    metrics_->all_reduce_bytes->get().inc(static_cast<double>(result->all_reduce_bytes));
    metrics_->all_reduce_wait_seconds->get().set(result->gradient_wait_seconds);
  }
  return response;
}

absl::StatusOr<v1::SftStepResponse> Trainer::sft_step(const v1::SftStepRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto s = check_job(request.job_id()); !s.ok()) return s;
  train::SftRequest r;
  r.batch = to_sequences(request.batch());
  r.learning_rate = request.learning_rate();
  r.minibatches = request.minibatches();
  absl::StatusOr<train::SftResult> result = learner_->sft_update(r, &stopping_);
  update_status();
  if (!result.ok()) return result.status();
  if (metrics_ != nullptr) {
    metrics_->steps->with({"sft"}).inc(static_cast<double>(result->updates));
    metrics_->tokens->get().inc(static_cast<double>(result->tokens));
    metrics_->loss->get().set(result->loss);
    metrics_->grad_norm->get().set(result->grad_norm);
    metrics_->learning_rate->get().set(result->learning_rate);
    metrics_->phase_seconds->with({"forward_backward"}).set(result->forward_backward_seconds);
    metrics_->phase_seconds->with({"optimizer"}).set(result->optimizer_seconds);
    metrics_->all_reduce_seconds->get().set(result->all_reduce_seconds);
    metrics_->all_reduce_bytes->get().inc(static_cast<double>(result->all_reduce_bytes));
    metrics_->all_reduce_wait_seconds->get().set(result->gradient_wait_seconds);
  }
  v1::SftStepResponse response;
  response.set_loss(result->loss);
  response.set_grad_norm(result->grad_norm);
  response.set_tokens(result->tokens);
  response.set_version(learner_->version());
  return response;
}

absl::StatusOr<v1::PublishResponse> Trainer::publish(const v1::PublishRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!learner_) return absl::AbortedError(kNoPolicy);
  if (stopping_.load()) return absl::UnavailableError(kShuttingDown);
  Precision format = learner_->precision().generation;
  if (request.format() != v1::WEIGHT_FORMAT_UNSPECIFIED) {
    absl::StatusOr<Precision> f = weight_format_from_proto(request.format(), "format");
    if (!f.ok()) return f.status();
    format = *f;
  }
  // A sharded group uploads in parts, one per rank (docs/design/weight-sync-fanout.md "Parallel
  // upload from N trainer ranks"); any other group uploads from rank 0.
  const bool in_parts =
      group_ != nullptr && group_->size() > 1 && shard_ != train::ShardMode::kNone;
  if (group_ != nullptr && group_->rank() != 0 && !in_parts) {
    // Rank 0 uploads; the others take the same KV scales so their forwards stay the same.
    absl::StatusOr<train::Export> exported =
        learner_->export_for_generation(format, learner_->version(), request.calibrate_kv_scales());
    if (!exported.ok()) return exported.status();
    v1::PublishResponse response;
    response.set_version(learner_->version());
    response.set_calibrate_seconds(exported->calibrate_seconds);
    return response;
  }
  const std::string address = request.weight_sync_address().empty()
                                  ? options_.default_weight_sync_address
                                  : request.weight_sync_address();
  uint64_t upload_id = 0;  // in parts: the attempt's id, the same on every rank
  absl::StatusOr<int64_t> version = absl::UnknownError("not computed");
  if (in_parts) {
    version = agree_on_version(address, request.above_version(), &upload_id);
  } else {
    absl::StatusOr<int64_t> latest = publisher_->latest_version(address);
    if (!latest.ok()) return latest.status();
    version = std::max({learner_->version(), learner_->published_version() + 1, *latest + 1,
                        request.above_version() + 1});
  }
  if (!version.ok()) return version.status();

  absl::StatusOr<train::Export> exported =
      learner_->export_for_generation(format, *version, request.calibrate_kv_scales());
  if (!exported.ok()) return exported.status();
  const auto start = Clock::now();
  absl::StatusOr<uint64_t> bytes =
      in_parts ? upload_own_part(address, exported->weights, format, upload_id)
               : publisher_->upload(address, exported->weights, weight_format_to_proto(format));
  if (!bytes.ok()) return bytes.status();
  const double upload_seconds = seconds_since(start);
  learner_->set_published(*version);
  update_status();

  const train::ScaleStats& ws = exported->weight_scale_inv;
  const train::ScaleStats &ks = exported->k_scale, &vs = exported->v_scale;
  v1::PublishResponse response;
  response.set_version(*version);
  response.set_bytes(*bytes);
  response.set_quantize_seconds(exported->quantize_seconds);
  response.set_calibrate_seconds(exported->calibrate_seconds);
  response.set_upload_seconds(upload_seconds);
  response.set_weight_scale_min(ws.min);
  response.set_weight_scale_max(ws.max);
  response.set_kv_scale_mean(ks.count + vs.count > 0 ? (ks.mean * static_cast<double>(ks.count) +
                                                        vs.mean * static_cast<double>(vs.count)) /
                                                           static_cast<double>(ks.count + vs.count)
                                                     : 0.0);
  if (metrics_ != nullptr) {
    metrics_->policy_version->get().set(static_cast<double>(*version));
    metrics_->phase_seconds->with({"quantize"}).set(exported->quantize_seconds);
    metrics_->phase_seconds->with({"calibrate"}).set(exported->calibrate_seconds);
    metrics_->phase_seconds->with({"publish"}).set(upload_seconds);
    metrics_->recalibration_seconds->get().set(exported->quantize_seconds +
                                               exported->calibrate_seconds);
    metrics_->weight_scale_inv->with({"min"}).set(ws.min);
    metrics_->weight_scale_inv->with({"mean"}).set(ws.mean);
    metrics_->weight_scale_inv->with({"max"}).set(ws.max);
    for (const auto& [name, s] : {std::pair{"k", ks}, std::pair{"v", vs}}) {
      metrics_->kv_scale->with({name, "min"}).set(s.min);
      metrics_->kv_scale->with({name, "mean"}).set(s.mean);
      metrics_->kv_scale->with({name, "max"}).set(s.max);
    }
  }
  last_published_ = std::move(exported->weights);
  return response;
}

absl::StatusOr<int64_t> Trainer::agree_on_version(const std::string& address, int64_t above_version,
                                                  uint64_t* upload_id) {
  // Rank 0 asks weight sync and picks the attempt's id; one all-reduce (max) gives every rank
  // the same version, id, and whether rank 0 failed.
  const bool first = group_->rank() == 0;
  absl::StatusOr<int64_t> latest = int64_t{0};
  if (first) latest = publisher_->latest_version(address);
  int64_t agreed[3] = {std::max({learner_->version(), learner_->published_version() + 1,
                                 above_version + 1, latest.ok() ? *latest + 1 : 0}),
                       first ? std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count()
                             : 0,
                       latest.ok() ? 0 : 1};
  FP8RL_RETURN_IF_ERROR(
      group_->all_reduce(std::span<int64_t>(agreed), train::ReduceOp::kMax, "publish version"));
  if (!latest.ok()) return latest.status();
  if (agreed[2] != 0) {
    return absl::AbortedError("rank 0 could not reach weight sync for the version to publish");
  }
  *upload_id = static_cast<uint64_t>(agreed[1]);
  return agreed[0];
}

absl::StatusOr<uint64_t> Trainer::upload_own_part(const std::string& address,
                                                  const model::WeightSet& weights, Precision format,
                                                  uint64_t upload_id) {
  // Every rank holds the whole working copy after the all-gather, so every rank builds the same
  // manifest (the service refuses a part whose manifest differs, naming the field) and uploads the
  // tensors of its own part.
  absl::StatusOr<v1::VersionManifest> manifest =
      weight_sync::build_manifest(weights, weight_format_to_proto(format));
  if (!manifest.ok()) return manifest.status();
  manifest->set_upload_id(upload_id);
  FP8RL_RETURN_IF_ERROR(weight_sync::plan_parts(&*manifest, static_cast<uint32_t>(group_->size())));
  manifest->set_part_index(static_cast<uint32_t>(group_->rank()));
  absl::StatusOr<weight_sync::PartRange> range = weight_sync::part_range(*manifest);
  if (!range.ok()) return range.status();
  return publisher_->upload_part(
      address, *manifest,
      std::span<const model::NamedTensor>(weights.tensors)
          .subspan(static_cast<size_t>(range->first_tensor),
                   static_cast<size_t>(range->end_tensor - range->first_tensor)));
}

absl::StatusOr<v1::SaveCheckpointResponse> Trainer::save_checkpoint(
    const v1::SaveCheckpointRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!learner_) return absl::AbortedError(kNoPolicy);
  if (request.path().empty()) return absl::InvalidArgumentError("path: required");
  absl::StatusOr<std::string> path = confined_data_path(request.path());
  if (!path.ok()) return path.status();
  remove_cut_off_saves(*path, /*own_are_stale=*/false);
  absl::StatusOr<train::SavedCheckpoint> saved =
      train::save_checkpoint(*learner_, *path, request.include_optimizer());
  if (!saved.ok()) return saved.status();
  v1::SaveCheckpointResponse response;
  response.set_path(saved->path);
  response.set_bytes(saved->bytes);
  response.set_version(saved->version);
  return response;
}

absl::StatusOr<v1::LoadCheckpointResponse> Trainer::load_checkpoint(
    const v1::LoadCheckpointRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load()) return absl::UnavailableError(kShuttingDown);
  if (request.path().empty()) return absl::InvalidArgumentError("path: required");
  // Loaded in full first: a failure leaves the held policy untouched.
  absl::StatusOr<std::string> path = confined_data_path(request.path());
  if (!path.ok()) return path.status();
  remove_cut_off_saves(*path, /*own_are_stale=*/true);
  absl::StatusOr<train::LoadedCheckpoint> loaded = train::load_checkpoint(*path, placement());
  if (!loaded.ok()) return loaded.status();
  // Joined before it replaces the held policy: a sharded optimizer state is restored (re-cut to
  // this rank's range) here, and a failure leaves the held policy as it was.
  if (absl::Status s = attach_group(*loaded->learner); !s.ok()) {
    if (learner_) learner_->set_group(group_.get(), options_.allreduce_bucket_bytes);
    return s;
  }
  learner_ = std::move(loaded->learner);
  service::log_info("trainer", learner_->memory_plan().describe(),
                    {{"job", learner_->job_id()}, {"device", options_.device}});
  update_status();
  v1::LoadCheckpointResponse response;
  response.set_version(learner_->version());
  response.set_optimizer_restored(loaded->optimizer_restored);
  return response;
}

// One JSON line per sequence of the step, in request order:
//   {"sequence": i, "gen": [...], "prev": [...]}
// over the sequence's loss tokens; the first line is {"job": id, "step": N, "version": v}
// (v = the policy version after the update). Mixture-of-experts policies add to the first line
// "moe": {"replay", "sparse_layers", "top_k", "num_experts"} and to each sequence line
// "gen_experts" (the generation's routing record as sent) and "router_experts" (the router's own
// top-k of every token in the prev-logprobs forward), both [tokens, sparse layers, top_k]
// flattened: what scripts/recompute_moe_metrics.py recomputes the MoE step metrics from.
// Written atomically, so a reader never sees half.
absl::Status Trainer::write_logprob_log(const std::string& job_id, int64_t step,
                                        const train::GrpoResult& result) const {
  if (options_.logprob_log_dir.empty()) return absl::OkStatus();
  // The job id names a folder: refuse anything that would leave the log folder.
  if (job_id.empty() || job_id == "." || job_id == ".." ||
      job_id.find_first_of("/\\") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("job id '", job_id, "' is not a folder name"));
  }
  const std::filesystem::path dir =
      std::filesystem::path(resolve_path(options_.logprob_log_dir)) / job_id;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  nlohmann::json head{{"job", job_id}, {"step", step}, {"version", learner_->version()}};
  if (result.moe.present) {
    const model::ModelConfig& config = learner_->policy().config();
    head["moe"] = {{"replay", result.moe.replay},
                   {"sparse_layers", config.num_sparse_layers()},
                   {"top_k", config.moe.num_experts_per_tok},
                   {"num_experts", config.moe.num_experts}};
  }
  std::string out = head.dump();
  out += '\n';
  for (size_t i = 0; i < result.logprobs.size(); ++i) {
    const train::GrpoResult::SequenceLogprobs& seq = result.logprobs[i];
    nlohmann::json line{{"sequence", i}, {"gen", seq.gen}, {"prev", seq.prev}};
    if (result.moe.present) {
      line["gen_experts"] = seq.gen_routing;
      line["router_experts"] = seq.router_routing;
    }
    out += line.dump();
    out += '\n';
  }
  return write_file_atomic((dir / absl::StrCat("step-", step, ".jsonl")).string(), out);
}

std::string Trainer::resolve_path(const std::string& path) const {
  const std::filesystem::path p(path);
  if (p.is_absolute()) return path;
  return (std::filesystem::path(options_.data_dir) / p).string();
}

absl::StatusOr<std::string> Trainer::confined_data_path(const std::string& path) const {
  const std::string resolved = resolve_path(path);
  if (options_.data_root.empty()) return resolved;
  return resolve_under_root("path", resolved, {"--data-root", options_.data_root});
}

absl::StatusOr<v1::JoinGroupResponse> Trainer::join_group(const v1::JoinGroupRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load()) return absl::UnavailableError(kShuttingDown);
  if (request.size() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("size: must be >= 1, got ", request.size()));
  }
  if (request.rank() < 0 || request.rank() >= request.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: must be in [0, ", request.size(), "), got ", request.rank()));
  }
  train::ShardMode shard = options_.shard;
  if (!request.shard().empty()) {
    absl::StatusOr<train::ShardMode> mode = train::parse_shard_mode(request.shard(), "shard");
    if (!mode.ok()) return mode.status();
    shard = *mode;
  }
  // The old group goes first: its peers may be gone.
  if (learner_) learner_->set_group(nullptr);
  // A learner sharded in another mode cannot change (Learner::set_shard_mode): it is an earlier
  // job's policy (a group re-formed for the same job asks for the same mode), so it goes, and the
  // next job's InitPolicy makes its own.
  if (learner_ && learner_->shard_layout() != nullptr && learner_->shard_mode() != shard) {
    service::log_info("trainer", "dropped the previous job's policy: sharded in another mode",
                      {{"job", learner_->job_id()},
                       {"was", std::string(train::shard_mode_name(learner_->shard_mode()))},
                       {"now", std::string(train::shard_mode_name(shard))}});
    learner_.reset();
    update_status();
  }
  shard_ = shard;
  group_.reset();
  v1::JoinGroupResponse response;
  response.set_rank(request.rank());
  response.set_size(request.size());
  if (request.size() > 1) {
    if (request.group_id().empty()) return absl::InvalidArgumentError("group_id: required");
    const std::string rendezvous = request.rendezvous_address().empty()
                                       ? options_.coordinator_address
                                       : request.rendezvous_address();
    if (rendezvous.empty()) {
      return absl::InvalidArgumentError(
          "rendezvous_address: required (this trainer has no coordinator address)");
    }
    if (request.timeout_ms() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("timeout_ms: must be >= 1, got ", request.timeout_ms()));
    }
    auto store = std::make_shared<GrpcRendezvousStore>(
        service::make_channel(rendezvous, grpc::ChannelArguments(), options_.rendezvous_security));
    train::GroupOptions options;
    options.rank = request.rank();
    options.size = request.size();
    options.prefix = request.group_id();
    options.timeout = std::chrono::milliseconds(request.timeout_ms());
    options.hostname = options_.group_host;
    absl::StatusOr<train::CollectiveBackend> backend =
        train::backend_for_device(options_.device, "--device");
    if (!backend.ok()) return backend.status();
    absl::StatusOr<std::unique_ptr<train::Collectives>> group;
    if (*backend == train::CollectiveBackend::kGloo) {
      group = train::make_gloo_collectives(std::move(store), options);
    } else {
#ifdef FP8RL_HAVE_NCCL
      group = train::make_nccl_collectives(std::move(store), options);
#else
      return absl::FailedPreconditionError(
          "--device: a trainer on cuda forms its group with NCCL, and this build has no NCCL");
#endif
    }
    if (!group.ok()) return group.status();
    group_ = std::move(*group);
    if (learner_) {
      if (absl::Status s = attach_group(*learner_); !s.ok()) return s;
    }
    response.set_backend(std::string(train::backend_name(*backend)));
    service::log_info("trainer", "joined trainer group",
                      {{"group", request.group_id()},
                       {"rank", absl::StrCat(request.rank())},
                       {"size", absl::StrCat(request.size())}});
  }
  if (metrics_ != nullptr) {
    metrics_->group_size->get().set(request.size());
    metrics_->group_rank->get().set(request.rank());
  }
  {
    std::lock_guard<std::mutex> status_lock(status_mu_);
    status_.set_group_rank(request.rank());
    status_.set_group_size(request.size());
  }
  return response;
}

v1::TrainerStatus Trainer::status() const {
  std::lock_guard<std::mutex> lock(status_mu_);
  return status_;
}

void Trainer::update_status() {
  std::lock_guard<std::mutex> lock(status_mu_);
  status_.set_ready(learner_ != nullptr);
  status_.set_version(learner_ ? learner_->version() : 0);
  status_.set_published_version(learner_ ? learner_->published_version() : 0);
  status_.set_job_id(learner_ ? learner_->job_id() : "");
  status_.set_num_parameters(learner_ ? learner_->policy().num_params() : 0);
}

}  // namespace fp8rl::trainer
