// The rounding a KV cache in the policy's format applies to a stored K or V value (fp32: none;
// bf16; E4M3 codes with the layer's per-tensor k_scale / v_scale, vLLM convention). The training
// forward applies it (train_kv_fake_quant) so it sees the K/V that generation reads back from the
// decoder engine's paged cache (engine/cpu/decoder_ops.cc, kernels/device_math/paged_kv.h).
#pragma once

#include <cstdint>

#include "model/precision.h"

namespace fp8rl::model {

// x through the cache format and back, in place (fp32: unchanged).
void kv_round_trip(KvCacheDtype dtype, float* x, int64_t n, float scale);

}  // namespace fp8rl::model
