// Inference-only models: construction and in-place install of a weight version (model.h,
// Model::ForInference / Model::install; docs/design/weight-sync.md "Installing a weight version in
// place"). Only storage is written here; the forward reads it exactly as it reads a model built by
// Model::FromWeightView, which is what keeps generation bit-identical between the two.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/formats.h"
#include "model/model.h"

namespace fp8rl::model {
namespace {

constexpr int64_t kBlock = 16384;  // values converted per block (bounds the scratch)
// Largest dimension of a linear weight accepted from a version; keeps every count below
// (rows * cols, the block scale grid) far from int64 overflow.
constexpr int64_t kMaxDim = int64_t{1} << 31;

bool is_e4m3_nan(uint8_t code) { return (code & 0x7F) == 0x7F; }

// Calls fn(0, n). Kept serial: splitting these loops over the shared pool (common/parallel.h)
// measured no faster on the 2-core VM under load (docs/perf.md "Weight sync", 2026-12-03) and
// would queue behind (and delay) the serving slot's GEMMs, which use the same pool.
template <typename Fn>
absl::Status checked_range(int64_t n, const Fn& fn) {
  return fn(int64_t{0}, n);
}

absl::Status non_finite(const std::string& what, const TensorView& t) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": tensor '", t.name, "' holds a non-finite value"));
}

// Calls store(i, r) for every element of the BF16 tensor `t` with its value r rounded to bf16
// (what for_each_block + round_bf16 give, without the fp32 scratch).
template <typename Store>
absl::Status for_each_bf16(const TensorView& t, const std::string& what, const Store& store) {
  const int64_t numel = static_cast<int64_t>(t.bytes.size()) / 2;
  const uint8_t* p = t.bytes.data();
  return checked_range(numel, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      if ((b & 0x7F80) == 0x7F80) return non_finite(what, t);  // all-ones exponent: inf or NaN
      store(i, kernels::round_bf16(kernels::bf16_to_float(b)));
    }
    return absl::OkStatus();
  });
}

// Calls fn(values, i0, n) for consecutive blocks of `t` as fp32 values (F32, BF16 or F16 read
// directly; F8_E4M3 needs its scales and is handled by the callers).
template <typename Fn>
absl::Status for_each_block(const TensorView& t, const std::string& what, const Fn& fn) {
  const int64_t numel = static_cast<int64_t>(t.bytes.size()) / dtype_size(t.dtype);
  thread_local std::vector<float> block;
  block.resize(kBlock);
  const uint8_t* p = t.bytes.data();
  for (int64_t i0 = 0; i0 < numel; i0 += kBlock) {
    const int64_t n = std::min(kBlock, numel - i0);
    switch (t.dtype) {
      case DType::kF32:
        std::memcpy(block.data(), p + 4 * i0, n * 4);
        break;
      case DType::kBF16:
        for (int64_t i = 0; i < n; ++i) {
          uint16_t b;
          std::memcpy(&b, p + 2 * (i0 + i), 2);
          block[i] = kernels::bf16_to_float(b);
        }
        break;
      default: {
        // F16 (rare: HF checkpoints) through the generic converter, once for the whole tensor.
        auto all = tensor_to_f32(t);
        if (!all.ok()) return all.status();
        for (int64_t j = 0; j < numel; j += kBlock) {
          if (auto s = fn(all->data() + j, j, std::min(kBlock, numel - j)); !s.ok()) return s;
        }
        return absl::OkStatus();
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(block[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": tensor '", t.name, "' holds a non-finite value"));
      }
    }
    if (auto s = fn(block.data(), i0, n); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The F8_E4M3 tensor `t` with its "<name>_scale_inv" as a block matrix, checked.
absl::StatusOr<const TensorView*> fp8_scales(const WeightView& view, const TensorView& t,
                                             const std::string& what) {
  const std::string sname = t.name + "_scale_inv";
  const TensorView* s = view.find(sname);
  if (s == nullptr) {
    return absl::NotFoundError(absl::StrCat(what, ": missing tensor '", sname, "'"));
  }
  if (t.shape.size() != 2 || t.shape[0] < 1 || t.shape[1] < 1 || t.shape[0] > kMaxDim ||
      t.shape[1] > kMaxDim ||
      static_cast<uint64_t>(t.bytes.size()) !=
          static_cast<uint64_t>(t.shape[0]) * static_cast<uint64_t>(t.shape[1])) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": F8_E4M3 tensor '", t.name, "' must be 2-D with dimensions in [1, ",
                     kMaxDim, "] and one byte per element, got [", absl::StrJoin(t.shape, ","),
                     "] in ", t.bytes.size(), " bytes"));
  }
  const int64_t n = t.shape[0], k = t.shape[1];
  // ceil(n / 128) without n + 127 (checked bounds above keep every product in range).
  const std::vector<int64_t> want = {(n - 1) / 128 + 1, (k - 1) / 128 + 1};
  if (s->dtype != DType::kF32 || s->shape != want ||
      static_cast<int64_t>(s->bytes.size()) != 4 * want[0] * want[1]) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", sname, "' must be F32 [", absl::StrJoin(want, ","), "]"));
  }
  const int64_t count = want[0] * want[1];
  for (int64_t i = 0; i < count; ++i) {
    float v;
    std::memcpy(&v, s->bytes.data() + 4 * i, 4);
    // 448 * scale must stay finite, or a code would dequantize to infinity.
    if (!(v > 0) || !std::isfinite(v * kernels::kE4M3Max)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": '", sname, "' holds a non-positive or non-finite scale"));
    }
  }
  return s;
}

// Fills q (reusing its buffers) with the codes of `t` and the scales of `s`, as they are.
absl::Status copy_fp8(const TensorView& t, const TensorView& s, const std::string& what,
                      kernels::Fp8Matrix* q) {
  q->rows = t.shape[0];
  q->cols = t.shape[1];
  q->mode = kernels::ScalingMode::kBlock128x128;
  q->data.resize(t.bytes.size());
  // One pass over the received codes: each piece is copied, then checked while it is in cache.
  const uint8_t* src = t.bytes.data();
  uint8_t* dst = q->data.data();
  if (auto st = checked_range(static_cast<int64_t>(t.bytes.size()),
                              [&](int64_t i0, int64_t i1) {
                                for (int64_t b0 = i0; b0 < i1; b0 += kBlock) {
                                  const int64_t b1 = std::min(i1, b0 + kBlock);
                                  std::memcpy(dst + b0, src + b0, b1 - b0);
                                  bool nan = false;
                                  for (int64_t i = b0; i < b1; ++i) nan |= is_e4m3_nan(dst[i]);
                                  if (nan) return non_finite(what, t);
                                }
                                return absl::OkStatus();
                              });
      !st.ok()) {
    return st;
  }
  q->scale_inv.resize(s.bytes.size() / 4);
  std::memcpy(q->scale_inv.data(), s.bytes.data(), s.bytes.size());
  return absl::OkStatus();
}

// Calls store(i, v) with the dequantized value v of every element of the F8_E4M3 tensor `t`
// (block scales `s`), read straight from the version's bytes: the values kernels::dequantize
// gives, without an Fp8Matrix copy or an fp32 temporary (only for layers the policy does not run
// in FP8).
template <typename Store>
absl::Status for_each_dequantized(const TensorView& t, const TensorView& s, const std::string& what,
                                  const Store& store) {
  const float* table = kernels::e4m3_decode_table();
  const int64_t cols = t.shape[1];
  const int64_t scale_cols = (cols - 1) / 128 + 1;
  const uint8_t* codes = t.bytes.data();
  const uint8_t* scales = s.bytes.data();
  return checked_range(t.shape[0] * cols, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const uint8_t c = codes[i];
      if (is_e4m3_nan(c)) return non_finite(what, t);
      const int64_t r = i / cols, col = i % cols;
      float scale;
      std::memcpy(&scale, scales + 4 * ((r / 128) * scale_cols + col / 128), 4);
      store(i, table[c] * scale);
    }
    return absl::OkStatus();
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::ForInference(const ModelConfig& config,
                                                           const PrecisionPolicy& policy) {
  if (auto s = validate_model_config(config); !s.ok()) return s;
  if (!policy.bf16_activations()) {
    return absl::InvalidArgumentError(
        "policy.linear: an inference-only model runs bf16 or fp8 linears, not fp32");
  }
  std::unique_ptr<Model> m(new Model(config, policy, Storage::kInference));
  for (const ParamInfo& p : m->layout_.params()) {
    if (p.kind != ParamKind::kNorm && p.kind != ParamKind::kBias) continue;
    m->small_index_.emplace_back(p.offset, static_cast<int64_t>(m->small_.size()));
    m->small_.resize(m->small_.size() + p.numel);
  }
  return m;
}

absl::Status Model::install_linear(const WeightView& view, const TensorView& t, int64_t l,
                                   LinearWeight& w, const std::string& what) {
  w.out = t.shape[0];
  w.in = t.shape[1];
  w.precision = policy_.layer_linear(l, config_.num_hidden_layers);
  w.pow2_scales = policy_.pow2_scales;
  w.master = nullptr;
  w.qt = {};
  w.bf16 = {};
  const int64_t numel = w.out * w.in;
  if (w.precision == Precision::kFP8) {
    w.exact = {};
    if (t.dtype == DType::kF8E4M3) {
      auto s = fp8_scales(view, t, what);
      if (!s.ok()) return s.status();
      return copy_fp8(t, **s, what, &w.q);
    }
    // Not FP8 on the wire (a BF16 version served with an fp8 policy): the policy's recipe, as
    // prepare_linear applies it.
    auto values = tensor_to_f32(t);
    if (!values.ok()) return values.status();
    for (float v : *values) {
      if (!std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": tensor '", t.name, "' holds a non-finite value"));
      }
    }
    w.q = kernels::quantize(values->data(), w.out, w.in, kernels::ScalingMode::kBlock128x128,
                            {.pow2_scales = w.pow2_scales});
    return absl::OkStatus();
  }
  // kBF16: only the double-accumulation operand (the forward never reads the bf16 copy).
  w.q = {};
  w.exact.resize(numel);
  if (t.dtype == DType::kF8E4M3) {
    auto s = fp8_scales(view, t, what);
    if (!s.ok()) return s.status();
    return for_each_dequantized(t, **s, what, [&](int64_t i, float v) {
      w.exact[i] = static_cast<double>(kernels::round_bf16(v));
    });
  }
  if (t.dtype == DType::kBF16) {
    return for_each_bf16(t, what, [&](int64_t i, float r) { w.exact[i] = static_cast<double>(r); });
  }
  return for_each_block(t, what, [&](const float* v, int64_t i0, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      w.exact[i0 + i] = static_cast<double>(kernels::round_bf16(v[i]));
    return absl::OkStatus();
  });
}

absl::Status Model::install(const WeightView& view) {
  if (auto s = check_has_weights("install"); !s.ok()) return s;
  if (storage_ != Storage::kInference) {
    return absl::FailedPreconditionError(
        "install: only an inference-only model (Model::ForInference) is written in place");
  }
  const std::string what = absl::StrCat("weight version ", view.version);
  const int64_t n_layers = config_.num_hidden_layers;
  size_t small_at = 0;
  for (size_t pi = 0; pi < layout_.params().size(); ++pi) {
    const ParamInfo& p = layout_.params()[pi];
    const TensorView* t = view.find(p.name);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat(what, ": missing tensor '", p.name, "'"));
    }
    if (t->shape != p.shape) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": tensor '", p.name, "' has shape [",
                                                     absl::StrJoin(t->shape, ","), "], expected [",
                                                     absl::StrJoin(p.shape, ","), "]"));
    }
    if (t->dtype == DType::kF8E4M3 && p.kind != ParamKind::kLinear) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": '", p.name, "' is F8_E4M3 but is not a linear weight"));
    }
    switch (p.kind) {
      case ParamKind::kLinear: {
        if (auto s = install_linear(view, *t, p.layer, *linear_of_[pi], what); !s.ok()) return s;
        break;
      }
      case ParamKind::kRouter: {
        // bf16 values in double (moe.h RouterWeight), as refresh() derives them.
        RouterWeight& r = *router_of_[pi];
        r.out = p.shape[0];
        r.in = p.shape[1];
        r.w.resize(p.numel);
        if (auto s = for_each_block(*t, what,
                                    [&](const float* v, int64_t i0, int64_t n) {
                                      for (int64_t i = 0; i < n; ++i) {
                                        r.w[i0 + i] = kernels::round_bf16(v[i]);
                                      }
                                      return absl::OkStatus();
                                    });
            !s.ok()) {
          return s;
        }
        break;
      }
      case ParamKind::kEmbedding:
      case ParamKind::kLmHead: {
        // The embedding is read as bf16 values (row lookup); the lm_head (the embedding when
        // tied) as the double-accumulation operand. Tied, the table is kept once, in double: the
        // lookup reads its rows from there (Model::embed), which saves 4 bytes per element.
        const bool head = p.kind == ParamKind::kLmHead || config_.tie_word_embeddings;
        const bool lookup = p.kind == ParamKind::kEmbedding && !head;
        LinearWeight& w = p.kind == ParamKind::kEmbedding ? embed_w_ : head_w_;
        w.out = p.shape[0];
        w.in = p.shape[1];
        w.precision = Precision::kBF16;
        w.pow2_scales = false;
        w.master = nullptr;
        w.q = {};
        w.qt = {};
        if (lookup) {
          w.bf16.resize(p.numel);
        } else {
          w.bf16 = {};
        }
        if (head) {
          w.exact.resize(p.numel);
        } else {
          w.exact = {};
        }
        if (t->dtype == DType::kBF16) {
          // The usual case: bf16 on the wire, converted straight into both operands.
          if (auto s = for_each_bf16(*t, what,
                                     [&](int64_t i, float r) {
                                       if (lookup) w.bf16[i] = r;
                                       if (head) w.exact[i] = static_cast<double>(r);
                                     });
              !s.ok()) {
            return s;
          }
          break;
        }
        if (auto s = for_each_block(*t, what,
                                    [&](const float* v, int64_t i0, int64_t n) {
                                      for (int64_t i = 0; i < n; ++i) {
                                        const float r = kernels::round_bf16(v[i]);
                                        if (lookup) w.bf16[i0 + i] = r;
                                        if (head) w.exact[i0 + i] = static_cast<double>(r);
                                      }
                                      return absl::OkStatus();
                                    });
            !s.ok()) {
          return s;
        }
        break;
      }
      case ParamKind::kNorm:
      case ParamKind::kBias: {
        float* dst = small_.data() + small_index_[small_at++].second;
        if (auto s = for_each_block(*t, what,
                                    [&](const float* v, int64_t i0, int64_t n) {
                                      for (int64_t i = 0; i < n; ++i) {
                                        dst[i0 + i] = kernels::round_bf16(v[i]);
                                      }
                                      return absl::OkStatus();
                                    });
            !s.ok()) {
          return s;
        }
        break;
      }
    }
  }
  // KV scales: a layer without them in this version uses 1 (as a freshly loaded model does).
  KvScales scales;
  scales.k.assign(n_layers, 1.0f);
  scales.v.assign(n_layers, 1.0f);
  for (int64_t l = 0; l < n_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const std::string name =
          absl::StrCat("model.layers.", l, ".self_attn.", kv == 0 ? "k_scale" : "v_scale");
      const TensorView* t = view.find(name);
      if (t == nullptr) continue;
      auto v = tensor_to_f32(*t);
      if (!v.ok()) return v.status();
      if (v->size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": '", name, "' must be a scalar"));
      }
      (kv == 0 ? scales.k : scales.v)[l] = (*v)[0];
    }
  }
  if (auto s = set_kv_scales(scales); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  }
  return absl::OkStatus();
}

int64_t Model::weight_bytes() const {
  auto of = [](const LinearWeight& w) {
    return static_cast<int64_t>(w.bf16.size() * 4 + w.exact.size() * 8 + w.q.data.size() +
                                w.q.scale_inv.size() * 4 + w.qt.data.size() +
                                w.qt.scale_inv.size() * 4);
  };
  int64_t n = static_cast<int64_t>(params_.size() + small_.size()) * 4 + of(embed_w_) + of(head_w_);
  for (const LinearWeight* w : linear_of_) {
    if (w != nullptr) n += of(*w);
  }
  for (const RouterWeight* r : router_of_) {
    if (r != nullptr) n += static_cast<int64_t>(r->w.size()) * 8;
  }
  return n;
}

}  // namespace fp8rl::model
