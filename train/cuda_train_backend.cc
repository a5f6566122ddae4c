// The CUDA training backend (see cuda_train_backend.h): the device backend
// (train/device_train_backend.h) with CudaTrainStep as its engine and the DeviceTrainState on the
// same CUDA stream.
#include "train/cuda_train_backend.h"

#include <utility>

#include "engine/cuda/cuda_train_ops.h"
#include "train/device_train_backend.h"

namespace fp8rl::train {
namespace {

class CudaStepEngine final : public DeviceStepEngine {
 public:
  explicit CudaStepEngine(std::unique_ptr<engine::CudaTrainStep> step) : step_(std::move(step)) {}
  absl::StatusOr<model::TokenValues> forward(const model::Model& host,
                                             const model::TokenBatch& batch,
                                             const engine::TrainStepOptions& opts) override {
    return step_->forward(host, batch, opts);
  }
  absl::Status backward_into(const model::Model& host, const model::TokenValues& dlogp,
                             float* device_grads) override {
    return step_->backward_into(host, dlogp, device_grads);
  }
  absl::Status refresh(const engine::DeviceTrainState& state) override {
    return step_->ops().refresh_from_device(state.master());
  }
  absl::Status set_kv_scales(const model::KvScales& scales) override {
    return step_->ops().set_kv_scales(scales);
  }
  absl::Status backward_to_sink(const model::Model& host, const model::TokenValues& dlogp,
                                model::GradientSink& sink) override {
    return step_->backward_to_sink(host, dlogp, sink);
  }
  // The CUDA ops hold no master: sharding it changes nothing here.
  absl::Status shard(int64_t, int64_t) override { return absl::OkStatus(); }
  absl::Status install_working(const model::Model::WorkingStreams& all) override {
    return step_->ops().install_working(all);
  }

 private:
  std::unique_ptr<engine::CudaTrainStep> step_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainBackend>> make_cuda_train_backend_impl(
    std::unique_ptr<model::Model> model, const model::AdamWConfig& adamw, InitialShard initial) {
  absl::StatusOr<std::unique_ptr<engine::CudaTrainStep>> step =
      engine::CudaTrainStep::Create(*model);
  if (!step.ok()) return step.status();
  absl::StatusOr<std::unique_ptr<engine::TrainDevice>> device =
      engine::make_cuda_train_device((*step)->ops().stream());
  if (!device.ok()) return device.status();
  engine::TrainStateOptions options;
  options.adamw = adamw;
  options.shard_begin = initial.begin;
  options.shard_end = initial.end;
  absl::StatusOr<std::unique_ptr<engine::DeviceTrainState>> state =
      engine::DeviceTrainState::Create(*model, options, std::move(*device));
  if (!state.ok()) return state.status();
  // The device holds everything now: the initial host model (fp32 master and working copies)
  // goes here, and the backend keeps only a description of it.
  model.reset();
  return make_device_train_backend(
      model::Device::kCuda, std::make_unique<CudaStepEngine>(std::move(*step)), std::move(*state));
}

}  // namespace fp8rl::train
