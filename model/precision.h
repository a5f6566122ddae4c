// The precision policy: which format the linear layers and the KV cache use, shared by generation
// and training so both sides compute the same function (ARCHITECTURE.md, "FP8 recipe").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fp8rl::model {

// Linear-layer format. kF32: everything fp32, no rounding. kBF16: bf16 weights, every op output
// rounded to bf16 (the CPU emulation of a bf16 GPU path). kFP8: q/k/v/o/gate/up/down through the
// block-scaled FP8 GEMM (1x128 activations, 128x128 weights, bf16 outputs); the rest as kBF16.
enum class Precision { kF32, kBF16, kFP8 };
// KV-cache storage: fp32, bf16, or E4M3 with a per-layer per-tensor scale (k_scale / v_scale).
enum class KvCacheDtype { kF32, kBF16, kFP8 };

std::string_view precision_name(Precision p);          // "fp32" | "bf16" | "fp8"
std::string_view kv_cache_dtype_name(KvCacheDtype d);  // "fp32" | "bf16" | "fp8"
// Accepts the names above; errors: "unknown precision 'x' (expected fp32, bf16 or fp8)".
absl::StatusOr<Precision> parse_precision(std::string_view name);
absl::StatusOr<KvCacheDtype> parse_kv_cache_dtype(std::string_view name);

struct PrecisionPolicy {
  Precision linear = Precision::kF32;
  KvCacheDtype kv_cache = KvCacheDtype::kF32;
  // With kFP8, the first/last N decoder layers keep their linears in bf16.
  int64_t bf16_first_layers = 0;
  int64_t bf16_last_layers = 0;
  // Power-of-two scales for weight blocks and activation tiles.
  bool pow2_scales = false;
  // Training forward applies the KV-cache rounding (bf16, or E4M3 with the same k/v scales) to K
  // (after RoPE) and V, with straight-through gradients, so it matches generation.
  bool train_kv_fake_quant = true;

  // True when non-linear ops round to bf16 (kBF16 and kFP8).
  bool bf16_activations() const { return linear != Precision::kF32; }
  // The format used by the linears of decoder layer `layer` of `num_layers`.
  Precision layer_linear(int64_t layer, int64_t num_layers) const;
};

}  // namespace fp8rl::model
