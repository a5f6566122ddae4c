// Model construction, parameter preparation and checkpoint / weight-set I/O.
#include "model/model.h"

#include <cmath>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fs.h"
#include "kernels/formats.h"
#include "model/ops.h"
#include "model/rng.h"

namespace fp8rl::model {
namespace {

std::string k_scale_name(int64_t l) {
  return absl::StrCat("model.layers.", l, ".self_attn.k_scale");
}
std::string v_scale_name(int64_t l) {
  return absl::StrCat("model.layers.", l, ".self_attn.v_scale");
}

std::vector<uint8_t> f32_bytes(const float* x, int64_t n) {
  std::vector<uint8_t> out(n * 4);
  std::memcpy(out.data(), x, n * 4);
  return out;
}

std::vector<uint8_t> bf16_bytes(const float* x, int64_t n) {
  std::vector<uint8_t> out(n * 2);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = kernels::float_to_bf16(x[i]);
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
  return out;
}

}  // namespace

absl::StatusOr<WeightFormat> parse_weight_format(std::string_view name) {
  if (name == "f32" || name == "fp32") return WeightFormat::kF32;
  if (name == "bf16") return WeightFormat::kBF16;
  if (name == "fp8") return WeightFormat::kFP8;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown weight format '", std::string(name), "' (expected f32, bf16 or fp8)"));
}

// Where tensors come from (a checkpoint folder or an in-memory weight set).
struct Model::Source {
  std::string what;
  std::function<bool(const std::string&)> has;
  std::function<absl::StatusOr<TensorInfo>(const std::string&)> info;
  std::function<absl::StatusOr<std::vector<uint8_t>>(const std::string&)> raw;
  std::function<absl::StatusOr<std::vector<float>>(const std::string&)> read_f32;
};

Model::Model(const ModelConfig& config, const PrecisionPolicy& policy, Storage storage)
    : config_(config), policy_(policy), layout_(config), storage_(storage) {
  kv_scales_.k.assign(config.num_hidden_layers, 1.0f);
  kv_scales_.v.assign(config.num_hidden_layers, 1.0f);
  if (storage == Storage::kTraining) params_.assign(layout_.total(), 0.0f);
  linears_.resize(config.num_hidden_layers);
  moe_.resize(config.num_hidden_layers);
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    if (!config.sparse_layer(l)) continue;
    moe_[l].experts.resize(config.moe.num_experts);
    moe_[l].has_shared = config.moe.shared_expert_intermediate_size > 0;
  }
  // Which working copy each parameter feeds.
  const std::vector<ParamInfo>& params = layout_.params();
  linear_of_.assign(params.size(), nullptr);
  router_of_.assign(params.size(), nullptr);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    if (p.layer < 0) continue;
    const LayerOffsets& lo = layout_.layer(p.layer);
    MoeLayerWeights& mw = moe_[p.layer];
    if (p.kind == ParamKind::kRouter) {
      router_of_[i] = p.offset == lo.router ? &mw.router : &mw.shared_gate;
      continue;
    }
    if (p.kind != ParamKind::kLinear) continue;
    const int64_t offs[7] = {lo.q, lo.k, lo.v, lo.o, lo.gate, lo.up, lo.down};
    for (int j = 0; j < 7; ++j) {
      if (offs[j] == p.offset) linear_of_[i] = &linears_[p.layer][j];
    }
    for (size_t e = 0; e < lo.expert_gate.size(); ++e) {
      if (lo.expert_gate[e] == p.offset) linear_of_[i] = &mw.experts[e][0];
      if (lo.expert_up[e] == p.offset) linear_of_[i] = &mw.experts[e][1];
      if (lo.expert_down[e] == p.offset) linear_of_[i] = &mw.experts[e][2];
    }
    if (lo.shared_gate == p.offset) linear_of_[i] = &mw.shared[0];
    if (lo.shared_up == p.offset) linear_of_[i] = &mw.shared[1];
    if (lo.shared_down == p.offset) linear_of_[i] = &mw.shared[2];
  }
  if (storage == Storage::kNone) return;  // a description: no weights, no RoPE tables
  const int64_t half = config.head_dim / 2, max_pos = config.max_position_embeddings;
  rope_cos_.resize(half * max_pos);
  rope_sin_.resize(half * max_pos);
  ops::rope_fill(ops::rope_inv_freq(config.rope_theta, config.head_dim, config.rope_scaling),
                 max_pos, rope_cos_.data(), rope_sin_.data());
}

absl::StatusOr<std::unique_ptr<Model>> Model::ForDescription(const ModelConfig& config,
                                                             const PrecisionPolicy& policy) {
  if (auto s = validate_model_config(config); !s.ok()) return s;
  return std::unique_ptr<Model>(new Model(config, policy, Storage::kNone));
}

absl::Status Model::check_has_weights(std::string_view what) const {
  if (storage_ != Storage::kNone) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      std::string(what), ": this model is a description (its weights live on a device)"));
}

void Model::refresh() {
  // No master to derive from: install() or install_working() writes the working copies.
  if (storage_ != Storage::kTraining || master_sharded_) return;
  const int64_t n_layers = config_.num_hidden_layers;
  const std::vector<ParamInfo>& params = layout_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    if (LinearWeight* w = linear_of_[i]) {
      const Precision prec = policy_.layer_linear(p.layer, n_layers);
      // fp32 linears feeding a rounding KV cache: the whole residual stream must be independent
      // of the batch shape, or K/V roundings flip between prefill and decode.
      const bool exact = policy_.kv_cache != KvCacheDtype::kF32;
      prepare_linear(params_.data() + p.offset, p.shape[0], p.shape[1], prec, policy_.pow2_scales,
                     w, exact);
    } else if (RouterWeight* r = router_of_[i]) {
      // Routers: bf16 values when activations are bf16 (moe.h RouterWeight), never FP8.
      r->out = p.shape[0];
      r->in = p.shape[1];
      r->w.resize(p.numel);
      const float* master = params_.data() + p.offset;
      for (int64_t j = 0; j < p.numel; ++j) {
        r->w[j] = policy_.bf16_activations() ? kernels::round_bf16(master[j]) : master[j];
      }
    }
  }
  // Embedding and lm_head stay bf16 (or fp32) in every mode.
  const Precision dense = policy_.bf16_activations() ? Precision::kBF16 : Precision::kF32;
  prepare_linear(params_.data() + layout_.embed(), config_.vocab_size, config_.hidden_size, dense,
                 false, &embed_w_);
  if (!config_.tie_word_embeddings) {
    prepare_linear(params_.data() + layout_.lm_head(), config_.vocab_size, config_.hidden_size,
                   dense, false, &head_w_);
  }
  // Norm weights and biases: bf16 tensors on a bf16 GPU path.
  small_.clear();
  small_index_.clear();
  for (const ParamInfo& p : layout_.params()) {
    if (p.kind != ParamKind::kNorm && p.kind != ParamKind::kBias) continue;
    small_index_.emplace_back(p.offset, static_cast<int64_t>(small_.size()));
    small_.insert(small_.end(), params_.begin() + p.offset, params_.begin() + p.offset + p.numel);
  }
  if (policy_.bf16_activations()) {
    ops::round_bf16_inplace(small_.data(), static_cast<int64_t>(small_.size()));
  }
}

const float* Model::small_param(int64_t offset) const {
  for (const auto& [param, at] : small_index_) {
    if (param == offset) return small_.data() + at;
  }
  return params_.data() + offset;  // not reached for norms and biases
}

const LinearWeight& Model::head() const { return config_.tie_word_embeddings ? embed_w_ : head_w_; }

absl::StatusOr<std::unique_ptr<Model>> Model::Init(const ModelConfig& config,
                                                   const PrecisionPolicy& policy, uint64_t seed,
                                                   float init_std) {
  if (auto s = validate_model_config(config); !s.ok()) return s;
  if (!(init_std > 0) || !std::isfinite(init_std)) {
    return absl::InvalidArgumentError("init_std: must be a positive number");
  }
  std::unique_ptr<Model> m(new Model(config, policy));
  Rng rng(seed);
  for (const ParamInfo& p : m->layout_.params()) {
    float* w = m->params_.data() + p.offset;
    switch (p.kind) {
      case ParamKind::kNorm:
        std::fill(w, w + p.numel, 1.0f);
        break;
      case ParamKind::kBias:
        std::fill(w, w + p.numel, 0.0f);
        break;
      default:
        for (int64_t i = 0; i < p.numel; ++i) w[i] = static_cast<float>(rng.normal() * init_std);
    }
  }
  m->refresh();
  return m;
}

absl::Status Model::set_kv_scales(const KvScales& scales) {
  if (auto s = validate_kv_scales(scales, config_.num_hidden_layers); !s.ok()) return s;
  kv_scales_ = scales;
  return absl::OkStatus();
}

absl::Status Model::load_from(const Source& src) {
  const int64_t n_layers = config_.num_hidden_layers;
  std::vector<std::pair<size_t, kernels::Fp8Matrix>> pinned;  // (parameter index, codes)
  for (size_t pi = 0; pi < layout_.params().size(); ++pi) {
    const ParamInfo& p = layout_.params()[pi];
    if (!src.has(p.name)) {
      return absl::NotFoundError(absl::StrCat(src.what, ": missing tensor '", p.name, "'"));
    }
    auto info = src.info(p.name);
    if (!info.ok()) return info.status();
    if (info->shape != p.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          src.what, ": tensor '", p.name, "' has shape [", absl::StrJoin(info->shape, ","),
          "], expected [", absl::StrJoin(p.shape, ","), "]"));
    }
    float* dst = params_.data() + p.offset;
    if (info->dtype == DType::kF8E4M3) {
      if (p.kind != ParamKind::kLinear) {
        return absl::InvalidArgumentError(
            absl::StrCat(src.what, ": '", p.name, "' is F8_E4M3 but is not a linear weight"));
      }
      const std::string sname = p.name + "_scale_inv";
      if (!src.has(sname)) {
        return absl::NotFoundError(absl::StrCat(src.what, ": missing tensor '", sname, "'"));
      }
      auto sinfo = src.info(sname);
      if (!sinfo.ok()) return sinfo.status();
      const std::vector<int64_t> want = {kernels::ceil_div(p.shape[0], kernels::kBlock),
                                         kernels::ceil_div(p.shape[1], kernels::kBlock)};
      if (sinfo->shape != want || sinfo->dtype != DType::kF32) {
        return absl::InvalidArgumentError(
            absl::StrCat(src.what, ": '", sname, "' must be F32 [", want[0], ",", want[1], "]"));
      }
      kernels::Fp8Matrix q;
      q.rows = p.shape[0];
      q.cols = p.shape[1];
      q.mode = kernels::ScalingMode::kBlock128x128;
      auto codes = src.raw(p.name);
      if (!codes.ok()) return codes.status();
      auto scales = src.read_f32(sname);
      if (!scales.ok()) return scales.status();
      for (float s : *scales) {
        if (!(s > 0) || !std::isfinite(s)) {
          return absl::InvalidArgumentError(
              absl::StrCat(src.what, ": '", sname, "' holds a non-positive or non-finite scale"));
        }
      }
      q.data = std::move(*codes);
      q.scale_inv = std::move(*scales);
      kernels::dequantize(q, dst);
      const int64_t l = p.layer;
      if (policy_.layer_linear(l, n_layers) == Precision::kFP8 && linear_of_[pi] != nullptr) {
        // Use the checkpoint's codes and scales as they are.
        pinned.emplace_back(pi, std::move(q));
      }
    } else {
      auto values = src.read_f32(p.name);
      if (!values.ok()) return values.status();
      std::memcpy(dst, values->data(), p.numel * sizeof(float));
    }
    for (int64_t i = 0; i < p.numel; ++i) {
      if (!std::isfinite(dst[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat(src.what, ": tensor '", p.name, "' holds a non-finite value"));
      }
    }
  }
  KvScales scales = kv_scales_;
  for (int64_t l = 0; l < n_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const std::string name = kv == 0 ? k_scale_name(l) : v_scale_name(l);
      if (!src.has(name)) continue;
      auto v = src.read_f32(name);
      if (!v.ok()) return v.status();
      if (v->size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(src.what, ": '", name, "' must be a scalar"));
      }
      (kv == 0 ? scales.k : scales.v)[l] = (*v)[0];
    }
  }
  if (auto s = set_kv_scales(scales); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(src.what, ": ", s.message()));
  }
  refresh();
  for (auto& [index, q] : pinned) {
    LinearWeight* w = linear_of_[index];
    prepare_linear_fp8(w->master, std::move(q), policy_.pow2_scales, w);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   const PrecisionPolicy& policy) {
  auto ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  auto config = parse_model_config(ckpt->config_json());
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(dir, ": ", config.status().message()));
  }
  std::unique_ptr<Model> m(new Model(*config, policy));
  const Checkpoint& c = *ckpt;
  Source src{dir, [&](const std::string& n) { return c.has(n); },
             [&](const std::string& n) { return c.info(n); },
             [&](const std::string& n) { return c.raw(n); },
             [&](const std::string& n) { return c.read_f32(n); }};
  if (auto s = m->load_from(src); !s.ok()) return s;
  return m;
}

absl::StatusOr<std::unique_ptr<Model>> Model::FromWeightSet(const WeightSet& set,
                                                            const PrecisionPolicy& policy) {
  if (auto s = validate_weight_set(set); !s.ok()) return s;
  absl::StatusOr<WeightView> view = view_of(set);
  if (!view.ok()) return view.status();
  return FromWeightView(*view, policy);
}

absl::StatusOr<std::unique_ptr<Model>> Model::FromWeightView(const WeightView& view,
                                                             const PrecisionPolicy& policy) {
  auto config = parse_model_config(view.config_json);
  if (!config.ok()) return config.status();
  std::unique_ptr<Model> m(new Model(*config, policy));
  const std::string what = absl::StrCat("weight set v", view.version);
  auto lookup = [&](const std::string& n) -> absl::StatusOr<const TensorView*> {
    const TensorView* t = view.find(n);
    if (!t) return absl::NotFoundError(absl::StrCat(what, ": missing tensor '", n, "'"));
    return t;
  };
  Source src{what, [&](const std::string& n) { return view.find(n) != nullptr; },
             [&](const std::string& n) -> absl::StatusOr<TensorInfo> {
               auto t = lookup(n);
               if (!t.ok()) return t.status();
               TensorInfo info;
               info.name = n;
               info.dtype = (*t)->dtype;
               info.shape = (*t)->shape;
               return info;
             },
             [&](const std::string& n) -> absl::StatusOr<std::vector<uint8_t>> {
               auto t = lookup(n);
               if (!t.ok()) return t.status();
               return std::vector<uint8_t>((*t)->bytes.begin(), (*t)->bytes.end());
             },
             [&](const std::string& n) -> absl::StatusOr<std::vector<float>> {
               auto t = lookup(n);
               if (!t.ok()) return t.status();
               return tensor_to_f32(**t);
             }};
  if (auto s = m->load_from(src); !s.ok()) return s;
  return m;
}

absl::StatusOr<WeightSet> Model::export_weights(WeightFormat format, int64_t version) const {
  if (master_sharded_ && export_needs_master(format)) {
    return absl::FailedPreconditionError(
        "export_weights: the fp32 master is sharded (trainer.shard grads_optimizer) and this "
        "format needs all of it; gather it and pass it (export_weights with whole_master)");
  }
  return export_weights(
      format, version,
      master_sharded_ ? std::span<const float>() : std::span<const float>(params_));
}

absl::StatusOr<WeightSet> Model::export_weights(WeightFormat format, int64_t version,
                                                std::span<const float> whole_master) const {
  if (auto s = check_has_weights("export_weights"); !s.ok()) return s;
  if (storage_ != Storage::kTraining) {
    return absl::FailedPreconditionError(
        "export_weights: an inference-only model holds no fp32 master to export");
  }
  const bool have_master = !whole_master.empty();
  if (have_master && std::ssize(whole_master) != layout_.total()) {
    return absl::InvalidArgumentError(absl::StrCat("export_weights: whole_master holds ",
                                                   whole_master.size(), " values, the model has ",
                                                   layout_.total()));
  }
  if (!have_master && export_needs_master(format)) {
    return absl::FailedPreconditionError("export_weights: this format needs the fp32 master");
  }
  WeightSet out;
  out.version = version;
  out.config_json = model_config_to_json(config_, format == WeightFormat::kFP8);
  const int64_t n_layers = config_.num_hidden_layers;
  for (size_t pi = 0; pi < layout_.params().size(); ++pi) {
    const ParamInfo& p = layout_.params()[pi];
    const float* w = have_master ? whole_master.data() + p.offset : nullptr;
    const bool fp8 = format == WeightFormat::kFP8 && p.kind == ParamKind::kLinear &&
                     policy_.layer_linear(p.layer, n_layers) != Precision::kBF16;
    if (fp8) {
      // The weight exactly as the FP8 layers use it: the prepared (or pinned) codes and scales
      // when this model runs the layer in FP8, a fresh 128x128-block quantization otherwise.
      const LinearWeight* lw = linear_of_[pi];
      const kernels::Fp8Matrix* q =
          lw != nullptr && lw->precision == Precision::kFP8 ? &lw->q : nullptr;
      kernels::Fp8Matrix fresh;
      if (!q) {
        fresh = kernels::quantize(w, p.shape[0], p.shape[1], kernels::ScalingMode::kBlock128x128,
                                  {.pow2_scales = policy_.pow2_scales});
        q = &fresh;
      }
      out.tensors.push_back({p.name, DType::kF8E4M3, p.shape, q->data});
      out.tensors.push_back(
          {p.name + "_scale_inv",
           DType::kF32,
           {q->scale_rows(), q->scale_cols()},
           f32_bytes(q->scale_inv.data(), static_cast<int64_t>(q->scale_inv.size()))});
    } else if (format == WeightFormat::kF32) {
      out.tensors.push_back({p.name, DType::kF32, p.shape, f32_bytes(w, p.numel)});
    } else if (w != nullptr) {
      out.tensors.push_back({p.name, DType::kBF16, p.shape, bf16_bytes(w, p.numel)});
    } else {
      // No master here: the bf16 working copy holds the bf16 rounding of it, the same bits.
      std::vector<float> values(p.numel);
      for (int64_t i = 0; i < p.numel; ++i) values[i] = working_bf16_value(pi, i);
      out.tensors.push_back({p.name, DType::kBF16, p.shape, bf16_bytes(values.data(), p.numel)});
    }
  }
  for (int64_t l = 0; l < n_layers; ++l) {
    out.tensors.push_back({k_scale_name(l), DType::kF32, {}, f32_bytes(&kv_scales_.k[l], 1)});
    out.tensors.push_back({v_scale_name(l), DType::kF32, {}, f32_bytes(&kv_scales_.v[l], 1)});
  }
  return out;
}

absl::Status Model::save(const std::string& dir, WeightFormat format) const {
  auto set = export_weights(format);
  if (!set.ok()) return set.status();
  SafetensorsWriter writer;
  if (auto s = add_to_writer(*set, &writer); !s.ok()) return s;
  writer.set_metadata("format", "pt");
  return write_checkpoint(dir, set->config_json, writer);
}

int64_t Model::routing_width() const {
  return config_.num_sparse_layers() * config_.moe.num_experts_per_tok;
}

MoeOptions Model::moe_options() const {
  return {.top_k = config_.moe.num_experts_per_tok,
          .norm_topk_prob = config_.moe.norm_topk_prob,
          .bf16 = policy_.bf16_activations()};
}

absl::Status check_routing(const ModelConfig& config, const std::vector<int64_t>& lengths,
                           const TokenRouting& routing) {
  if (routing.size() != lengths.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("routing: ", routing.size(), " sequences, the batch has ", lengths.size()));
  }
  const int64_t k = config.moe.num_experts_per_tok, width = config.num_sparse_layers() * k,
                n_exp = config.moe.num_experts;
  for (size_t s = 0; s < lengths.size(); ++s) {
    const std::vector<int32_t>& r = routing[s];
    if (r.empty()) continue;
    if (width == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("routing[", s, "]: the model has no mixture-of-experts layers"));
    }
    const int64_t n = static_cast<int64_t>(r.size());
    if (n % width != 0 || n / width > lengths[s]) {
      return absl::InvalidArgumentError(
          absl::StrCat("routing[", s, "]: ", n, " ids is not a whole number of tokens of ", width,
                       " (sparse layers x top_k) for at most ", lengths[s], " tokens"));
    }
    for (int64_t i = 0; i < n; i += k) {
      for (int64_t a = 0; a < k; ++a) {
        const int32_t e = r[i + a];
        bool dup = false;
        for (int64_t b = 0; b < a; ++b) dup |= r[i + b] == e;
        if (e < 0 || e >= n_exp || dup) {
          return absl::InvalidArgumentError(
              absl::StrCat("routing[", s, "]: token ", i / width, ": expert id ", e,
                           dup ? " repeated" : absl::StrCat(" out of range [0, ", n_exp, ")")));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Model::check_routing(const TokenBatch& batch, const TokenRouting& routing) const {
  std::vector<int64_t> lengths(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) lengths[s] = static_cast<int64_t>(batch[s].size());
  return model::check_routing(config_, lengths, routing);
}

absl::Status Model::check_tokens(const std::vector<int32_t>& tokens, int64_t extra) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " at index ", i,
                                                     " is out of range [0, ", config_.vocab_size,
                                                     ")"));
    }
  }
  const int64_t n = static_cast<int64_t>(tokens.size()) + extra;
  if (n > config_.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("sequence of ", n,
                                                   " tokens exceeds max_position_embeddings (",
                                                   config_.max_position_embeddings, ")"));
  }
  return absl::OkStatus();
}

}  // namespace fp8rl::model
