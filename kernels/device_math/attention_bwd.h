// The backward of one softmax-attention row (device_math/attention.h attend_row), shared by the
// CPU reference and the CUDA kernels, split so that each gradient can be summed by its own owner
// without atomics: the row's softmax statistics once, then the score gradient ds_j of any key j
// recomputed from them (same inputs, same functions, same value every time).
#pragma once

#include <cstdint>

#include "kernels/device_math/dot.h"
#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::dm {

// Softmax statistics of one query row over keys 0..n-1 and the output gradient dout:
//   s_j = dot8(q, k_j) * scale, mx = max_j s_j, inv = 1 / sum_j exp(s_j - mx) (sum in order),
//   p_j = exp(s_j - mx) * inv, dp_j = dot8(dout, v_j), pdp = sum_j p_j dp_j (in order).
// model/ops.cc attend_row_backward's arithmetic, value for value.
struct AttnRowStats {
  float mx, inv, pdp;
};
template <typename Keys, typename Values>
FP8RL_HD AttnRowStats attend_row_stats(const float* q, const Keys& keys, const Values& values,
                                       const float* dout, int64_t n, int64_t hd, float scale) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    const float s = dot8(q, keys(j), hd) * scale;
    mx = s > mx ? s : mx;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += exp_f32(dot8(q, keys(j), hd) * scale - mx);
  const float inv = 1.0f / sum;
  float pdp = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float p = exp_f32(dot8(q, keys(j), hd) * scale - mx) * inv;
    pdp += p * dot8(dout, values(j), hd);
  }
  return {mx, inv, pdp};
}

// The probability p_j and the score gradient ds_j = p_j (dp_j - pdp) * scale of key j for a row
// with statistics st. Then dq += ds_j k_j, dk_j += ds_j q, dv_j += p_j dout.
template <typename KeyRow, typename ValueRow>
FP8RL_HD void attend_ds(const float* q, const KeyRow& k_j, const ValueRow& v_j, const float* dout,
                        int64_t hd, float scale, const AttnRowStats& st, float* p, float* ds) {
  const float pj = exp_f32(dot8(q, k_j, hd) * scale - st.mx) * st.inv;
  *p = pj;
  *ds = pj * (dot8(dout, v_j, hd) - st.pdp) * scale;
}

}  // namespace fp8rl::kernels::dm
