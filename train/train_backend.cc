// The CPU training backend and the backend factory (see train_backend.h).
#include "train/train_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/cpu/train_ops.h"
#include "train/data_parallel.h"
#include "train/unit_gather.h"
#if FP8RL_HAVE_CUDA_TRAIN_BACKEND
#include "train/cuda_train_backend.h"
#endif

namespace fp8rl::train {
namespace {

// The engine's CPU training step (engine/cpu/train_ops.h CpuTrainStep: train_forward /
// train_backward over CpuTrainOps) of one forward: its tables, buffers and the sparse layers'
// activations. Mutable: the backward uses the step's ops and scratch.
class CpuForwardState final : public ForwardState {
 public:
  int64_t activation_bytes() const override { return step.saved_bytes(); }
  mutable engine::CpuTrainStep step;
};

// Training forward / backward: the decoder engine's training step over its CPU ops, the
// orchestration the CUDA backend runs over its device ops (docs/design/engine.md); weights,
// optimizer (model::AdamW), export and KV scales: model::Model.
class CpuTrainBackend final : public TrainBackend {
 public:
  CpuTrainBackend(std::unique_ptr<model::Model> model, std::unique_ptr<model::AdamW> optimizer)
      : model_(std::move(model)), optimizer_(std::move(optimizer)) {}

  model::Device device() const override { return model::Device::kCpu; }
  const model::Model& host_model() const override { return *model_; }
  void set_recompute(Recompute r) override { recompute_ = r; }
  Recompute recompute() const override { return recompute_; }

  std::unique_ptr<ForwardState> new_forward_state() const override {
    return std::make_unique<CpuForwardState>();
  }
  absl::StatusOr<std::vector<float>> logprobs(const PackedBatch& batch, ForwardState* saved,
                                              model::KvCalibrator* calibrator,
                                              model::ForwardRouting* routing) const override {
    engine::TrainStepOptions opts;
    opts.temperature = batch.temperature;
    opts.calibrator = calibrator;
    if (batch.replay_routing) opts.replay = &batch.routing;
    opts.router_aux_loss_coef = batch.router_aux_loss_coef;
    opts.routing_out = routing;
    // --recompute layers: the step keeps each layer's input only and re-runs the layer in the
    // backward (engine/train_step.h), bit-identical to keeping everything.
    opts.recompute_layers = saved != nullptr && recompute_ == Recompute::kLayers;
    opts.units = units_.get();     // ZeRO-3: each unit gathered as the step reaches it
    engine::CpuTrainStep scoring;  // no backward: freed on return
    engine::CpuTrainStep& step =
        saved != nullptr ? static_cast<CpuForwardState*>(saved)->step : scoring;
    absl::StatusOr<model::TokenValues> lp = step.forward(*model_, batch.tokens, opts);
    if (!lp.ok()) return lp.status();
    return gather_response(batch, *lp);
  }
  absl::Status backward(const ForwardState& saved, const PackedBatch& batch,
                        std::span<const float> dloss_dlogp, float* grads,
                        const model::GradientsFinal& on_final) override {
    if (grads == nullptr) {
      if (!pending_) own_grads_.assign(static_cast<size_t>(model_->num_params()), 0.0f);
      pending_ = true;
      grads = own_grads_.data();
    } else if (pending_) {
      return gradients_pending_error("backward");
    }
    absl::Status s = static_cast<const CpuForwardState&>(saved).step.backward(
        *model_, scatter_response(batch, dloss_dlogp), grads, on_final);
    if (!s.ok()) pending_ = false;  // partial gradients: the next backward starts from zero
    return s;
  }

  absl::Status backward_to_sink(const ForwardState& saved, const PackedBatch& batch,
                                std::span<const float> dloss_dlogp,
                                model::GradientSink& sink) override {
    if (pending_) return gradients_pending_error("backward_to_sink");
    return static_cast<const CpuForwardState&>(saved).step.backward(
        *model_, scatter_response(batch, dloss_dlogp), sink);
  }

  absl::StatusOr<model::OptimizerStepStats> optimizer_step(float* grads) override {
    if (grads == nullptr) {
      if (!pending_) own_grads_.assign(static_cast<size_t>(model_->num_params()), 0.0f);
      pending_ = false;
      grads = own_grads_.data();
    } else if (pending_) {
      return gradients_pending_error("optimizer_step");
    }
    return optimizer_->step(*model_, grads);
  }
  absl::Status shard_optimizer(int64_t begin, int64_t end) override {
    if (optimizer_->sharded()) return absl::FailedPreconditionError("optimizer: already sharded");
    // The model checks the range and the policy before it changes anything; the optimizer's
    // shard cannot fail after that (a range inside the layout, not sharded yet).
    if (absl::Status s = model_->shard_master(begin, end); !s.ok()) return s;
    return optimizer_->shard(begin, end);
  }
  absl::StatusOr<model::OptimizerStepStats> optimizer_step_shard(std::span<float> grads,
                                                                 double grad_norm) override {
    if (pending_) return gradients_pending_error("optimizer_step_shard");
    return optimizer_->step_shard(model_->params(), grads, grad_norm, model_->master_begin());
  }
  absl::Status gather_working(Collectives& group, const ShardLayout& layout,
                              std::string_view what) override {
    const int rank = group.rank();
    absl::StatusOr<model::Model::WorkingStreams> mine =
        model_->encode_working(layout.begin(rank), layout.end(rank));
    if (!mine.ok()) return mine.status();
    absl::StatusOr<model::Model::WorkingStreams> all =
        all_gather_working(group, *model_, layout.bounds, *mine, what);
    if (!all.ok()) return all.status();
    *mine = {};  // freed before the install copies the streams
    if (absl::Status s = model_->install_working(*all); !s.ok()) return s;
    working_hash_ = working_weights_hash(all->codes, all->scales, all->bf16);
    return absl::OkStatus();
  }
  absl::Status shard_working(const ShardLayout& layout, int rank) override {
    if (units_ != nullptr) return absl::FailedPreconditionError("working copies: already sharded");
    if (!model_->master_sharded() || model_->master_begin() != layout.begin(rank) ||
        std::ssize(model_->params()) != layout.size(rank)) {
      return absl::FailedPreconditionError(
          "trainer.shard params: the master must be sharded to this rank's shard first");
    }
    units_ = std::make_unique<ShardedUnitWeights>(model_.get(), layout, rank);
    return absl::OkStatus();
  }
  ShardedUnitWeights* sharded_units() const override { return units_.get(); }
  absl::StatusOr<std::vector<float>> master_shard() const override {
    return std::vector<float>(model_->params().begin(), model_->params().end());
  }
  absl::StatusOr<model::WeightSet> export_weights_with_master(
      model::WeightFormat format, int64_t version,
      std::span<const float> whole_master) const override {
    return model_->export_weights(format, version, whole_master);
  }
  int64_t gradient_transfer_bytes() const override { return 0; }
  void requantize() override { model_->refresh(); }
  const model::AdamWConfig& optimizer_config() const override { return optimizer_->config(); }
  int64_t optimizer_steps() const override { return optimizer_->steps(); }
  absl::Status set_learning_rate(double lr) override { return optimizer_->set_lr(lr); }

  const model::KvScales& kv_scales() const override { return model_->kv_scales(); }
  absl::Status set_kv_scales(const model::KvScales& scales) override {
    return model_->set_kv_scales(scales);
  }
  absl::Status calibration_forward(const model::TokenBatch& sequences,
                                   model::KvCalibrator* calibrator) const override {
    engine::TrainStepOptions opts;
    opts.calibrator = calibrator;
    opts.units = units_.get();
    return engine::cpu_logprobs(*model_, sequences, opts).status();
  }

  absl::StatusOr<model::WeightSet> export_weights(model::WeightFormat format,
                                                  int64_t version) const override {
    return model_->export_weights(format, version);
  }
  absl::StatusOr<uint64_t> master_fingerprint() const override {
    if (units_ != nullptr) return units_->hash();
    if (model_->master_sharded()) return working_hash_;
    return weight_hash(model_->params());
  }

  absl::Status save_optimizer_state(const std::string& path) const override {
    return optimizer_->save_state(path);
  }
  absl::Status load_optimizer_state(const std::string& path) override {
    return optimizer_->load_state(path);
  }
  absl::StatusOr<model::AdamW::RangeState> optimizer_range_state() const override {
    return optimizer_->range_state();
  }
  absl::Status set_optimizer_range_state(model::AdamW::RangeState state) override {
    return optimizer_->set_range_state(std::move(state));
  }

 private:
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<model::AdamW> optimizer_;  // built on *model_
  Recompute recompute_ = Recompute::kNone;
  // The backend's own gradient buffer (backward / optimizer_step with nullptr) and whether it
  // holds gradients not yet stepped.
  std::vector<float> own_grads_;
  bool pending_ = false;
  // Sharded: working_weights_hash of the working copies last installed (master_fingerprint; 0
  // before the first gather_working).
  uint64_t working_hash_ = 0;
  // ZeRO-3: the unit gathers (null unless sharded as params).
  std::unique_ptr<ShardedUnitWeights> units_;
};

}  // namespace

namespace {
absl::Status no_sharding(const TrainBackend& backend) {
  return absl::FailedPreconditionError(
      absl::StrCat("trainer.shard: this ", std::string(model::device_name(backend.device())),
                   " training backend does not shard"));
}
}  // namespace

absl::Status TrainBackend::shard_optimizer(int64_t, int64_t) { return no_sharding(*this); }
absl::Status TrainBackend::backward_to_sink(const ForwardState&, const PackedBatch&,
                                            std::span<const float>, model::GradientSink&) {
  return no_sharding(*this);
}
absl::StatusOr<model::OptimizerStepStats> TrainBackend::optimizer_step_shard(std::span<float>,
                                                                             double) {
  return no_sharding(*this);
}
absl::Status TrainBackend::shard_working(const ShardLayout&, int) { return no_sharding(*this); }
absl::Status TrainBackend::gather_working(Collectives&, const ShardLayout&, std::string_view) {
  return no_sharding(*this);
}
absl::StatusOr<model::WeightSet> TrainBackend::export_weights_with_master(
    model::WeightFormat, int64_t, std::span<const float>) const {
  return no_sharding(*this);
}
absl::StatusOr<model::AdamW::RangeState> TrainBackend::optimizer_range_state() const {
  return no_sharding(*this);
}
absl::Status TrainBackend::set_optimizer_range_state(model::AdamW::RangeState) {
  return no_sharding(*this);
}

absl::Status gradients_pending_error(std::string_view call) {
  return absl::FailedPreconditionError(
      absl::StrCat(std::string(call),
                   ": the backend's own gradient buffer holds gradients not yet stepped "
                   "(optimizer_step(nullptr) first)"));
}

absl::StatusOr<Recompute> parse_recompute(std::string_view text, std::string_view field) {
  if (text.empty() || text == "none") return Recompute::kNone;
  if (text == "layers") return Recompute::kLayers;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(field), ": expected none or layers, got '", std::string(text), "'"));
}

std::string_view recompute_name(Recompute r) { return r == Recompute::kLayers ? "layers" : "none"; }

std::unique_ptr<TrainBackend> make_cpu_train_backend(std::unique_ptr<model::Model> model,
                                                     const model::AdamWConfig& adamw) {
  auto optimizer = std::make_unique<model::AdamW>(*model, adamw);
  return std::make_unique<CpuTrainBackend>(std::move(model), std::move(optimizer));
}

std::unique_ptr<TrainBackend> make_cpu_train_backend(std::unique_ptr<model::Model> model,
                                                     std::unique_ptr<model::AdamW> optimizer) {
  return std::make_unique<CpuTrainBackend>(std::move(model), std::move(optimizer));
}

#if FP8RL_HAVE_CUDA_TRAIN_BACKEND
bool cuda_train_backend_available() { return true; }
std::string cuda_train_backend_unavailable_reason() { return ""; }
#else
bool cuda_train_backend_available() { return false; }
std::string cuda_train_backend_unavailable_reason() {
  return "training on CUDA is not built in this binary (built without CUDA; use --device cpu)";
}
#endif

absl::StatusOr<std::unique_ptr<TrainBackend>> make_train_backend(
    model::Device device, std::unique_ptr<model::Model> model, const model::AdamWConfig& adamw,
    int64_t memory_budget_bytes, InitialShard initial) {
  // The budget was checked against the memory plan before this call (Learner::create,
  // load_checkpoint); the backends allocate what the plan counted.
  (void)memory_budget_bytes;
  if (device == model::Device::kCuda) {
#if FP8RL_HAVE_CUDA_TRAIN_BACKEND
    return make_cuda_train_backend_impl(std::move(model), adamw, initial);
#else
    (void)initial;
    return absl::FailedPreconditionError(cuda_train_backend_unavailable_reason());
#endif
  }
  return make_cpu_train_backend(std::move(model), adamw);
}

}  // namespace fp8rl::train
