// Softmax attention of one query row over n keys, shared by the CPU reference and the CUDA
// prefill and paged-decode kernels.
#pragma once

#include <cstdint>

#include "kernels/device_math/dot.h"
#include "kernels/device_math/hd.h"
#include "kernels/device_math/paged_kv.h"

namespace fp8rl::kernels::dm {

// out[d] = sum_j p_j * value(j)(d), p_j = softmax_j(scale * q . key(j)), for j < n; q and out are
// [hd]. keys(j) / values(j) return a loader of row j (callable on an index in [0, hd)).
//
// The arithmetic is model/ops.cc attend_row's, value for value: s_j = dot8(q, k_j) * scale,
// mx = max_j s_j, e_j = exp(s_j - mx), sum = e_0 + e_1 + ... (in order), p_j = e_j * (1/sum),
// out[d] accumulated over j in order. Instead of a scores buffer the scores are recomputed in each
// of the three passes (same inputs, same function, same value), so a kernel needs no scratch.
template <typename Keys, typename Values>
FP8RL_HD void attend_row(const float* q, const Keys& keys, const Values& values, int64_t n,
                         int64_t hd, float scale, float* out) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    const float s = dot8(q, keys(j), hd) * scale;
    mx = s > mx ? s : mx;  // std::max(mx, s): keeps mx unless s is larger
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += exp_f32(dot8(q, keys(j), hd) * scale - mx);
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < hd; ++d) out[d] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float p = exp_f32(dot8(q, keys(j), hd) * scale - mx) * inv;
    const auto v = values(j);
    for (int64_t d = 0; d < hd; ++d) out[d] += p * v(d);
  }
}

// Row j of a KV store of element type `dtype`: base + j * stride elements, dequantized on load.
struct KvRow {
  const void* row;
  KvDtype dtype;
  float scale;
  FP8RL_HD float operator()(int64_t i) const { return kv_load(row, i, dtype, scale); }
};

// Rows j of a contiguous fp32 matrix: base + j * stride.
struct FloatRows {
  const float* base;
  int64_t stride;
  FP8RL_HD FloatRow operator()(int64_t j) const { return FloatRow{base + j * stride}; }
};

// Positions j of sequence s, kv head g, in one pool (K or V) of a paged cache.
struct PagedRows {
  const PagedKvView* kv;
  const void* pool;
  float scale;
  int64_t s, g;
  FP8RL_HD KvRow operator()(int64_t j) const {
    return KvRow{kv_elem_ptr(pool, kv->dtype, paged_kv_offset(*kv, s, j, g)), kv->dtype, scale};
  }
};

}  // namespace fp8rl::kernels::dm
