// Split-context ("flash-decoding") attention of one query row: the order of operations of the
// CUDA paged-decode kernel (kernels/cuda/decoder_kernels.cu, attention_paged_split_kernel),
// written once as plain loops so the CPU reproduces the kernel's summation order exactly and the
// GPU test differs from it only by exp's rounding (glibc vs CUDA), as attend_row's does.
//
// The recipe (n positions, head_dim hd, `stripes` = the kernel's warps per block):
//   - positions are cut into tiles of kSplitTile = 32 (one per lane of a warp); tile t belongs to
//     stripe t % stripes;
//   - each stripe keeps an online softmax state (m, l, acc[hd]) over its tiles in increasing order:
//       s_j  = dot8(q, k_j) * scale                      (attend_row's score, bit for bit)
//       m'   = max(m, max_{j in tile} s_j)
//       c    = exp(m - m')                               (exp(-inf) = 0 for the first tile)
//       p_j  = exp(s_j - m')
//       l    = l * c + tree_sum32(p)                     (the warp's xor butterfly, warp_order.h)
//       acc  = acc * c, then acc += p_j * v_j for j in the tile in order
//   - the stripes merge in stripe order: M = max m_w, f_w = exp(m_w - M) (0 for an empty stripe),
//     L = sum_w l_w * f_w, out = (sum_w acc_w * f_w) * (1 / L).
// Against attend_row (three passes, one global max, one sequential sum) this reorders fp32 sums
// and rescales partial sums, so the two agree to a few fp32 ulp relative to the row's largest
// output, not bit for bit (device_math_test: kSplitVsSerialAttentionRel).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/device_math/attention.h"
#include "kernels/device_math/dot.h"
#include "kernels/device_math/hd.h"
#include "kernels/device_math/warp_order.h"

namespace fp8rl::kernels::dm {

inline constexpr int kSplitTile = kWarpLanes;  // positions per tile: one per lane
inline constexpr int kDecodeStripes = 8;       // the decode kernel's warps per block
inline constexpr int kSplitMaxHeadDim = 256;   // the kernel keeps hd / 32 values per lane

// out[hd] = softmax attention of q[hd] over keys(j) / values(j), j < n, in the split order above.
// Host only: the kernel is the parallel form of these loops.
template <typename Keys, typename Values>
void attend_row_split(const float* q, const Keys& keys, const Values& values, int64_t n, int64_t hd,
                      float scale, int stripes, float* out) {
  std::vector<float> m(stripes, -INFINITY), l(stripes, 0.0f), acc(stripes * hd, 0.0f);
  const int64_t tiles = (n + kSplitTile - 1) / kSplitTile;
  for (int64_t t = 0; t < tiles; ++t) {
    const int w = static_cast<int>(t % stripes);
    const int64_t j0 = t * kSplitTile;
    const int64_t count = n - j0 < kSplitTile ? n - j0 : kSplitTile;
    float s[kSplitTile], p[kSplitTile];
    float mt = -INFINITY;
    for (int64_t i = 0; i < count; ++i) {
      s[i] = dot8(q, keys(j0 + i), hd) * scale;
      mt = s[i] > mt ? s[i] : mt;
    }
    const float m_new = mt > m[w] ? mt : m[w];
    const float c = exp_f32(m[w] - m_new);
    for (int i = 0; i < kSplitTile; ++i) p[i] = i < count ? exp_f32(s[i] - m_new) : 0.0f;
    l[w] = l[w] * c + tree_sum32<float>(p);
    float* a = acc.data() + w * hd;
    for (int64_t d = 0; d < hd; ++d) a[d] = a[d] * c;
    for (int64_t i = 0; i < count; ++i) {
      const auto v = values(j0 + i);
      for (int64_t d = 0; d < hd; ++d) a[d] = a[d] + p[i] * v(d);
    }
    m[w] = m_new;
  }
  float mx = -INFINITY;
  for (int w = 0; w < stripes; ++w) mx = m[w] > mx ? m[w] : mx;
  std::vector<float> f(stripes);
  float sum = 0.0f;
  for (int w = 0; w < stripes; ++w) {
    f[w] = exp_f32(m[w] - mx);
    sum = sum + l[w] * f[w];
  }
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < hd; ++d) {
    float o = 0.0f;
    for (int w = 0; w < stripes; ++w) o = o + acc[w * hd + d] * f[w];
    out[d] = o * inv;
  }
}

}  // namespace fp8rl::kernels::dm
