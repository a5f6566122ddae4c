// AdamW, learning-rate schedule and training checkpoints.
#include "model/optimizer.h"

#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/safetensors.h"
#include "kernels/device_math/adamw.h"

namespace fp8rl::model {

absl::StatusOr<LrSchedule> parse_lr_schedule(std::string_view name) {
  if (name == "constant") return LrSchedule::kConstant;
  if (name == "cosine") return LrSchedule::kCosine;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown lr schedule '", std::string(name), "' (expected constant or cosine)"));
}

absl::Status validate_adamw_config(const AdamWConfig& c) {
  auto bad = [](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
  };
  if (!(c.lr > 0) || !std::isfinite(c.lr)) return bad("lr", "must be > 0");
  if (!(c.beta1 >= 0 && c.beta1 < 1)) return bad("beta1", "must be in [0, 1)");
  if (!(c.beta2 >= 0 && c.beta2 < 1)) return bad("beta2", "must be in [0, 1)");
  if (!(c.eps > 0)) return bad("eps", "must be > 0");
  if (!(c.weight_decay >= 0)) return bad("weight_decay", "must be >= 0");
  if (!(c.max_grad_norm >= 0)) return bad("max_grad_norm", "must be >= 0");
  if (c.warmup_steps < 0) return bad("warmup_steps", "must be >= 0");
  if (c.schedule == LrSchedule::kCosine && c.total_steps <= 0) {
    return bad("total_steps", "must be > 0 with the cosine schedule");
  }
  if (!(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1))
    return bad("min_lr_ratio", "must be in [0, 1]");
  return absl::OkStatus();
}

bool adamw_decays(ParamKind kind) {
  return kind == ParamKind::kLinear || kind == ParamKind::kEmbedding ||
         kind == ParamKind::kLmHead || kind == ParamKind::kRouter;
}

AdamW::AdamW(const Model& model, const AdamWConfig& config) : config_(config) {
  const int64_t n = model.num_params();
  m_.assign(n, 0.0f);
  v_.assign(n, 0.0f);
  decay_.assign(n, 0);
  for (const ParamInfo& p : model.layout().params()) {
    std::fill(decay_.begin() + p.offset, decay_.begin() + p.offset + p.numel,
              adamw_decays(p.kind) ? 1 : 0);
  }
}

absl::Status AdamW::set_lr(double lr) {
  if (!std::isfinite(lr) || !(lr > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("lr: must be finite and > 0, got ", lr));
  }
  config_.lr = lr;
  return absl::OkStatus();
}

double adamw_lr_at(const AdamWConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step < c.warmup_steps) {
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  }
  if (c.schedule == LrSchedule::kConstant) return c.lr;
  const double span = std::max<int64_t>(1, c.total_steps - c.warmup_steps);
  const double t = std::min(1.0, static_cast<double>(step - c.warmup_steps) / span);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * t));
  return c.lr * (c.min_lr_ratio + (1.0 - c.min_lr_ratio) * cosine);
}

double AdamW::lr_at(int64_t step) const { return adamw_lr_at(config_, step); }

absl::StatusOr<OptimizerStepStats> AdamW::step(Model& model, float* grads, float grad_scale) {
  const int64_t n = model.num_params();
  if (sharded_) {
    return absl::FailedPreconditionError(
        "optimizer: sharded (ZeRO-2); step_shard takes the shard's gradients");
  }
  if (n != static_cast<int64_t>(m_.size())) {
    return absl::InvalidArgumentError("optimizer: model does not match the optimizer's size");
  }
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    grads[i] *= grad_scale;
    sq += static_cast<double>(grads[i]) * grads[i];
  }
  const double grad_norm = std::sqrt(sq);
  if (!std::isfinite(grad_norm)) {
    return absl::InvalidArgumentError("optimizer: gradient is not finite; step skipped");
  }
  OptimizerStepStats stats = apply(model.params().data(), grads, n, grad_norm);
  model.refresh();
  return stats;
}

absl::Status AdamW::shard(int64_t begin, int64_t end) {
  if (sharded_) return absl::InvalidArgumentError("optimizer: already sharded");
  if (begin < 0 || begin > end || end > static_cast<int64_t>(m_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: shard [", begin, ", ", end, ") is outside [0, ", m_.size(), ")"));
  }
  // New vectors, so the memory of the other ranks' parameters is returned.
  auto slice = [&](auto& v) {
    std::remove_reference_t<decltype(v)> part(v.begin() + begin, v.begin() + end);
    v.swap(part);
  };
  slice(m_);
  slice(v_);
  slice(decay_);
  begin_ = begin;
  sharded_ = true;
  return absl::OkStatus();
}

absl::StatusOr<OptimizerStepStats> AdamW::step_shard(std::span<float> params,
                                                     std::span<float> grads, double grad_norm,
                                                     int64_t params_begin) {
  const int64_t n = shard_size();
  if (!sharded_) return absl::FailedPreconditionError("optimizer: step_shard before shard()");
  const int64_t params_end = params_begin + static_cast<int64_t>(params.size());
  if (static_cast<int64_t>(grads.size()) != n || params_begin > begin_ || params_end < begin_ + n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: step_shard got ", grads.size(), " gradients and the parameters [", params_begin,
        ", ", params_end, ") for the shard [", begin_, ", ", begin_ + n, ")"));
  }
  if (!std::isfinite(grad_norm)) {
    return absl::InvalidArgumentError("optimizer: gradient is not finite; step skipped");
  }
  return apply(params.data() + (begin_ - params_begin), grads.data(), n, grad_norm);
}

OptimizerStepStats AdamW::apply(float* p, float* grads, int64_t n, double grad_norm) {
  OptimizerStepStats stats;
  stats.grad_norm = grad_norm;
  const float clip = kernels::dm::clip_factor(stats.grad_norm, config_.max_grad_norm);
  stats.clipped = kernels::dm::clip_applies(stats.grad_norm, config_.max_grad_norm);
  stats.lr = lr_at(step_);
  ++step_;
  stats.step = step_;
  const kernels::dm::AdamWCoeffs coeffs = kernels::dm::adamw_coeffs(
      stats.lr, config_.beta1, config_.beta2, config_.eps, config_.weight_decay, step_);
  for (int64_t i = 0; i < n; ++i) {
    const float g = grads[i] * clip;
    grads[i] = g;
    kernels::dm::adamw_update(g, decay_[i] != 0, coeffs, p[i], m_[i], v_[i]);
  }
  return stats;
}

absl::Status save_adamw_state(const std::string& path, const std::vector<float>& m,
                              const std::vector<float>& v, int64_t step) {
  if (m.size() != v.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": exp_avg has ", m.size(), " values, exp_avg_sq ", v.size()));
  }
  SafetensorsWriter w;
  const int64_t n = static_cast<int64_t>(m.size());
  if (auto s = w.add_f32("adamw.exp_avg", {n}, m); !s.ok()) return s;
  if (auto s = w.add_f32("adamw.exp_avg_sq", {n}, v); !s.ok()) return s;
  w.set_metadata("step", absl::StrCat(step));
  return w.write(path);
}

absl::StatusOr<AdamWState> load_adamw_state(const std::string& path, int64_t num_params) {
  auto f = SafetensorsFile::Open(path);
  if (!f.ok()) return f.status();
  auto m = f->read_f32("adamw.exp_avg");
  if (!m.ok()) return m.status();
  auto v = f->read_f32("adamw.exp_avg_sq");
  if (!v.ok()) return v.status();
  if (static_cast<int64_t>(m->size()) != num_params ||
      static_cast<int64_t>(v->size()) != num_params) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": optimizer state has ", m->size(),
                                                   " values, the model has ", num_params));
  }
  auto it = f->metadata().find("step");
  AdamWState state;
  if (it == f->metadata().end() || !absl::SimpleAtoi(it->second, &state.step) || state.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": missing or bad 'step' metadata"));
  }
  state.m = std::move(*m);
  state.v = std::move(*v);
  return state;
}

namespace {
absl::Status sharded_state_error(const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat(
      path,
      ": the optimizer is sharded (trainer.shard grads_optimizer); its state is saved per rank "
      "(train::save_checkpoint), not as one file"));
}
}  // namespace

AdamW::RangeState AdamW::range_state() const { return {m_, v_, step_}; }

absl::Status AdamW::set_range_state(RangeState state) {
  if (state.m.size() != m_.size() || state.v.size() != v_.size() || state.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: state of ", state.m.size(), " exp_avg and ", state.v.size(),
        " exp_avg_sq values at step ", state.step, " for a range of ", m_.size(), " parameters"));
  }
  m_ = std::move(state.m);
  v_ = std::move(state.v);
  step_ = state.step;
  return absl::OkStatus();
}

absl::Status AdamW::save_state(const std::string& path) const {
  if (sharded_) return sharded_state_error(path);
  return save_adamw_state(path, m_, v_, step_);
}

absl::Status AdamW::load_state(const std::string& path) {
  if (sharded_) return sharded_state_error(path);
  auto state = load_adamw_state(path, static_cast<int64_t>(m_.size()));
  if (!state.ok()) return state.status();
  m_ = std::move(state->m);
  v_ = std::move(state->v);
  step_ = state->step;
  return absl::OkStatus();
}

absl::Status write_training_checkpoint(
    const std::string& dir, const WeightSet& f32_weights,
    const std::function<absl::Status(const std::string& path)>& save_optimizer_state) {
  // The optimizer file is staged beside the folder, then copied into the new folder.
  const std::string staged = temp_path_for(dir + ".optimizer.safetensors");
  if (auto s = save_optimizer_state(staged); !s.ok()) return s;
  absl::Status st = write_dir_atomic(dir, [&](const std::string& tmp) -> absl::Status {
    SafetensorsWriter writer;
    if (auto s = add_to_writer(f32_weights, &writer); !s.ok()) return s;
    writer.set_metadata("format", "pt");
    if (auto s = write_file_atomic(tmp + "/config.json", f32_weights.config_json); !s.ok()) {
      return s;
    }
    if (auto s = writer.write(tmp + "/model.safetensors"); !s.ok()) return s;
    return copy_file(staged, tmp + "/optimizer.safetensors");
  });
  remove_all_quietly(staged);
  return st;
}

absl::Status save_training_checkpoint(const std::string& dir, const Model& model,
                                      const AdamW& optimizer) {
  auto set = model.export_weights(WeightFormat::kF32);
  if (!set.ok()) return set.status();
  return write_training_checkpoint(
      dir, *set, [&](const std::string& path) { return optimizer.save_state(path); });
}

absl::StatusOr<std::unique_ptr<Model>> load_training_checkpoint(const std::string& dir,
                                                                const PrecisionPolicy& policy,
                                                                AdamW* optimizer) {
  auto model = Model::Load(dir, policy);
  if (!model.ok()) return model.status();
  if (auto s = optimizer->load_state(dir + "/optimizer.safetensors"); !s.ok()) return s;
  return model;
}

}  // namespace fp8rl::model
