// The device training backend and its host mirror (see device_train_backend.h).
#include "train/device_train_backend.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/train_ops.h"
#include "train/data_parallel.h"

namespace fp8rl::train {
namespace {

// The device step keeps one forward's activations in its own buffers: a state is valid for the
// backward while no later forward ran.
class DeviceForwardState final : public ForwardState {
 public:
  int64_t activation_bytes() const override { return bytes; }
  int64_t forward_id = -1;
  int64_t bytes = 0;
};

// Device memory for the gradients of a backward, handed out tensor by tensor: blocks are reused
// across tensors and backwards (a decoder layer's tensors repeat in size), so the pool grows to
// the most gradient bytes the backward holds at once, not to every parameter.
class StagingPool {
 public:
  // A zeroed block of at least `floats` (the smallest free one that fits, else a new one).
  absl::StatusOr<float*> take(engine::TrainDevice& dev, int64_t floats) {
    Block* best = nullptr;
    for (Block& b : blocks_) {
      if (!b.busy && b.floats >= floats && (best == nullptr || b.floats < best->floats)) best = &b;
    }
    if (best == nullptr) {
      absl::StatusOr<void*> p = dev.allocate(4 * floats, "gradient staging");
      if (!p.ok()) return p.status();
      blocks_.push_back({static_cast<float*>(*p), floats, false});
      best = &blocks_.back();
      bytes_ += 4 * floats;
    } else if (auto s = dev.fill_zero(best->p, 4 * floats); !s.ok()) {
      return s;
    }
    best->busy = true;
    return best->p;
  }
  void give_back(const float* p) {
    for (Block& b : blocks_) {
      if (b.p == p) b.busy = false;
    }
  }
  int64_t bytes() const { return bytes_; }

 private:
  struct Block {
    float* p;
    int64_t floats;
    bool busy;
  };
  std::vector<Block> blocks_;
  int64_t bytes_ = 0;
};

// The device sink of one staged backward: grad(offset) hands out a pool block for the tensor;
// final_from(from) adds every tensor at or after `from` into `host` (downloaded in pieces) and
// returns its block, then tells `host`. Errors are kept for status() (the sink interface returns
// none): a failed block allocation hands out the overflow block (the backward's result is
// discarded), a failed download skips the tensor.
class StagingSink final : public model::GradientSink {
 public:
  StagingSink(engine::TrainDevice& dev, StagingPool& pool,
              const std::unordered_map<int64_t, int64_t>& numel, model::GradientSink& host,
              float* overflow, int64_t* transfer_bytes)
      : dev_(dev),
        pool_(pool),
        numel_(numel),
        host_(host),
        overflow_(overflow),
        transfer_bytes_(transfer_bytes) {}
  ~StagingSink() override {
    for (const auto& [offset, p] : live_) pool_.give_back(p);
  }

  float* grad(int64_t offset) override {
    if (auto it = live_.find(offset); it != live_.end()) return it->second;
    auto n = numel_.find(offset);
    absl::StatusOr<float*> p = n == numel_.end()
                                   ? absl::InvalidArgumentError(absl::StrCat(
                                         "backward: no parameter tensor starts at ", offset))
                                   : pool_.take(dev_, n->second);
    if (!p.ok()) {
      if (status_.ok()) status_ = p.status();
      return overflow_;
    }
    live_.emplace(offset, *p);
    return *p;
  }
  void final_from(int64_t from) override {
    for (auto it = live_.lower_bound(from); it != live_.end(); it = live_.erase(it)) {
      if (status_.ok()) status_ = add_into_host(it->first, it->second);
      pool_.give_back(it->second);
    }
    host_.final_from(from);
  }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status add_into_host(int64_t offset, const float* src) {
    const int64_t n = numel_.at(offset);
    float* dst = host_.grad(offset);
    chunk_.resize(static_cast<size_t>(std::min(n, TrainBackend::kFingerprintChunkFloats)));
    for (int64_t i0 = 0; i0 < n; i0 += std::ssize(chunk_)) {
      const int64_t count = std::min<int64_t>(std::ssize(chunk_), n - i0);
      if (auto s = dev_.download(chunk_.data(), src + i0, 4 * count); !s.ok()) return s;
      for (int64_t i = 0; i < count; ++i) dst[i0 + i] += chunk_[static_cast<size_t>(i)];
    }
    *transfer_bytes_ += 4 * n;
    return absl::OkStatus();
  }

  engine::TrainDevice& dev_;
  StagingPool& pool_;
  const std::unordered_map<int64_t, int64_t>& numel_;
  model::GradientSink& host_;
  float* const overflow_;
  int64_t* const transfer_bytes_;
  std::map<int64_t, float*> live_;  // tensor offset -> its block
  std::vector<float> chunk_;
  absl::Status status_;
};

class DeviceTrainBackend final : public TrainBackend {
 public:
  DeviceTrainBackend(model::Device kind, std::unique_ptr<model::Model> description,
                     std::unique_ptr<DeviceStepEngine> engine,
                     std::unique_ptr<engine::DeviceTrainState> state)
      : kind_(kind),
        host_(std::move(description)),
        engine_(std::move(engine)),
        state_(std::move(state)) {}

  model::Device device() const override { return kind_; }
  const model::Model& host_model() const override { return *host_; }
  void set_recompute(Recompute r) override { recompute_ = r; }
  Recompute recompute() const override { return recompute_; }

  std::unique_ptr<ForwardState> new_forward_state() const override {
    return std::make_unique<DeviceForwardState>();
  }

  absl::StatusOr<std::vector<float>> logprobs(const PackedBatch& batch, ForwardState* saved,
                                              model::KvCalibrator* calibrator,
                                              model::ForwardRouting* routing) const override {
    // Dense models only (the engines refuse mixture-of-experts models when made); `routing` stays
    // empty.
    if (batch.replay_routing || batch.router_aux_loss_coef > 0) {
      return absl::FailedPreconditionError(
          "mixture-of-experts training is not built on the device backend");
    }
    engine::TrainStepOptions opts;
    opts.temperature = batch.temperature;
    opts.calibrator = calibrator;
    // --recompute layers: the step keeps each layer's input only and re-runs the layer in the
    // backward (engine/train_step.h), bit-identical to keeping everything.
    opts.recompute_layers = saved != nullptr && recompute_ == Recompute::kLayers;
    absl::StatusOr<model::TokenValues> lp = engine_->forward(*host_, batch.tokens, opts);
    if (!lp.ok()) return lp.status();
    ++forward_id_;
    if (saved != nullptr) {
      auto* s = static_cast<DeviceForwardState*>(saved);
      s->forward_id = forward_id_;
      int64_t rows = 0;
      for (const auto& t : batch.tokens) rows += static_cast<int64_t>(t.size());
      s->bytes = static_cast<int64_t>(sizeof(float)) *
                 engine::train_buffer_floats(host_->config(), rows, opts);
    }
    return gather_response(batch, *lp);
  }

  absl::Status backward(const ForwardState& saved, const PackedBatch& batch,
                        std::span<const float> dloss_dlogp, float* grads,
                        const model::GradientsFinal& on_final) override {
    if (static_cast<const DeviceForwardState&>(saved).forward_id != forward_id_) {
      return absl::FailedPreconditionError(
          "backward: another forward ran on the device since this one (one saved forward at a "
          "time on a device backend)");
    }
    if (grads != nullptr && pending_) return gradients_pending_error("backward");
    if (state_->sharded()) {
      // No whole gradient array on the device: staged into the learner's host buffer.
      if (grads == nullptr) {
        return absl::FailedPreconditionError(
            "backward: a sharded device backend has no gradient buffer of its own (its gradients "
            "go to the group)");
      }
      model::FlatGradientSink host(grads, on_final);
      return staged_backward(batch, dloss_dlogp, host);
    }
    // The state's gradient array: zeroed per call for a host buffer, per optimizer step for the
    // backend's own (where the backwards of the step accumulate).
    if (grads != nullptr || !pending_) {
      if (auto s = state_->zero_grads(); !s.ok()) return s;
    }
    if (grads == nullptr) pending_ = true;
    if (auto s =
            engine_->backward_into(*host_, scatter_response(batch, dloss_dlogp), state_->grads());
        !s.ok()) {
      pending_ = false;  // partial gradients: the next backward starts from zero
      return s;
    }
    if (grads != nullptr) {
      absl::StatusOr<std::vector<float>> g = state_->download(state_->grads());
      if (!g.ok()) return g.status();
      transfer_bytes_ += static_cast<int64_t>(g->size() * sizeof(float));
      for (size_t i = 0; i < g->size(); ++i) grads[i] += (*g)[i];
    }
    // Every gradient is final only once the backward is done.
    if (on_final) on_final(0);
    return absl::OkStatus();
  }

  absl::Status backward_to_sink(const ForwardState& saved, const PackedBatch& batch,
                                std::span<const float> dloss_dlogp,
                                model::GradientSink& sink) override {
    if (static_cast<const DeviceForwardState&>(saved).forward_id != forward_id_) {
      return absl::FailedPreconditionError(
          "backward: another forward ran on the device since this one (one saved forward at a "
          "time on a device backend)");
    }
    if (pending_) return gradients_pending_error("backward_to_sink");
    return staged_backward(batch, dloss_dlogp, sink);
  }

  absl::StatusOr<model::OptimizerStepStats> optimizer_step(float* grads) override {
    if (state_->sharded()) {
      return absl::FailedPreconditionError(
          "optimizer: sharded (ZeRO-2); optimizer_step_shard takes the shard's gradients");
    }
    const int64_t n = state_->num_params();
    const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
    if (grads != nullptr) {
      if (pending_) return gradients_pending_error("optimizer_step");
      if (auto s = state_->device().upload(state_->grads(), grads, bytes); !s.ok()) return s;
      transfer_bytes_ += bytes;
    } else if (!pending_) {
      if (auto s = state_->zero_grads(); !s.ok()) return s;  // no backward since the last step
    }
    pending_ = false;
    absl::StatusOr<model::OptimizerStepStats> stats = state_->step();
    if (!stats.ok()) return stats.status();
    if (auto s = engine_->refresh(*state_); !s.ok()) return s;
    if (grads != nullptr) {
      // The learner's buffer as model::AdamW leaves it: scaled and clipped.
      if (auto s = state_->device().download(grads, state_->grads(), bytes); !s.ok()) return s;
      transfer_bytes_ += bytes;
    }
    return stats;
  }
  absl::Status shard_optimizer(int64_t begin, int64_t end) override {
    if (engine_sharded_ || (state_->sharded() && (state_->shard_begin() != begin ||
                                                  state_->shard_size() != end - begin))) {
      return absl::FailedPreconditionError("optimizer: already sharded");
    }
    if (pending_) return gradients_pending_error("shard_optimizer");
    // A state made with this shard (make_train_backend's initial shard) is already cut.
    if (!state_->sharded()) {
      if (auto s = state_->shard(begin, end); !s.ok()) return s;
    }
    if (auto s = engine_->shard(begin, end); !s.ok()) return s;
    engine_sharded_ = true;
    return absl::OkStatus();
  }
  absl::StatusOr<model::OptimizerStepStats> optimizer_step_shard(std::span<float> grads,
                                                                 double grad_norm) override {
    if (pending_) return gradients_pending_error("optimizer_step_shard");
    return state_->step_shard(grads, grad_norm);
  }
  absl::Status gather_working(Collectives& group, const ShardLayout& layout,
                              std::string_view what) override {
    const int rank = group.rank();
    if (!state_->sharded() || layout.ranks() != group.size() ||
        state_->shard_begin() != layout.begin(rank) || state_->shard_size() != layout.size(rank)) {
      return absl::FailedPreconditionError(
          "gather_working: the master must be sharded to this rank's shard first");
    }
    absl::StatusOr<model::Model::WorkingStreams> mine = state_->encode_working();
    if (!mine.ok()) return mine.status();
    absl::StatusOr<model::Model::WorkingStreams> all =
        all_gather_working(group, *host_, layout.bounds, *mine, what);
    if (!all.ok()) return all.status();
    *mine = {};
    if (auto s = state_->install_working(*all); !s.ok()) return s;
    if (auto s = engine_->install_working(*all); !s.ok()) return s;
    working_hash_ = working_weights_hash(all->codes, all->scales, all->bf16);
    return absl::OkStatus();
  }
  absl::Status shard_working(const ShardLayout&, int) override {
    return absl::FailedPreconditionError(absl::StrCat(
        "trainer.shard params: ZeRO-3 is not implemented on the ",
        std::string(model::device_name(kind_)),
        " device training backend yet (grads_optimizer is; the CPU backend has params)"));
  }
  absl::StatusOr<std::vector<float>> master_shard() const override {
    return state_->download_master();
  }
  absl::StatusOr<model::WeightSet> export_weights_with_master(
      model::WeightFormat format, int64_t version,
      std::span<const float> whole_master) const override {
    return state_->export_with_master(format, version, whole_master);
  }
  absl::StatusOr<model::AdamW::RangeState> optimizer_range_state() const override {
    return state_->range_state();
  }
  absl::Status set_optimizer_range_state(model::AdamW::RangeState state) override {
    return state_->set_range_state(std::move(state));
  }
  int64_t gradient_staging_bytes() const override { return pool_.bytes(); }
  int64_t gradient_transfer_bytes() const override { return transfer_bytes_; }
  void requantize() override {
    // Benchmarks only (optimizer_step already re-quantizes); an error here would repeat in the
    // next step, which reports it.
    if (state_->requantize().ok()) engine_->refresh(*state_).IgnoreError();
  }
  const model::AdamWConfig& optimizer_config() const override { return state_->adamw_config(); }
  int64_t optimizer_steps() const override { return state_->steps(); }
  absl::Status set_learning_rate(double lr) override { return state_->set_lr(lr); }

  const model::KvScales& kv_scales() const override { return state_->kv_scales(); }
  absl::Status set_kv_scales(const model::KvScales& scales) override {
    if (auto s = state_->set_kv_scales(scales); !s.ok()) return s;
    if (auto s = engine_->set_kv_scales(scales); !s.ok()) return s;
    return host_->set_kv_scales(scales);
  }
  absl::Status calibration_forward(const model::TokenBatch& sequences,
                                   model::KvCalibrator* calibrator) const override {
    engine::TrainStepOptions opts;
    opts.calibrator = calibrator;
    ++forward_id_;
    return engine_->forward(*host_, sequences, opts).status();
  }

  absl::StatusOr<model::WeightSet> export_weights(model::WeightFormat format,
                                                  int64_t version) const override {
    switch (format) {
      case model::WeightFormat::kFP8:
        return state_->export_fp8(version);
      case model::WeightFormat::kBF16:
        return state_->export_bf16(version);
      default:
        // Checkpoints (and a generation policy whose linears differ from training's): the whole
        // fp32 master in host memory while the caller holds the set.
        return state_->export_f32(version);
    }
  }
  absl::StatusOr<uint64_t> master_fingerprint() const override {
    if (state_->sharded()) return working_hash_;  // the state every rank shares
    const int64_t n = state_->num_params();
    std::vector<float> chunk(static_cast<size_t>(std::min(n, kFingerprintChunkFloats)));
    WeightHasher hasher;
    for (int64_t i0 = 0; i0 < n; i0 += kFingerprintChunkFloats) {
      const int64_t count = std::min(kFingerprintChunkFloats, n - i0);
      if (auto s = state_->device().download(chunk.data(), state_->master() + i0,
                                             count * static_cast<int64_t>(sizeof(float)));
          !s.ok()) {
        return s;
      }
      hasher.add(std::span<const float>(chunk.data(), static_cast<size_t>(count)));
    }
    return hasher.value();
  }

  absl::Status save_optimizer_state(const std::string& path) const override {
    return state_->save_optimizer_state(path);
  }
  absl::Status load_optimizer_state(const std::string& path) override {
    return state_->load_optimizer_state(path);
  }

 private:
  // The backward of the last forward, each tensor's gradient staged in device memory and added
  // into `host` as it becomes final.
  absl::Status staged_backward(const PackedBatch& batch, std::span<const float> dloss_dlogp,
                               model::GradientSink& host) {
    if (numel_.empty()) {
      for (const model::ParamInfo& p : host_->layout().params()) numel_[p.offset] = p.numel;
      int64_t largest = 1;
      for (const model::ParamInfo& p : host_->layout().params()) {
        largest = std::max(largest, p.numel);
      }
      absl::StatusOr<void*> o = state_->device().allocate(4 * largest, "gradient staging overflow");
      if (!o.ok()) {
        numel_.clear();
        return o.status();
      }
      overflow_ = static_cast<float*>(*o);
    }
    StagingSink staging(state_->device(), pool_, numel_, host, overflow_, &transfer_bytes_);
    absl::Status s =
        engine_->backward_to_sink(*host_, scatter_response(batch, dloss_dlogp), staging);
    if (s.ok()) s = staging.status();
    return s;
  }

  model::Device kind_;
  // The description (Model::ForDescription): config, policy, layout, KV scales; no weights.
  std::unique_ptr<model::Model> host_;
  std::unique_ptr<DeviceStepEngine> engine_;
  std::unique_ptr<engine::DeviceTrainState> state_;
  Recompute recompute_ = Recompute::kNone;
  mutable int64_t forward_id_ = 0;  // forwards run on the device so far
  // The state's gradient array holds the backwards of a step not yet taken (backward(nullptr)).
  bool pending_ = false;
  int64_t transfer_bytes_ = 0;  // gradient_transfer_bytes()
  // Staged backwards: the tensors' sizes by offset, the device blocks, and the block a failed
  // allocation hands out.
  std::unordered_map<int64_t, int64_t> numel_;
  StagingPool pool_;
  float* overflow_ = nullptr;
  // Sharded: working_weights_hash of the working copies last installed (master_fingerprint).
  uint64_t working_hash_ = 0;
  bool engine_sharded_ = false;  // shard_optimizer ran
};

// The host mirror's engine: it owns the model CpuTrainOps read (the mirror's "device" weights),
// buffers in host memory; refresh() copies the state's master into the model and re-derives its
// working copies (Model::refresh).
class HostStepEngine final : public DeviceStepEngine {
 public:
  explicit HostStepEngine(std::unique_ptr<model::Model> model)
      : model_(std::move(model)), ops_(*model_) {}

  absl::StatusOr<model::TokenValues> forward(const model::Model& host,
                                             const model::TokenBatch& batch,
                                             const engine::TrainStepOptions& opts) override {
    absl::StatusOr<engine::TrainTables> t = engine::build_train_tables(batch, host.config());
    if (!t.ok()) return t.status();
    tables_ = std::move(*t);
    opts_ = opts;
    if (auto s = ops_.load_tables(tables_); !s.ok()) return s;
    storage_.assign(
        static_cast<size_t>(engine::train_buffer_floats(host.config(), tables_.rows, opts_)), 0.0f);
    buffers_ = engine::carve_train_buffers(host.config(), tables_.rows, opts_, storage_.data());
    return engine::train_forward(host.config(), host.policy(), host.layout(), ops_, buffers_,
                                 tables_, opts_);
  }
  absl::Status backward_into(const model::Model& host, const model::TokenValues& dlogp,
                             float* device_grads) override {
    if (buffers_.layers.empty()) return absl::FailedPreconditionError("backward: no forward ran");
    return engine::train_backward(host.config(), host.policy(), host.layout(), ops_, buffers_,
                                  tables_, dlogp, device_grads, opts_);
  }
  absl::Status refresh(const engine::DeviceTrainState& state) override {
    absl::StatusOr<std::vector<float>> master = state.download(state.master());
    if (!master.ok()) return master.status();
    std::copy(master->begin(), master->end(), model_->params().begin());
    model_->refresh();
    return absl::OkStatus();
  }
  absl::Status set_kv_scales(const model::KvScales& scales) override {
    return model_->set_kv_scales(scales);  // the ops read the model's scales
  }
  absl::Status backward_to_sink(const model::Model& host, const model::TokenValues& dlogp,
                                model::GradientSink& sink) override {
    if (buffers_.layers.empty()) return absl::FailedPreconditionError("backward: no forward ran");
    return engine::train_backward(host.config(), host.policy(), host.layout(), ops_, buffers_,
                                  tables_, dlogp, sink, opts_);
  }
  absl::Status shard(int64_t begin, int64_t end) override {
    return model_->shard_master(begin, end);
  }
  absl::Status install_working(const model::Model::WorkingStreams& all) override {
    return model_->install_working(all);
  }

 private:
  std::unique_ptr<model::Model> model_;  // before ops_, which points at it
  engine::CpuTrainOps ops_;
  engine::TrainTables tables_;
  engine::TrainStepOptions opts_;
  std::vector<float> storage_;
  engine::TrainBuffers buffers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainBackend>> make_device_train_backend(
    model::Device kind, std::unique_ptr<DeviceStepEngine> engine,
    std::unique_ptr<engine::DeviceTrainState> state) {
  absl::StatusOr<std::unique_ptr<model::Model>> description =
      model::Model::ForDescription(state->config(), state->policy());
  if (!description.ok()) return description.status();
  if (auto s = (*description)->set_kv_scales(state->kv_scales()); !s.ok()) return s;
  return std::make_unique<DeviceTrainBackend>(kind, std::move(*description), std::move(engine),
                                              std::move(state));
}

absl::StatusOr<std::unique_ptr<TrainBackend>> make_host_mirror_train_backend(
    std::unique_ptr<model::Model> model, const model::AdamWConfig& adamw) {
  engine::TrainStateOptions options;
  options.adamw = adamw;
  absl::StatusOr<std::unique_ptr<engine::DeviceTrainState>> state =
      engine::DeviceTrainState::Create(*model, options, engine::make_cpu_train_device());
  if (!state.ok()) return state.status();
  return make_device_train_backend(
      model::Device::kCpu, std::make_unique<HostStepEngine>(std::move(model)), std::move(*state));
}

}  // namespace fp8rl::train
