// The CUDA training backend (see cuda_train_backend.h).
//
// Per minibatch: the forward runs on the device (CudaTrainStep, activations in its buffers, the
// K/V amax of each sequence into the learner's host calibrator); the backward accumulates into the
// device state's gradient array, which is then copied to the learner's host buffer (the
// trainer-group all-reduce and the loss bookkeeping live there); the optimizer step copies the
// (all-reduced) gradients back, runs AdamW and the 128x128 re-quantization on the device
// (DeviceTrainState::step), then re-derives the step's working copies from the device master
// (CudaTrainOps::refresh_from_device). The host model keeps the config, policy and layout (and the
// initial weights it was built from, which go stale after the first step: the master weights live
// on the device; export_weights reads them there).
#include "train/cuda_train_backend.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/cuda/cuda_train_ops.h"
#include "model/cuda/train_state.h"

namespace fp8rl::train {
namespace {

// The device step keeps one forward's activations in its own buffers: a state is valid for the
// backward while no later forward ran.
class CudaForwardState final : public ForwardState {
 public:
  int64_t activation_bytes() const override { return bytes; }
  int64_t forward_id = -1;
  int64_t bytes = 0;
};

class CudaTrainBackend final : public TrainBackend {
 public:
  CudaTrainBackend(std::unique_ptr<model::Model> host,
                   std::unique_ptr<model::gpu::CudaTrainStep> step,
                   std::unique_ptr<model::gpu::DeviceTrainState> state)
      : host_(std::move(host)), step_(std::move(step)), state_(std::move(state)) {}

  model::Device device() const override { return model::Device::kCuda; }
  const model::Model& host_model() const override { return *host_; }
  void set_recompute(Recompute r) override { recompute_ = r; }
  Recompute recompute() const override { return recompute_; }

  std::unique_ptr<ForwardState> new_forward_state() const override {
    return std::make_unique<CudaForwardState>();
  }

  absl::StatusOr<std::vector<float>> logprobs(const PackedBatch& batch, ForwardState* saved,
                                              model::KvCalibrator* calibrator,
                                              model::ForwardRouting* routing) const override {
    if (saved != nullptr && recompute_ == Recompute::kLayers) {
      return absl::FailedPreconditionError(
          "--recompute layers: activation recomputation is not built on the CUDA backend");
    }
    if (batch.replay_routing || routing != nullptr || batch.router_aux_loss_coef > 0) {
      return absl::FailedPreconditionError("mixture-of-experts training is not built on CUDA");
    }
    model::gpu::TrainStepOptions opts;
    opts.temperature = batch.temperature;
    opts.calibrator = calibrator;
    absl::StatusOr<model::TokenValues> lp = step_->forward(*host_, batch.tokens, opts);
    if (!lp.ok()) return lp.status();
    ++forward_id_;
    if (saved != nullptr) {
      auto* s = static_cast<CudaForwardState*>(saved);
      s->forward_id = forward_id_;
      int64_t rows = 0;
      for (const auto& t : batch.tokens) rows += static_cast<int64_t>(t.size());
      s->bytes = static_cast<int64_t>(sizeof(float)) *
                 model::gpu::train_buffer_floats(host_->config(), rows, opts);
    }
    // Model layout (value [i-1] belongs to token i) -> the padded [B*L] response layout.
    const int64_t L = batch.length;
    std::vector<float> out(static_cast<size_t>(batch.size() * L), 0.0f);
    for (int64_t b = 0; b < batch.size(); ++b) {
      const int64_t p = batch.prompt_length[b];
      const int64_t resp = static_cast<int64_t>(batch.tokens[b].size()) - p;
      for (int64_t j = 0; j < resp; ++j) out[b * L + j] = (*lp)[b][p - 1 + j];
    }
    return out;
  }

  absl::Status backward(const ForwardState& saved, const PackedBatch& batch,
                        std::span<const float> dloss_dlogp, float* grads,
                        const model::Model::GradientsFinal& on_final) const override {
    if (static_cast<const CudaForwardState&>(saved).forward_id != forward_id_) {
      return absl::FailedPreconditionError(
          "backward: another forward ran on the device since this one (one saved forward at a "
          "time on CUDA)");
    }
    if (auto s = state_->zero_grads(); !s.ok()) return s;
    if (auto s =
            step_->backward_into(*host_, scatter_response(batch, dloss_dlogp), state_->grads());
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::vector<float>> g = state_->download(state_->grads());
    if (!g.ok()) return g.status();
    for (size_t i = 0; i < g->size(); ++i) grads[i] += (*g)[i];
    // Every gradient is final only once on the host.
    if (on_final) on_final(0);
    return absl::OkStatus();
  }

  absl::StatusOr<model::OptimizerStepStats> optimizer_step(float* grads) override {
    const int64_t n = host_->num_params();
    if (auto s = state_->device().upload(state_->grads(), grads, n * sizeof(float)); !s.ok()) {
      return s;
    }
    absl::StatusOr<model::OptimizerStepStats> stats = state_->step();
    if (!stats.ok()) return stats.status();
    if (auto s = step_->ops().refresh_from_device(state_->master()); !s.ok()) return s;
    // The learner's buffer as model::AdamW leaves it: scaled and clipped.
    if (auto s = state_->device().download(grads, state_->grads(), n * sizeof(float)); !s.ok()) {
      return s;
    }
    return stats;
  }
  void requantize() override {
    // Benchmarks only (optimizer_step already re-quantizes); an error here would repeat in the
    // next step, which reports it.
    if (state_->requantize().ok()) step_->ops().refresh_from_device(state_->master()).IgnoreError();
  }
  const model::AdamWConfig& optimizer_config() const override { return state_->adamw_config(); }
  int64_t optimizer_steps() const override { return state_->steps(); }
  absl::Status set_learning_rate(double lr) override { return state_->set_lr(lr); }

  const model::KvScales& kv_scales() const override { return state_->kv_scales(); }
  absl::Status set_kv_scales(const model::KvScales& scales) override {
    if (auto s = state_->set_kv_scales(scales); !s.ok()) return s;
    if (auto s = step_->ops().set_kv_scales(scales); !s.ok()) return s;
    return host_->set_kv_scales(scales);
  }
  absl::Status calibration_forward(const model::TokenBatch& sequences,
                                   model::KvCalibrator* calibrator) const override {
    model::gpu::TrainStepOptions opts;
    opts.calibrator = calibrator;
    ++forward_id_;
    return step_->forward(*host_, sequences, opts).status();
  }

  absl::StatusOr<model::WeightSet> export_weights(model::WeightFormat format,
                                                  int64_t version) const override {
    switch (format) {
      case model::WeightFormat::kFP8:
        return state_->export_fp8(version);
      case model::WeightFormat::kF32:
        return state_->export_f32(version);
      default: {
        // BF16: through an fp32 copy of the master on the host (not the recipe's device-only
        // export; the FP8 publish never takes this path).
        absl::StatusOr<model::WeightSet> f32 = state_->export_f32(version);
        if (!f32.ok()) return f32.status();
        absl::StatusOr<std::unique_ptr<model::Model>> m =
            model::Model::FromWeightSet(*f32, host_->policy());
        if (!m.ok()) return m.status();
        return (*m)->export_weights(model::WeightFormat::kBF16, version);
      }
    }
  }
  std::span<const float> master_weights() const override { return {}; }

  absl::Status save_optimizer_state(const std::string& path) const override {
    return state_->save_optimizer_state(path);
  }
  absl::Status load_optimizer_state(const std::string& path) override {
    return state_->load_optimizer_state(path);
  }

 private:
  std::unique_ptr<model::Model> host_;
  std::unique_ptr<model::gpu::CudaTrainStep> step_;
  std::unique_ptr<model::gpu::DeviceTrainState> state_;
  Recompute recompute_ = Recompute::kNone;
  mutable int64_t forward_id_ = 0;  // forwards run on the device so far
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainBackend>> make_cuda_train_backend_impl(
    std::unique_ptr<model::Model> model, const model::AdamWConfig& adamw) {
  absl::StatusOr<std::unique_ptr<model::gpu::CudaTrainStep>> step =
      model::gpu::CudaTrainStep::Create(*model);
  if (!step.ok()) return step.status();
  absl::StatusOr<std::unique_ptr<model::gpu::TrainDevice>> device =
      model::gpu::make_cuda_train_device((*step)->ops().stream());
  if (!device.ok()) return device.status();
  model::gpu::TrainStateOptions options;
  options.adamw = adamw;
  absl::StatusOr<std::unique_ptr<model::gpu::DeviceTrainState>> state =
      model::gpu::DeviceTrainState::Create(*model, options, std::move(*device));
  if (!state.ok()) return state.status();
  return std::make_unique<CudaTrainBackend>(std::move(model), std::move(*step), std::move(*state));
}

}  // namespace fp8rl::train
