// KV-cache storage and the matching round trip for the training forward.
#include "model/kv_cache.h"

#include <cstring>

#include "kernels/formats.h"
#include "kernels/quantize.h"

namespace fp8rl::model {

KvCache::KvCache(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t capacity,
                 KvCacheDtype dtype)
    : layers_(layers),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      capacity_(capacity),
      dtype_(dtype),
      elem_size_(dtype == KvCacheDtype::kF32    ? 4
                 : dtype == KvCacheDtype::kBF16 ? 2
                                                : 1) {
  const int64_t n = layers * kv_heads * capacity * head_dim * elem_size_;
  k_.resize(n);
  v_.resize(n);
}

void KvCache::store(std::vector<uint8_t>& dst, int64_t at, const float* x, float scale) {
  uint8_t* p = dst.data() + at * elem_size_;
  switch (dtype_) {
    case KvCacheDtype::kF32:
      std::memcpy(p, x, head_dim_ * sizeof(float));
      break;
    case KvCacheDtype::kBF16: {
      auto* b = reinterpret_cast<uint16_t*>(p);
      for (int64_t d = 0; d < head_dim_; ++d) b[d] = kernels::float_to_bf16(x[d]);
      break;
    }
    case KvCacheDtype::kFP8:
      kernels::quantize_with_scale(x, head_dim_, scale, p);
      break;
  }
}

void KvCache::write(int64_t layer, int64_t pos, const float* k_row, const float* v_row,
                    float k_scale, float v_scale) {
  for (int64_t h = 0; h < kv_heads_; ++h) {
    store(k_, index(layer, h, pos), k_row + h * head_dim_, k_scale);
    store(v_, index(layer, h, pos), v_row + h * head_dim_, v_scale);
  }
}

const float* KvCache::load(const std::vector<uint8_t>& src, int64_t at, int64_t n, float scale,
                           float* scratch) const {
  const uint8_t* p = src.data() + at * elem_size_;
  const int64_t count = n * head_dim_;
  switch (dtype_) {
    case KvCacheDtype::kF32:
      return reinterpret_cast<const float*>(p);
    case KvCacheDtype::kBF16: {
      const auto* b = reinterpret_cast<const uint16_t*>(p);
      for (int64_t i = 0; i < count; ++i) scratch[i] = kernels::bf16_to_float(b[i]);
      return scratch;
    }
    case KvCacheDtype::kFP8:
      kernels::dequantize_with_scale(p, count, scale, scratch);
      return scratch;
  }
  return scratch;
}

const float* KvCache::keys(int64_t layer, int64_t head, int64_t n, float k_scale,
                           float* scratch) const {
  return load(k_, index(layer, head, 0), n, k_scale, scratch);
}

const float* KvCache::values(int64_t layer, int64_t head, int64_t n, float v_scale,
                             float* scratch) const {
  return load(v_, index(layer, head, 0), n, v_scale, scratch);
}

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
