// DeviceTrainState: the optimizer step, re-quantization, KV calibration records, export and
// checkpoints written once over TrainDevice primitives (device or host memory).
#include "engine/train_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/formats.h"

namespace fp8rl::engine {
namespace {

constexpr int64_t kAlign = 256;
int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Scales of a 128x128-block matrix in the CUDA GEMM layout (kernels/cuda/fp8_cuda.h: block
// columns padded to a multiple of 4), the larger of the two layouts, for the memory plan.
int64_t block128_gemm_scale_count(int64_t rows, int64_t cols) {
  const int64_t kb = kernels::ceil_div(cols, kernels::kBlock);
  return kernels::ceil_div(rows, kernels::kBlock) * kernels::ceil_div(kb, 4) * 4;
}

std::string kv_scale_name(int64_t layer, char kv) {
  return absl::StrCat("model.layers.", layer, ".self_attn.", std::string(1, kv), "_scale");
}

std::vector<uint8_t> f32_bytes(const float* x, int64_t n) {
  std::vector<uint8_t> out(n * 4);
  std::memcpy(out.data(), x, n * 4);
  return out;
}

// Whether Model::export_weights(kFP8) writes parameter p as F8_E4M3 codes + scales.
bool exports_fp8(const model::ParamInfo& p, const model::PrecisionPolicy& policy,
                 int64_t n_layers) {
  return p.kind == model::ParamKind::kLinear &&
         policy.layer_linear(p.layer, n_layers) != model::Precision::kBF16;
}
// Whether the policy runs parameter p as an FP8 linear (it then has a working copy on the device).
bool runs_fp8(const model::ParamInfo& p, const model::PrecisionPolicy& policy, int64_t n_layers) {
  return p.kind == model::ParamKind::kLinear &&
         policy.layer_linear(p.layer, n_layers) == model::Precision::kFP8;
}

// The FP8 codes the model holds for the linear at `offset` when it is a dense decoder linear
// (q k v o gate up down); nullptr for experts and anything the model does not run in FP8.
const kernels::Fp8Matrix* model_fp8_copy(const model::Model& model, int64_t offset) {
  const float* master = model.params().data() + offset;
  for (int64_t l = 0; l < model.config().num_hidden_layers; ++l) {
    for (int64_t j = 0; j < 7; ++j) {
      const model::LinearWeight& w = model.layer_linear(l, j);
      if (w.master == master && w.precision == model::Precision::kFP8 &&
          w.q.mode == kernels::ScalingMode::kBlock128x128) {
        return &w.q;
      }
    }
  }
  return nullptr;
}

absl::Status sharded_error(std::string_view call) {
  return absl::FailedPreconditionError(
      absl::StrCat("train state: ", std::string(call),
                   " needs the whole master; this state holds a shard (trainer.shard "
                   "grads_optimizer)"));
}

// The block rows [r0, r1) of a 2-D tensor that the flat piece [pb, pe) covers (cut points only).
struct RowRange {
  int64_t r0 = 0, r1 = 0;
};
RowRange rows_of(const model::ParamInfo& p, int64_t pb, int64_t pe) {
  const int64_t cols = p.numel / p.shape[0];
  return {(pb - p.offset) / cols, (pe - p.offset) / cols};
}

}  // namespace

TrainStateBytes plan_train_state_bytes(const model::ModelConfig& config,
                                       const model::PrecisionPolicy& policy,
                                       const TrainStateOptions& options) {
  const model::ParamLayout layout(config);
  const int64_t n = layout.total();
  const int64_t n_layers = config.num_hidden_layers;
  TrainStateBytes b;
  b.master = aligned(4 * n);
  b.grads = aligned(4 * n);
  b.moments = 2 * aligned(4 * n);
  int64_t bf16_max = 0, fresh_max = 0;
  for (const model::ParamInfo& p : layout.params()) {
    const int64_t scales = block128_gemm_scale_count(p.shape[0], p.numel / p.shape[0]);
    if (runs_fp8(p, policy, n_layers)) {
      const int64_t one = aligned(p.numel) + aligned(4 * scales);
      b.fp8_weights += options.keep_transposed ? 2 * one : one;
    } else if (exports_fp8(p, policy, n_layers)) {
      fresh_max = std::max(fresh_max, aligned(p.numel) + aligned(4 * scales));
    } else {
      bf16_max = std::max(bf16_max, aligned(2 * p.numel));
    }
  }
  if (options.keep_bf16_copy) b.bf16_copy = aligned(2 * n);
  b.kv_records = aligned(4 * options.kv_record_capacity * n_layers * 2);
  b.export_scratch = bf16_max + fresh_max;
  return b;
}

DeviceTrainState::DeviceTrainState(const model::Model& model, const TrainStateOptions& options,
                                   std::unique_ptr<TrainDevice> device)
    : config_(model.config()),
      policy_(model.policy()),
      layout_(model.config()),
      options_(options),
      device_(std::move(device)),
      calibrator_(model.config().num_hidden_layers) {}

absl::StatusOr<std::unique_ptr<DeviceTrainState>> DeviceTrainState::Create(
    const model::Model& model, const TrainStateOptions& options,
    std::unique_ptr<TrainDevice> device) {
  if (auto s = model::validate_adamw_config(options.adamw); !s.ok()) return s;
  if (model.inference_only()) {
    return absl::InvalidArgumentError(
        "train state: an inference-only model holds no fp32 master to train");
  }
  if (options.kv_record_capacity < 1) {
    return absl::InvalidArgumentError("kv_record_capacity: must be >= 1");
  }
  if (device == nullptr) return absl::InvalidArgumentError("train state: no device");
  std::unique_ptr<DeviceTrainState> state(new DeviceTrainState(model, options, std::move(device)));
  if (auto s = state->init(model); !s.ok()) return s;
  return state;
}

absl::Status DeviceTrainState::init(const model::Model& model) {
  TrainDevice& dev = *device_;
  const int64_t n = num_params();
  const int64_t n_layers = config_.num_hidden_layers;
  bytes_ = plan_train_state_bytes(config_, policy_, options_);
  auto alloc_f32 = [&](float** out, int64_t count, const std::string& what) -> absl::Status {
    auto p = dev.allocate(4 * std::max<int64_t>(count, 1), what);
    if (!p.ok()) return p.status();
    *out = static_cast<float*>(*p);
    return absl::OkStatus();
  };
  // A rank of a sharded group made with its shard: only the shard's optimizer state.
  const bool pre_sharded = options_.shard_end >= 0;
  if (pre_sharded) {
    if (auto s = check_shard(options_.shard_begin, options_.shard_end); !s.ok()) return s;
    if (options_.keep_bf16_copy) {
      return absl::InvalidArgumentError(
          "train state: keep_bf16_copy holds the whole master in bf16; not with a shard");
    }
  }
  begin_ = pre_sharded ? options_.shard_begin : 0;
  held_ = pre_sharded ? options_.shard_end - options_.shard_begin : n;
  if (auto s = alloc_f32(&master_, held_, "master weights"); !s.ok()) return s;
  if (auto s = alloc_f32(&grads_, held_, "gradients"); !s.ok()) return s;
  if (auto s = alloc_f32(&m_, held_, "AdamW exp_avg"); !s.ok()) return s;
  if (auto s = alloc_f32(&v_, held_, "AdamW exp_avg_sq"); !s.ok()) return s;
  if (auto s = dev.upload(master_, model.params().data() + begin_, 4 * held_); !s.ok()) return s;

  // Weight-decay runs over the flat buffer (parameters are laid out in order, back to back).
  for (const model::ParamInfo& p : layout_.params()) {
    const bool decay = model::adamw_decays(p.kind);
    if (!runs_.empty() && runs_.back().decay == decay &&
        runs_.back().offset + runs_.back().count == p.offset) {
      runs_.back().count += p.numel;
    } else {
      runs_.push_back({p.offset, p.numel, decay});
    }
  }

  // FP8 working copies: the model's own codes where it has them (pinned FP8 checkpoint codes
  // included), a fresh quantization of the master otherwise.
  const std::vector<model::ParamInfo>& params = layout_.params();
  fp8_index_.assign(params.size(), -1);
  int64_t bf16_max = 0, fresh_max_codes = 0, fresh_max_scales = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const model::ParamInfo& p = params[i];
    const int64_t rows = p.shape[0], cols = p.numel / p.shape[0];
    if (!runs_fp8(p, policy_, n_layers)) {
      if (exports_fp8(p, policy_, n_layers)) {
        fresh_max_codes = std::max(fresh_max_codes, p.numel);
        fresh_max_scales = std::max(fresh_max_scales, dev.block_scale_count(rows, cols));
      } else {
        bf16_max = std::max(bf16_max, p.numel);
      }
      continue;
    }
    Fp8Weight w;
    w.param = static_cast<int64_t>(i);
    w.rows = rows;
    w.cols = cols;
    const int64_t scales = dev.block_scale_count(rows, cols);
    auto codes = dev.allocate(p.numel, p.name);
    if (!codes.ok()) return codes.status();
    if (auto s = alloc_f32(&w.scales, scales, p.name + "_scale_inv"); !s.ok()) return s;
    w.codes = static_cast<uint8_t*>(*codes);
    if (options_.keep_transposed) {
      auto t = dev.allocate(p.numel, p.name + " (transposed)");
      if (!t.ok()) return t.status();
      w.t_codes = static_cast<uint8_t*>(*t);
      if (auto s = alloc_f32(&w.t_scales, dev.block_scale_count(cols, rows),
                             p.name + "_scale_inv (transposed)");
          !s.ok()) {
        return s;
      }
    }
    const kernels::Fp8Matrix* held = model_fp8_copy(model, p.offset);
    absl::Status st;
    if (held != nullptr && held->rows == rows && held->cols == cols) {
      st = dev.upload_block128(*held, w.codes, w.scales);
    } else if (pre_sharded) {  // the device holds a shard of the master: quantized on the host
      st = dev.upload_block128(kernels::quantize(model.params().data() + p.offset, rows, cols,
                                                 kernels::ScalingMode::kBlock128x128,
                                                 {.pow2_scales = policy_.pow2_scales}),
                               w.codes, w.scales);
    } else {
      st = dev.quantize_block128(master_ + p.offset, rows, cols, policy_.pow2_scales, w.codes,
                                 w.scales);
    }
    if (!st.ok()) return st;
    if (w.t_codes != nullptr) {
      if (auto s = dev.transpose_block128(w.codes, w.scales, rows, cols, w.t_codes, w.t_scales);
          !s.ok()) {
        return s;
      }
    }
    fp8_index_[i] = static_cast<int64_t>(fp8_.size());
    fp8_.push_back(w);
  }
  if (options_.keep_bf16_copy) {
    auto b = dev.allocate(2 * n, "bf16 copy");
    if (!b.ok()) return b.status();
    bf16_ = static_cast<uint16_t*>(*b);
    if (auto s = dev.round_bf16(master_, n, bf16_); !s.ok()) return s;
  }
  if (auto s = alloc_f32(&kv_records_, options_.kv_record_capacity * n_layers * 2, "KV records");
      !s.ok()) {
    return s;
  }
  if (bf16_max > 0) {
    auto b = dev.allocate(2 * bf16_max, "export scratch (bf16)");
    if (!b.ok()) return b.status();
    bf16_scratch_ = static_cast<uint16_t*>(*b);
    bf16_scratch_count_ = bf16_max;
  }
  if (fresh_max_codes > 0) {
    auto c = dev.allocate(fresh_max_codes, "export scratch (fp8 codes)");
    if (!c.ok()) return c.status();
    fp8_scratch_codes_ = static_cast<uint8_t*>(*c);
    if (auto s = alloc_f32(&fp8_scratch_scales_, fresh_max_scales, "export scratch (fp8 scales)");
        !s.ok()) {
      return s;
    }
  }
  kv_scales_ = model.kv_scales();
  if (pre_sharded) {
    if (auto s = allocate_encode_scratch(); !s.ok()) return s;
    restrict_runs();
    sharded_ = true;
  }
  return dev.synchronize();
}

void DeviceTrainState::restrict_runs() {
  std::vector<DecayRun> runs;
  const int64_t end = begin_ + held_;
  for (const DecayRun& r : runs_) {
    const int64_t b = std::max(begin_, r.offset), e = std::min(end, r.offset + r.count);
    if (b < e) runs.push_back({b - begin_, e - b, r.decay});
  }
  runs_ = std::move(runs);
}

const Fp8Weight* DeviceTrainState::fp8_weight(int64_t param) const {
  if (param < 0 || param >= static_cast<int64_t>(fp8_index_.size()) || fp8_index_[param] < 0) {
    return nullptr;
  }
  return &fp8_[fp8_index_[param]];
}

absl::Status DeviceTrainState::zero_grads() { return device_->fill_zero(grads_, 4 * held_); }

absl::Status DeviceTrainState::set_lr(double lr) {
  if (!std::isfinite(lr) || !(lr > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("lr: must be finite and > 0, got ", lr));
  }
  options_.adamw.lr = lr;
  return absl::OkStatus();
}

absl::StatusOr<model::OptimizerStepStats> DeviceTrainState::step(float grad_scale) {
  if (sharded_) return sharded_error("step");
  const model::AdamWConfig& c = options_.adamw;
  auto sq = device_->scale_and_sum_squares(grads_, num_params(), grad_scale);
  if (!sq.ok()) return sq.status();
  model::OptimizerStepStats stats;
  stats.grad_norm = std::sqrt(*sq);
  if (!std::isfinite(stats.grad_norm)) {
    return absl::InvalidArgumentError("optimizer: gradient is not finite; step skipped");
  }
  const float clip = kernels::dm::clip_factor(stats.grad_norm, c.max_grad_norm);
  stats.clipped = kernels::dm::clip_applies(stats.grad_norm, c.max_grad_norm);
  stats.lr = lr_at(step_);
  const kernels::dm::AdamWCoeffs coeffs =
      kernels::dm::adamw_coeffs(stats.lr, c.beta1, c.beta2, c.eps, c.weight_decay, step_ + 1);
  for (const DecayRun& r : runs_) {
    if (auto s = device_->adamw(master_ + r.offset, m_ + r.offset, v_ + r.offset, grads_ + r.offset,
                                r.count, clip, r.decay, coeffs);
        !s.ok()) {
      return s;
    }
  }
  ++step_;
  stats.step = step_;
  if (auto s = requantize(); !s.ok()) return s;
  return stats;
}

absl::Status DeviceTrainState::requantize() {
  if (sharded_) return sharded_error("requantize");
  TrainDevice& dev = *device_;
  for (const Fp8Weight& w : fp8_) {
    const int64_t offset = layout_.params()[w.param].offset;
    if (auto s = dev.quantize_block128(master_ + offset, w.rows, w.cols, policy_.pow2_scales,
                                       w.codes, w.scales);
        !s.ok()) {
      return s;
    }
    if (w.t_codes != nullptr) {
      if (auto s = dev.transpose_block128(w.codes, w.scales, w.rows, w.cols, w.t_codes, w.t_scales);
          !s.ok()) {
        return s;
      }
    }
  }
  if (bf16_ != nullptr) return dev.round_bf16(master_, num_params(), bf16_);
  return absl::OkStatus();
}

// ---- ZeRO-2 -------------------------------------------------------------------------------------

absl::Status DeviceTrainState::allocate_encode_scratch() {
  // The largest FP8 tensor: encode_working quantizes its block rows into this scratch.
  int64_t codes = 1, scales = 1;
  for (const Fp8Weight& w : fp8_) {
    codes = std::max(codes, w.rows * w.cols);
    scales = std::max(scales, device_->block_scale_count(w.rows, w.cols));
  }
  absl::StatusOr<void*> c = device_->allocate(codes, "working copies encode scratch (fp8 codes)");
  if (!c.ok()) return c.status();
  absl::StatusOr<void*> s = device_->allocate(4 * scales, "working copies encode scratch (scales)");
  if (!s.ok()) {
    device_->release(*c);
    return s.status();
  }
  enc_codes_ = static_cast<uint8_t*>(*c);
  enc_scales_ = static_cast<float*>(*s);
  return absl::OkStatus();
}

absl::Status DeviceTrainState::check_shard(int64_t begin, int64_t end) const {
  const int64_t n = num_params();
  if (begin < 0 || begin > end || end > n || !model::shard_cut_allowed(layout_, begin) ||
      !model::shard_cut_allowed(layout_, end)) {
    return absl::InvalidArgumentError(
        absl::StrCat("train state: shard [", begin, ", ", end, ") is not a range between cut ",
                     "points (tensor starts or 128-row boundaries) of [0, ", n, ")"));
  }
  return model::check_bf16_working(config_, policy_, "train state");
}

absl::Status DeviceTrainState::shard(int64_t begin, int64_t end) {
  if (sharded_) return absl::FailedPreconditionError("train state: already sharded");
  if (auto s = check_shard(begin, end); !s.ok()) return s;
  TrainDevice& dev = *device_;
  const int64_t held = end - begin;
  // New buffers first (a failure leaves the state whole), then the shard's values move over.
  if (auto s = allocate_encode_scratch(); !s.ok()) return s;
  std::vector<void*> fresh = {enc_codes_, enc_scales_};
  auto alloc = [&](int64_t bytes, const std::string& what) -> absl::StatusOr<void*> {
    absl::StatusOr<void*> p = dev.allocate(std::max<int64_t>(bytes, 4), what);
    if (p.ok()) fresh.push_back(*p);
    return p;
  };
  auto fail = [&](const absl::Status& s) {
    for (void* p : fresh) dev.release(p);
    enc_codes_ = nullptr;
    enc_scales_ = nullptr;
    return s;
  };
  absl::StatusOr<void*> master = alloc(4 * held, "master weights (shard)");
  if (!master.ok()) return fail(master.status());
  absl::StatusOr<void*> grads = alloc(4 * held, "gradients (shard)");
  if (!grads.ok()) return fail(grads.status());
  absl::StatusOr<void*> m = alloc(4 * held, "AdamW exp_avg (shard)");
  if (!m.ok()) return fail(m.status());
  absl::StatusOr<void*> v = alloc(4 * held, "AdamW exp_avg_sq (shard)");
  if (!v.ok()) return fail(v.status());
  // Through the host in pieces (once, when the group shards).
  std::vector<float> chunk(
      static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(held, 1), int64_t{1} << 20)));
  for (auto [from, to] : {std::pair<float*, void*>{master_, *master}, {m_, *m}, {v_, *v}}) {
    for (int64_t i0 = 0; i0 < held; i0 += std::ssize(chunk)) {
      const int64_t count = std::min<int64_t>(std::ssize(chunk), held - i0);
      if (auto s = dev.download(chunk.data(), from + begin + i0, 4 * count); !s.ok()) {
        return fail(s);
      }
      if (auto s = dev.upload(static_cast<float*>(to) + i0, chunk.data(), 4 * count); !s.ok()) {
        return fail(s);
      }
    }
  }
  for (float* old : {master_, grads_, m_, v_}) dev.release(old);
  if (bf16_ != nullptr) {  // a copy of the whole master: not kept under sharding
    dev.release(bf16_);
    bf16_ = nullptr;
  }
  master_ = static_cast<float*>(*master);
  grads_ = static_cast<float*>(*grads);
  m_ = static_cast<float*>(*m);
  v_ = static_cast<float*>(*v);
  begin_ = begin;
  held_ = held;
  restrict_runs();
  sharded_ = true;
  return dev.synchronize();
}

absl::StatusOr<model::OptimizerStepStats> DeviceTrainState::step_shard(std::span<float> grads,
                                                                       double grad_norm) {
  if (!sharded_) return absl::FailedPreconditionError("train state: step_shard before shard()");
  if (std::ssize(grads) != held_) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer: step_shard got ", grads.size(),
                                                   " gradients for a shard of ", held_));
  }
  if (!std::isfinite(grad_norm)) {
    return absl::InvalidArgumentError("optimizer: gradient is not finite; step skipped");
  }
  TrainDevice& dev = *device_;
  if (auto s = dev.upload(grads_, grads.data(), 4 * held_); !s.ok()) return s;
  const model::AdamWConfig& c = options_.adamw;
  model::OptimizerStepStats stats;
  stats.grad_norm = grad_norm;
  const float clip = kernels::dm::clip_factor(grad_norm, c.max_grad_norm);
  stats.clipped = kernels::dm::clip_applies(grad_norm, c.max_grad_norm);
  stats.lr = lr_at(step_);
  const kernels::dm::AdamWCoeffs coeffs =
      kernels::dm::adamw_coeffs(stats.lr, c.beta1, c.beta2, c.eps, c.weight_decay, step_ + 1);
  for (const DecayRun& r : runs_) {
    if (auto s = dev.adamw(master_ + r.offset, m_ + r.offset, v_ + r.offset, grads_ + r.offset,
                           r.count, clip, r.decay, coeffs);
        !s.ok()) {
      return s;
    }
  }
  ++step_;
  stats.step = step_;
  if (auto s = dev.download(grads.data(), grads_, 4 * held_); !s.ok()) return s;
  return stats;
}

absl::StatusOr<model::Model::WorkingStreams> DeviceTrainState::encode_working() const {
  if (!sharded_) return absl::FailedPreconditionError("train state: encode_working before shard()");
  TrainDevice& dev = *device_;
  const int64_t begin = begin_, end = begin_ + held_;
  model::Model::WorkingStreams out;
  for (size_t i = 0; i < layout_.params().size(); ++i) {
    const model::ParamInfo& p = layout_.params()[i];
    const int64_t pb = std::max(begin, p.offset), pe = std::min(end, p.offset + p.numel);
    if (pb >= pe) continue;
    const float* master = master_ + (pb - begin);
    if (const Fp8Weight* w = fp8_weight(static_cast<int64_t>(i))) {
      // The block rows [r0, r1), quantized on their own: no block spans the cut, so the codes and
      // scales equal the whole tensor's.
      const RowRange r = rows_of(p, pb, pe);
      const int64_t rows = r.r1 - r.r0;
      if (auto s = dev.quantize_block128(master, rows, w->cols, policy_.pow2_scales, enc_codes_,
                                         enc_scales_);
          !s.ok()) {
        return s;
      }
      absl::StatusOr<kernels::Fp8Matrix> q =
          dev.download_block128(enc_codes_, enc_scales_, rows, w->cols);
      if (!q.ok()) return q.status();
      out.codes.insert(out.codes.end(), q->data.begin(), q->data.end());
      out.scales.insert(out.scales.end(), q->scale_inv.begin(), q->scale_inv.end());
      continue;
    }
    // bf16 bits, through the export scratch in pieces.
    if (bf16_scratch_count_ < 1) return absl::InternalError("encode_working: no bf16 scratch");
    const int64_t n = pe - pb;
    const size_t at = out.bf16.size();
    out.bf16.resize(at + static_cast<size_t>(n));
    for (int64_t i0 = 0; i0 < n; i0 += bf16_scratch_count_) {
      const int64_t count = std::min(bf16_scratch_count_, n - i0);
      if (auto s = dev.round_bf16(master + i0, count, bf16_scratch_); !s.ok()) return s;
      if (auto s = dev.download(out.bf16.data() + at + i0, bf16_scratch_, 2 * count); !s.ok()) {
        return s;
      }
    }
  }
  return out;
}

absl::Status DeviceTrainState::install_working(const model::Model::WorkingStreams& all) {
  if (!sharded_) {
    return absl::FailedPreconditionError("train state: install_working before shard()");
  }
  int64_t codes = 0, scales = 0, bf16 = 0;
  for (size_t i = 0; i < layout_.params().size(); ++i) {
    const model::ParamInfo& p = layout_.params()[i];
    if (const Fp8Weight* w = fp8_weight(static_cast<int64_t>(i))) {
      codes += p.numel;
      scales +=
          kernels::ceil_div(w->rows, kernels::kBlock) * kernels::ceil_div(w->cols, kernels::kBlock);
    } else {
      bf16 += p.numel;
    }
  }
  if (codes != std::ssize(all.codes) || scales != std::ssize(all.scales) ||
      bf16 != std::ssize(all.bf16)) {
    return absl::InvalidArgumentError(absl::StrCat("install_working: streams of ", all.codes.size(),
                                                   " codes, ", all.scales.size(), " scales and ",
                                                   all.bf16.size(), " bf16 values; the layout has ",
                                                   codes, ", ", scales, " and ", bf16));
  }
  TrainDevice& dev = *device_;
  const uint8_t* c = all.codes.data();
  const float* sc = all.scales.data();
  for (const Fp8Weight& w : fp8_) {
    kernels::Fp8Matrix q;
    q.rows = w.rows;
    q.cols = w.cols;
    q.mode = kernels::ScalingMode::kBlock128x128;
    q.data.assign(c, c + w.rows * w.cols);
    const int64_t ns = q.scale_rows() * q.scale_cols();
    q.scale_inv.assign(sc, sc + ns);
    c += w.rows * w.cols;
    sc += ns;
    if (auto s = dev.upload_block128(q, w.codes, w.scales); !s.ok()) return s;
    if (w.t_codes != nullptr) {
      if (auto s = dev.transpose_block128(w.codes, w.scales, w.rows, w.cols, w.t_codes, w.t_scales);
          !s.ok()) {
        return s;
      }
    }
  }
  working_bf16_ = all.bf16;
  return dev.synchronize();
}

absl::StatusOr<std::vector<float>> DeviceTrainState::download_master() const {
  std::vector<float> out(static_cast<size_t>(held_));
  if (auto s = device_->download(out.data(), master_, 4 * held_); !s.ok()) return s;
  return out;
}

absl::StatusOr<model::AdamW::RangeState> DeviceTrainState::range_state() const {
  model::AdamW::RangeState state;
  state.m.resize(static_cast<size_t>(held_));
  state.v.resize(static_cast<size_t>(held_));
  if (auto s = device_->download(state.m.data(), m_, 4 * held_); !s.ok()) return s;
  if (auto s = device_->download(state.v.data(), v_, 4 * held_); !s.ok()) return s;
  state.step = step_;
  return state;
}

absl::Status DeviceTrainState::set_range_state(model::AdamW::RangeState state) {
  if (std::ssize(state.m) != held_ || std::ssize(state.v) != held_ || state.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: a range state of ", state.m.size(), " exp_avg and ", state.v.size(),
        " exp_avg_sq values at step ", state.step, " for a range of ", held_));
  }
  if (auto s = device_->upload(m_, state.m.data(), 4 * held_); !s.ok()) return s;
  if (auto s = device_->upload(v_, state.v.data(), 4 * held_); !s.ok()) return s;
  step_ = state.step;
  return device_->synchronize();
}

absl::StatusOr<model::WeightSet> DeviceTrainState::export_with_master(
    model::WeightFormat format, int64_t version, std::span<const float> whole_master) const {
  if (std::ssize(whole_master) != num_params()) {
    return absl::InvalidArgumentError(absl::StrCat("export_weights: whole_master holds ",
                                                   whole_master.size(), " values, the model has ",
                                                   num_params()));
  }
  if (format == model::WeightFormat::kFP8) return export_fp8(version);
  const bool f32 = format == model::WeightFormat::kF32;
  model::WeightSet out;
  out.version = version;
  out.config_json = model_config_to_json(config_, /*fp8_block_quantization=*/false);
  for (const model::ParamInfo& p : layout_.params()) {
    const float* w = whole_master.data() + p.offset;
    if (f32) {
      out.tensors.push_back({p.name, DType::kF32, p.shape, f32_bytes(w, p.numel)});
      continue;
    }
    model::NamedTensor t{p.name, DType::kBF16, p.shape, std::vector<uint8_t>(2 * p.numel)};
    for (int64_t i = 0; i < p.numel; ++i) {
      const uint16_t b = kernels::float_to_bf16(w[i]);
      std::memcpy(t.bytes.data() + 2 * i, &b, 2);
    }
    out.tensors.push_back(std::move(t));
  }
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    out.tensors.push_back({kv_scale_name(l, 'k'), DType::kF32, {}, f32_bytes(&kv_scales_.k[l], 1)});
    out.tensors.push_back({kv_scale_name(l, 'v'), DType::kF32, {}, f32_bytes(&kv_scales_.v[l], 1)});
  }
  return out;
}

// ---- KV calibration
// ------------------------------------------------------------------------------

absl::StatusOr<int64_t> DeviceTrainState::begin_kv_records(int64_t n) {
  if (n < 1 || n > options_.kv_record_capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv records: ", n, " records asked, capacity ", options_.kv_record_capacity));
  }
  if (kv_used_ + n > options_.kv_record_capacity) {
    if (auto s = flush_kv_records(); !s.ok()) return s;
  }
  const int64_t first = kv_used_;
  const int64_t per_record = config_.num_hidden_layers * 2;
  if (auto s = device_->fill_zero(kv_records_ + first * per_record, 4 * n * per_record); !s.ok()) {
    return s;
  }
  kv_used_ += n;
  return first;
}

absl::StatusOr<float*> DeviceTrainState::kv_slot(int64_t record, int64_t layer, int64_t k_count,
                                                 int64_t v_count) const {
  if (record < 0 || record >= kv_used_) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv records: record ", record, " was not reserved (", kv_used_, " are)"));
  }
  if (layer < 0 || layer >= config_.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv records: layer ", layer, " out of range [0, ", config_.num_hidden_layers, ")"));
  }
  if (k_count < 0 || v_count < 0) {
    return absl::InvalidArgumentError("kv records: negative element count");
  }
  return kv_records_ + (record * config_.num_hidden_layers + layer) * 2;
}

absl::Status DeviceTrainState::record_kv_amax(int64_t record, int64_t layer, const float* k,
                                              int64_t k_count, const float* v, int64_t v_count) {
  auto slot = kv_slot(record, layer, k_count, v_count);
  if (!slot.ok()) return slot.status();
  if (auto s = device_->amax_into(k, k_count, *slot); !s.ok()) return s;
  return device_->amax_into(v, v_count, *slot + 1);
}

absl::Status DeviceTrainState::record_kv_amax_bf16(int64_t record, int64_t layer, const uint16_t* k,
                                                   int64_t k_count, const uint16_t* v,
                                                   int64_t v_count) {
  auto slot = kv_slot(record, layer, k_count, v_count);
  if (!slot.ok()) return slot.status();
  if (auto s = device_->amax_into_bf16(k, k_count, *slot); !s.ok()) return s;
  return device_->amax_into_bf16(v, v_count, *slot + 1);
}

absl::Status DeviceTrainState::record_kv_amax_rows(int64_t first, int64_t layer, const float* k,
                                                   const float* v, int64_t kv_dim,
                                                   std::span<const int64_t> row0, int64_t rows) {
  for (size_t s = 0; s < row0.size(); ++s) {
    const int64_t r0 = row0[s], r1 = s + 1 < row0.size() ? row0[s + 1] : rows;
    if (r0 < 0 || r1 < r0 || r1 > rows) {
      return absl::InvalidArgumentError(absl::StrCat("kv records: sequence ", s, " rows [", r0,
                                                     ", ", r1, ") outside [0, ", rows, ")"));
    }
    if (auto st = record_kv_amax(first + static_cast<int64_t>(s), layer, k + r0 * kv_dim,
                                 (r1 - r0) * kv_dim, v + r0 * kv_dim, (r1 - r0) * kv_dim);
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceTrainState::flush_kv_records() {
  if (kv_used_ == 0) return absl::OkStatus();
  const int64_t n_layers = config_.num_hidden_layers;
  std::vector<float> host(kv_used_ * n_layers * 2);
  if (auto s = device_->download(host.data(), kv_records_, 4 * static_cast<int64_t>(host.size()));
      !s.ok()) {
    return s;
  }
  for (int64_t r = 0; r < kv_used_; ++r) {
    for (int64_t l = 0; l < n_layers; ++l) {
      calibrator_.record(l, host[(r * n_layers + l) * 2], host[(r * n_layers + l) * 2 + 1]);
    }
  }
  kv_used_ = 0;
  return absl::OkStatus();
}

absl::Status DeviceTrainState::set_kv_scales(const model::KvScales& scales) {
  if (auto s = model::validate_kv_scales(scales, config_.num_hidden_layers); !s.ok()) return s;
  kv_scales_ = scales;
  return absl::OkStatus();
}

// ---- Export ------------------------------------------------------------------------------------

absl::StatusOr<model::WeightSet> DeviceTrainState::export_fp8(int64_t version) const {
  TrainDevice& dev = *device_;
  const int64_t n_layers = config_.num_hidden_layers;
  model::WeightSet out;
  out.version = version;
  out.config_json = model_config_to_json(config_, /*fp8_block_quantization=*/true);
  const std::vector<model::ParamInfo>& params = layout_.params();
  // Sharded: the bf16 tensors come from the last install_working's stream, in layout order.
  const uint16_t* bits = working_bf16_.data();
  for (size_t i = 0; i < params.size(); ++i) {
    const model::ParamInfo& p = params[i];
    if (exports_fp8(p, policy_, n_layers)) {
      const int64_t rows = p.shape[0], cols = p.numel / p.shape[0];
      absl::StatusOr<kernels::Fp8Matrix> q;
      if (const Fp8Weight* w = fp8_weight(static_cast<int64_t>(i))) {
        q = dev.download_block128(w->codes, w->scales, rows, cols);
      } else if (sharded_) {
        return sharded_error("export_fp8 of a linear without an FP8 working copy");
      } else {
        // A linear this policy does not run in FP8 (an fp32 policy): quantized for the payload.
        if (auto s = dev.quantize_block128(master_ + p.offset, rows, cols, policy_.pow2_scales,
                                           fp8_scratch_codes_, fp8_scratch_scales_);
            !s.ok()) {
          return s;
        }
        q = dev.download_block128(fp8_scratch_codes_, fp8_scratch_scales_, rows, cols);
      }
      if (!q.ok()) return q.status();
      out.tensors.push_back({p.name, DType::kF8E4M3, p.shape, std::move(q->data)});
      out.tensors.push_back(
          {p.name + "_scale_inv",
           DType::kF32,
           {q->scale_rows(), q->scale_cols()},
           f32_bytes(q->scale_inv.data(), static_cast<int64_t>(q->scale_inv.size()))});
    } else if (sharded_) {
      if (bits == nullptr || bits + p.numel > working_bf16_.data() + working_bf16_.size()) {
        return absl::FailedPreconditionError(
            "export_fp8: a sharded state exports after install_working only");
      }
      model::NamedTensor t{p.name, DType::kBF16, p.shape, std::vector<uint8_t>(2 * p.numel)};
      std::memcpy(t.bytes.data(), bits, 2 * p.numel);
      bits += p.numel;
      out.tensors.push_back(std::move(t));
    } else {
      if (auto s = dev.round_bf16(master_ + p.offset, p.numel, bf16_scratch_); !s.ok()) return s;
      model::NamedTensor t{p.name, DType::kBF16, p.shape, std::vector<uint8_t>(2 * p.numel)};
      if (auto s = dev.download(t.bytes.data(), bf16_scratch_, 2 * p.numel); !s.ok()) return s;
      out.tensors.push_back(std::move(t));
    }
  }
  for (int64_t l = 0; l < n_layers; ++l) {
    out.tensors.push_back({kv_scale_name(l, 'k'), DType::kF32, {}, f32_bytes(&kv_scales_.k[l], 1)});
    out.tensors.push_back({kv_scale_name(l, 'v'), DType::kF32, {}, f32_bytes(&kv_scales_.v[l], 1)});
  }
  return out;
}

absl::StatusOr<model::WeightSet> DeviceTrainState::export_bf16(int64_t version) const {
  // Sharded, the bf16 working copies hold the output bits when no linear runs in FP8.
  const bool from_stream = sharded_ && fp8_.empty();
  if (sharded_ && !from_stream) return sharded_error("export_bf16");
  if (sharded_ && std::ssize(working_bf16_) != num_params()) {
    return absl::FailedPreconditionError(
        "export_bf16: a sharded state exports after install_working only");
  }
  if (!sharded_ && bf16_scratch_count_ < 1) {
    return absl::InternalError("export_bf16: no export scratch");
  }
  model::WeightSet out;
  out.version = version;
  out.config_json = model_config_to_json(config_, /*fp8_block_quantization=*/false);
  for (const model::ParamInfo& p : layout_.params()) {
    model::NamedTensor t{p.name, DType::kBF16, p.shape, std::vector<uint8_t>(2 * p.numel)};
    if (from_stream) {
      std::memcpy(t.bytes.data(), working_bf16_.data() + p.offset, 2 * p.numel);
      out.tensors.push_back(std::move(t));
      continue;
    }
    // A tensor larger than the scratch (an FP8 linear) goes through it in pieces.
    for (int64_t i0 = 0; i0 < p.numel; i0 += bf16_scratch_count_) {
      const int64_t n = std::min(bf16_scratch_count_, p.numel - i0);
      if (auto s = device_->round_bf16(master_ + p.offset + i0, n, bf16_scratch_); !s.ok()) {
        return s;
      }
      if (auto s = device_->download(t.bytes.data() + 2 * i0, bf16_scratch_, 2 * n); !s.ok()) {
        return s;
      }
    }
    out.tensors.push_back(std::move(t));
  }
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    out.tensors.push_back({kv_scale_name(l, 'k'), DType::kF32, {}, f32_bytes(&kv_scales_.k[l], 1)});
    out.tensors.push_back({kv_scale_name(l, 'v'), DType::kF32, {}, f32_bytes(&kv_scales_.v[l], 1)});
  }
  return out;
}

absl::StatusOr<model::WeightSet> DeviceTrainState::export_f32(int64_t version) const {
  if (sharded_) return sharded_error("export_f32");
  model::WeightSet out;
  out.version = version;
  out.config_json = model_config_to_json(config_, /*fp8_block_quantization=*/false);
  for (const model::ParamInfo& p : layout_.params()) {
    model::NamedTensor t{p.name, DType::kF32, p.shape, std::vector<uint8_t>(4 * p.numel)};
    if (auto s = device_->download(t.bytes.data(), master_ + p.offset, 4 * p.numel); !s.ok()) {
      return s;
    }
    out.tensors.push_back(std::move(t));
  }
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    out.tensors.push_back({kv_scale_name(l, 'k'), DType::kF32, {}, f32_bytes(&kv_scales_.k[l], 1)});
    out.tensors.push_back({kv_scale_name(l, 'v'), DType::kF32, {}, f32_bytes(&kv_scales_.v[l], 1)});
  }
  return out;
}

absl::StatusOr<std::vector<float>> DeviceTrainState::download(const float* device_buffer) const {
  if (sharded_) return sharded_error("download");
  std::vector<float> out(num_params());
  if (auto s = device_->download(out.data(), device_buffer, 4 * num_params()); !s.ok()) return s;
  return out;
}

// ---- Checkpoints -------------------------------------------------------------------------------

absl::Status DeviceTrainState::save_optimizer_state(const std::string& path) const {
  if (sharded_) return sharded_error("save_optimizer_state");
  auto m = download(m_);
  if (!m.ok()) return m.status();
  auto v = download(v_);
  if (!v.ok()) return v.status();
  return model::save_adamw_state(path, *m, *v, step_);
}

absl::Status DeviceTrainState::load_optimizer_state(const std::string& path) {
  auto state = model::load_adamw_state(path, num_params());
  if (!state.ok()) return state.status();
  // Sharded: the shard's range of the whole file.
  if (auto s = device_->upload(m_, state->m.data() + begin_, 4 * held_); !s.ok()) return s;
  if (auto s = device_->upload(v_, state->v.data() + begin_, 4 * held_); !s.ok()) return s;
  step_ = state->step;
  return absl::OkStatus();
}

absl::Status DeviceTrainState::save_checkpoint(const std::string& dir) const {
  auto set = export_f32();
  if (!set.ok()) return set.status();
  return write_training_checkpoint(
      dir, *set, [&](const std::string& path) { return save_optimizer_state(path); });
}

absl::StatusOr<std::unique_ptr<DeviceTrainState>> DeviceTrainState::LoadCheckpoint(
    const std::string& dir, const model::PrecisionPolicy& policy, const TrainStateOptions& options,
    std::unique_ptr<TrainDevice> device) {
  auto model = model::Model::Load(dir, policy);
  if (!model.ok()) return model.status();
  auto state = Create(**model, options, std::move(device));
  if (!state.ok()) return state.status();
  if (auto s = (*state)->load_optimizer_state(dir + "/optimizer.safetensors"); !s.ok()) return s;
  return state;
}

// A build without CUDA has no CUDA train device (engine/cuda/cuda_train_device.cc otherwise).
#if !defined(FP8RL_HAVE_CUDA_TRAIN)
absl::StatusOr<std::unique_ptr<TrainDevice>> make_cuda_train_device(CUstream_st*) {
  return absl::UnimplementedError("the CUDA train device needs a build with CUDA");
}
#endif

}  // namespace fp8rl::engine
