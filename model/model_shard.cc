// ZeRO-2 with the fp32 master per shard (docs/design/sharding.md "ZeRO-2 in the learner"): each
// rank of a sharded trainer group keeps the master of its own block-aligned shard, derives the
// working copies of that shard only, and the group all-gathers them as three byte streams.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/formats.h"
#include "model/model.h"

namespace fp8rl::model {
namespace {

// The rows [r0, r1) of a 2-D tensor [rows, cols] that the flat piece [pb, pe) of it covers (the
// piece starts and ends at row boundaries: the cut points).
struct RowRange {
  int64_t r0 = 0, r1 = 0;
};
RowRange rows_of(const ParamInfo& p, int64_t pb, int64_t pe) {
  const int64_t cols = p.shape.size() == 2 ? p.shape[1] : p.numel;
  return {(pb - p.offset) / cols, (pe - p.offset) / cols};
}

}  // namespace

bool Model::fp8_working(size_t pi) const {
  const ParamInfo& p = layout_.params()[pi];
  return linear_of_[pi] != nullptr &&
         policy_.layer_linear(p.layer, config_.num_hidden_layers) == Precision::kFP8;
}

absl::Status Model::check_bf16_working(std::string_view what) const {
  return model::check_bf16_working(config_, policy_, what);
}

absl::Status check_bf16_working(const ModelConfig& config, const PrecisionPolicy& policy,
                                std::string_view what) {
  bool fp32 = !policy.bf16_activations();
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    fp32 = fp32 || policy.layer_linear(l, config.num_hidden_layers) == Precision::kF32;
  }
  if (!fp32) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      std::string(what),
      ": the policy has fp32 working copies, which read the fp32 master itself (a sharded master "
      "needs fp8 or bf16 linears)"));
}

bool Model::shard_cut_allowed(int64_t at) const { return model::shard_cut_allowed(layout_, at); }

bool shard_cut_allowed(const ParamLayout& layout, int64_t at) {
  if (at == layout.total()) return true;
  for (const ParamInfo& p : layout.params()) {
    if (at < p.offset || at >= p.offset + p.numel) continue;
    if (at == p.offset) return true;
    if (p.shape.size() != 2) return false;
    return (at - p.offset) % (kernels::kBlock * p.shape[1]) == 0;
  }
  return false;
}

absl::StatusOr<Model::WorkingCounts> Model::working_counts(int64_t begin, int64_t end) const {
  if (begin < 0 || begin > end || end > layout_.total() || !shard_cut_allowed(begin) ||
      !shard_cut_allowed(end)) {
    return absl::InvalidArgumentError(
        absl::StrCat("working copies: [", begin, ", ", end, ") is not a range between cut points ",
                     "(tensor starts or 128-row boundaries) of [0, ", layout_.total(), ")"));
  }
  WorkingCounts n;
  const std::vector<ParamInfo>& params = layout_.params();
  for (size_t pi = 0; pi < params.size(); ++pi) {
    const ParamInfo& p = params[pi];
    const int64_t pb = std::max(begin, p.offset), pe = std::min(end, p.offset + p.numel);
    if (pb >= pe) continue;
    if (fp8_working(pi)) {
      const RowRange r = rows_of(p, pb, pe);
      n.codes += pe - pb;
      n.scales += (kernels::ceil_div(r.r1, kernels::kBlock) - r.r0 / kernels::kBlock) *
                  kernels::ceil_div(p.shape[1], kernels::kBlock);
    } else {
      n.bf16 += pe - pb;
    }
  }
  return n;
}

absl::StatusOr<Model::WorkingStreams> Model::encode_working(int64_t begin, int64_t end) const {
  if (auto s = check_has_weights("encode_working"); !s.ok()) return s;
  if (storage_ != Storage::kTraining) {
    return absl::FailedPreconditionError("encode_working: an inference-only model has no master");
  }
  if (auto s = check_bf16_working("encode_working"); !s.ok()) return s;
  absl::StatusOr<WorkingCounts> counts = working_counts(begin, end);
  if (!counts.ok()) return counts.status();
  const int64_t held_end = master_begin_ + static_cast<int64_t>(params_.size());
  if (begin < master_begin_ || end > held_end) {
    return absl::InvalidArgumentError(absl::StrCat("encode_working: [", begin, ", ", end,
                                                   ") is outside the master this model holds [",
                                                   master_begin_, ", ", held_end, ")"));
  }
  WorkingStreams out;
  out.codes.reserve(counts->codes);
  out.scales.reserve(counts->scales);
  out.bf16.reserve(counts->bf16);
  const std::vector<ParamInfo>& params = layout_.params();
  for (size_t pi = 0; pi < params.size(); ++pi) {
    const ParamInfo& p = params[pi];
    const int64_t pb = std::max(begin, p.offset), pe = std::min(end, p.offset + p.numel);
    if (pb >= pe) continue;
    const float* master = params_.data() + (pb - master_begin_);
    if (!fp8_working(pi)) {
      for (int64_t i = 0; i < pe - pb; ++i) out.bf16.push_back(kernels::float_to_bf16(master[i]));
      continue;
    }
    // FP8: the block rows [r0, r1) (r0 is a multiple of 128), quantized on their own, give the
    // same codes and scales as the whole tensor's quantization: no block spans the cut.
    const RowRange r = rows_of(p, pb, pe);
    const int64_t cols = p.shape[1];
    const kernels::Fp8Matrix q =
        kernels::quantize(master, r.r1 - r.r0, cols, kernels::ScalingMode::kBlock128x128,
                          {.pow2_scales = policy_.pow2_scales});
    out.codes.insert(out.codes.end(), q.data.begin(), q.data.end());
    out.scales.insert(out.scales.end(), q.scale_inv.begin(), q.scale_inv.end());
  }
  return out;
}

absl::Status Model::install_working(const WorkingStreams& all) {
  if (auto s = check_has_weights("install_working"); !s.ok()) return s;
  if (storage_ != Storage::kTraining) {
    return absl::FailedPreconditionError("install_working: an inference-only model has no master");
  }
  if (auto s = check_bf16_working("install_working"); !s.ok()) return s;
  absl::StatusOr<WorkingCounts> want = working_counts(0, layout_.total());
  if (!want.ok()) return want.status();
  if (want->codes != std::ssize(all.codes) || want->scales != std::ssize(all.scales) ||
      want->bf16 != std::ssize(all.bf16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "install_working: streams of ", all.codes.size(), " codes, ", all.scales.size(),
        " scales and ", all.bf16.size(), " bf16 values; the layout has ", want->codes, ", ",
        want->scales, " and ", want->bf16));
  }
  const uint8_t* codes = all.codes.data();
  const float* scales = all.scales.data();
  const uint16_t* bits = all.bf16.data();
  small_.clear();
  small_index_.clear();
  for (size_t pi = 0; pi < layout_.params().size(); ++pi) {
    install_working_tensor(pi, &codes, &scales, &bits, nullptr);
  }
  return absl::OkStatus();
}

void Model::install_working_tensor(size_t pi, const uint8_t** codes, const float** scales,
                                   const uint16_t** bits, std::vector<float>* small) {
  const ParamInfo& p = layout_.params()[pi];
  // The master a working copy points at (null where this rank does not hold it).
  const float* master = master_sharded_ ? nullptr : params_.data() + p.offset;
  auto bf16_weight = [&](Precision prec, bool pow2, LinearWeight* w) {
    w->out = p.shape[0];
    w->in = p.shape[1];
    w->precision = prec;
    w->pow2_scales = pow2;
    w->master = master;
    w->q = {};
    w->qt = {};
    w->bf16.resize(p.numel);
    for (int64_t i = 0; i < p.numel; ++i) w->bf16[i] = kernels::bf16_to_float((*bits)[i]);
    w->exact.assign(w->bf16.begin(), w->bf16.end());
  };
  if (fp8_working(pi)) {
    kernels::Fp8Matrix q;
    q.rows = p.shape[0];
    q.cols = p.shape[1];
    q.mode = kernels::ScalingMode::kBlock128x128;
    q.data.assign(*codes, *codes + p.numel);
    const int64_t ns = q.scale_rows() * q.scale_cols();
    q.scale_inv.assign(*scales, *scales + ns);
    *codes += p.numel;
    *scales += ns;
    prepare_linear_fp8(master, std::move(q), policy_.pow2_scales, linear_of_[pi]);
    return;
  }
  if (LinearWeight* w = linear_of_[pi]) {
    bf16_weight(policy_.layer_linear(p.layer, config_.num_hidden_layers), policy_.pow2_scales, w);
  } else if (RouterWeight* r = router_of_[pi]) {
    r->out = p.shape[0];
    r->in = p.shape[1];
    r->w.resize(p.numel);
    for (int64_t i = 0; i < p.numel; ++i) r->w[i] = kernels::bf16_to_float((*bits)[i]);
  } else if (p.kind == ParamKind::kEmbedding) {
    bf16_weight(Precision::kBF16, false, &embed_w_);
  } else if (p.kind == ParamKind::kLmHead) {
    bf16_weight(Precision::kBF16, false, &head_w_);
  } else if (small == nullptr) {  // norms and biases, in layout order as refresh() lists them
    small_index_.emplace_back(p.offset, static_cast<int64_t>(small_.size()));
    for (int64_t i = 0; i < p.numel; ++i) small_.push_back(kernels::bf16_to_float((*bits)[i]));
  } else {  // in place, where install_working put them
    for (const auto& [param, at] : small_index_) {
      if (param != p.offset) continue;
      for (int64_t i = 0; i < p.numel; ++i) (*small)[at + i] = kernels::bf16_to_float((*bits)[i]);
    }
  }
  *bits += p.numel;
}

absl::Status Model::check_whole_tensors(int64_t begin, int64_t end, std::string_view what) const {
  bool ok = begin >= 0 && begin <= end && end <= layout_.total();
  for (const ParamInfo& p : layout_.params()) {
    const int64_t pe = p.offset + p.numel;
    if (ok && p.offset < end && pe > begin && (p.offset < begin || pe > end)) ok = false;
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": [", begin, ", ", end,
                                                 ") is not a range of whole tensors of [0, ",
                                                 layout_.total(), ")"));
}

absl::Status Model::install_working_range(const WorkingStreams& streams, int64_t begin,
                                          int64_t end) {
  if (auto s = check_has_weights("install_working_range"); !s.ok()) return s;
  if (storage_ != Storage::kTraining) {
    return absl::FailedPreconditionError(
        "install_working_range: an inference-only model has no master");
  }
  if (auto s = check_bf16_working("install_working_range"); !s.ok()) return s;
  if (auto s = check_whole_tensors(begin, end, "install_working_range"); !s.ok()) return s;
  absl::StatusOr<WorkingCounts> want = working_counts(begin, end);
  if (!want.ok()) return want.status();
  if (want->codes != std::ssize(streams.codes) || want->scales != std::ssize(streams.scales) ||
      want->bf16 != std::ssize(streams.bf16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "install_working_range: streams of ", streams.codes.size(), " codes, ",
        streams.scales.size(), " scales and ", streams.bf16.size(), " bf16 values; [", begin, ", ",
        end, ") has ", want->codes, ", ", want->scales, " and ", want->bf16));
  }
  const uint8_t* codes = streams.codes.data();
  const float* scales = streams.scales.data();
  const uint16_t* bits = streams.bf16.data();
  const std::vector<ParamInfo>& params = layout_.params();
  for (size_t pi = 0; pi < params.size(); ++pi) {
    if (params[pi].offset < begin || params[pi].offset >= end) continue;
    install_working_tensor(pi, &codes, &scales, &bits, &small_);
  }
  return absl::OkStatus();
}

absl::Status Model::drop_working_range(int64_t begin, int64_t end) {
  if (auto s = check_whole_tensors(begin, end, "drop_working_range"); !s.ok()) return s;
  auto drop = [](LinearWeight* w) {
    w->q = {};
    w->qt = {};
    std::vector<float>().swap(w->bf16);
    std::vector<double>().swap(w->exact);
  };
  const std::vector<ParamInfo>& params = layout_.params();
  for (size_t pi = 0; pi < params.size(); ++pi) {
    const ParamInfo& p = params[pi];
    if (p.offset < begin || p.offset >= end) continue;
    if (LinearWeight* w = linear_of_[pi]) {
      drop(w);
    } else if (RouterWeight* r = router_of_[pi]) {
      std::vector<double>().swap(r->w);
    } else if (p.kind == ParamKind::kEmbedding) {
      drop(&embed_w_);
    } else if (p.kind == ParamKind::kLmHead) {
      drop(&head_w_);
    }
  }
  return absl::OkStatus();
}

absl::Status Model::shard_master(int64_t begin, int64_t end) {
  if (auto s = check_has_weights("shard_master"); !s.ok()) return s;
  if (storage_ != Storage::kTraining) {
    return absl::FailedPreconditionError("shard_master: an inference-only model has no master");
  }
  if (master_sharded_) return absl::FailedPreconditionError("shard_master: already sharded");
  if (auto s = check_bf16_working("shard_master"); !s.ok()) return s;
  if (auto n = working_counts(begin, end); !n.ok()) return n.status();
  std::vector<float> mine(params_.begin() + begin, params_.begin() + end);
  params_.swap(mine);  // the whole master is freed when `mine` goes
  master_begin_ = begin;
  master_sharded_ = true;
  // No working copy may point into the freed storage (none reads it under this policy).
  for (LinearWeight* w : linear_of_) {
    if (w != nullptr) w->master = nullptr;
  }
  embed_w_.master = nullptr;
  head_w_.master = nullptr;
  return absl::OkStatus();
}

float Model::working_bf16_value(size_t pi, int64_t i) const {
  const ParamInfo& p = layout_.params()[pi];
  if (const LinearWeight* w = linear_of_[pi]) return w->bf16[i];
  if (const RouterWeight* r = router_of_[pi]) return static_cast<float>(r->w[i]);
  if (p.kind == ParamKind::kEmbedding) return embed_w_.bf16[i];
  if (p.kind == ParamKind::kLmHead) return head_w_.bf16[i];
  return small_param(p.offset)[i];
}

bool Model::export_needs_master(WeightFormat format) const {
  if (format == WeightFormat::kF32) return true;
  const std::vector<ParamInfo>& params = layout_.params();
  for (size_t pi = 0; pi < params.size(); ++pi) {
    const ParamInfo& p = params[pi];
    const bool fp8_out =
        format == WeightFormat::kFP8 && p.kind == ParamKind::kLinear &&
        policy_.layer_linear(p.layer, config_.num_hidden_layers) != Precision::kBF16;
    // An FP8 output needs FP8 working codes; a bf16 output a bf16 working copy.
    if (fp8_out != fp8_working(pi)) return true;
  }
  return false;
}

}  // namespace fp8rl::model
