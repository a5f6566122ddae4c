// The KV cache format's round trip for the training forward.
#include "model/kv_cache.h"

#include "kernels/formats.h"
#include "kernels/quantize.h"

namespace fp8rl::model {

void kv_round_trip(KvCacheDtype dtype, float* x, int64_t n, float scale) {
  switch (dtype) {
    case KvCacheDtype::kF32:
      return;
    case KvCacheDtype::kBF16:
      for (int64_t i = 0; i < n; ++i) x[i] = kernels::round_bf16(x[i]);
      return;
    case KvCacheDtype::kFP8:
      kernels::fake_quantize_with_scale(x, n, scale);
      return;
  }
}

}  // namespace fp8rl::model
