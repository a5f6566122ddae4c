// One sequence's KV cache for incremental decoding, stored in its policy format (fp32, bf16 bits,
// or E4M3 codes with the layer's per-tensor k_scale/v_scale, vLLM convention), allocated once for
// the sequence's whole length so the decode loop never allocates.
#pragma once

#include <cstdint>
#include <vector>

#include "model/precision.h"

namespace fp8rl::model {

class KvCache {
 public:
  KvCache(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t capacity, KvCacheDtype dtype);

  int64_t capacity() const { return capacity_; }
  KvCacheDtype dtype() const { return dtype_; }
  int64_t bytes() const { return static_cast<int64_t>(k_.size() + v_.size()); }

  // Stores the K and V rows (kv_heads * head_dim floats each) of the token at `pos`.
  void write(int64_t layer, int64_t pos, const float* k_row, const float* v_row, float k_scale,
             float v_scale);
  // The stored keys (values) of `head` at positions [0, n) as fp32 [n, head_dim]: a pointer into
  // the cache for fp32, otherwise dequantized into `scratch` (n * head_dim floats).
  const float* keys(int64_t layer, int64_t head, int64_t n, float k_scale, float* scratch) const;
  const float* values(int64_t layer, int64_t head, int64_t n, float v_scale, float* scratch) const;

 private:
  int64_t index(int64_t layer, int64_t head, int64_t pos) const {
    return ((layer * kv_heads_ + head) * capacity_ + pos) * head_dim_;
  }
  void store(std::vector<uint8_t>& dst, int64_t at, const float* x, float scale);
  const float* load(const std::vector<uint8_t>& src, int64_t at, int64_t n, float scale,
                    float* scratch) const;

  int64_t layers_, kv_heads_, head_dim_, capacity_;
  KvCacheDtype dtype_;
  int64_t elem_size_;
  std::vector<uint8_t> k_, v_;
};

// The rounding the cache applies, in place (fp32: none). The training forward uses it to see the
// same K/V that generation reads back.
void kv_round_trip(KvCacheDtype dtype, float* x, int64_t n, float scale);

}  // namespace fp8rl::model
