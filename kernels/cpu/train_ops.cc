// CPU reference loops of the training kernels (kernels/cpu/train_ops.h).
#include "kernels/cpu/train_ops.h"

#include <cmath>

#include "kernels/device_math/attention.h"
#include "kernels/device_math/attention_bwd.h"
#include "kernels/device_math/logprob_bwd.h"
#include "kernels/device_math/rmsnorm_bwd.h"
#include "kernels/device_math/rope_bwd.h"
#include "kernels/device_math/swiglu_bwd.h"

namespace fp8rl::kernels::cpu {

void rmsnorm_backward(const float* x, const float* g, const float* inv_rms, const float* dy,
                      int64_t rows, int64_t h, float* dx, float* dg) {
  for (int64_t r = 0; r < rows; ++r) {
    dm::rmsnorm_bwd_row(x + r * h, g, inv_rms[r], dy + r * h, h, dx + r * h);
  }
  for (int64_t c = 0; c < h; ++c) dm::rmsnorm_bwd_dg_col(x, inv_rms, dy, rows, h, c, dg);
}

void rope_inverse(const float* cos, const float* sin, const int32_t* pos, int64_t rows,
                  int64_t heads, int64_t head_dim, float* x) {
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos + static_cast<int64_t>(pos[r]) * half;
    const float* s = sin + static_cast<int64_t>(pos[r]) * half;
    for (int64_t hh = 0; hh < heads; ++hh) {
      float* v = x + (r * heads + hh) * head_dim;
      for (int64_t i = 0; i < half; ++i) dm::rope_unrotate_pair(v[i], v[i + half], c[i], s[i]);
    }
  }
}

void swiglu_backward(const float* g, const float* u, const float* dact, int64_t n, float* dg,
                     float* du) {
  for (int64_t i = 0; i < n; ++i) dm::swiglu_bwd(g[i], u[i], dact[i], dg + i, du + i);
}

void attention_prefill_backward(const float* q, const float* k, const float* v, const float* dout,
                                const int32_t* seq_start, int64_t n_seq, int64_t n_heads,
                                int64_t n_kv, int64_t head_dim, float scale, float* stats,
                                float* dq, float* dk, float* dv) {
  const int64_t qd = n_heads * head_dim, kvd = n_kv * head_dim, group = n_heads / n_kv;
  // Pass 1 (one thread per row and head on the device): softmax statistics.
  for (int64_t s = 0; s < n_seq; ++s) {
    const int64_t r0 = seq_start[s], r1 = seq_start[s + 1];
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t hh = 0; hh < n_heads; ++hh) {
        const int64_t g = hh / group;
        const dm::FloatRows keys{k + r0 * kvd + g * head_dim, kvd};
        const dm::FloatRows values{v + r0 * kvd + g * head_dim, kvd};
        const dm::AttnRowStats st =
            dm::attend_row_stats(q + r * qd + hh * head_dim, keys, values,
                                 dout + r * qd + hh * head_dim, r - r0 + 1, head_dim, scale);
        float* o = stats + (r * n_heads + hh) * 3;
        o[0] = st.mx;
        o[1] = st.inv;
        o[2] = st.pdp;
      }
    }
  }
  // Pass 2 (one thread per row and head): dq = sum_j ds_j k_j over keys in order.
  for (int64_t s = 0; s < n_seq; ++s) {
    const int64_t r0 = seq_start[s], r1 = seq_start[s + 1];
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t hh = 0; hh < n_heads; ++hh) {
        const int64_t g = hh / group;
        const float* st = stats + (r * n_heads + hh) * 3;
        const float* qr = q + r * qd + hh * head_dim;
        const float* dor = dout + r * qd + hh * head_dim;
        float* dqr = dq + r * qd + hh * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) dqr[d] = 0.0f;
        for (int64_t j = r0; j <= r; ++j) {
          const float* kj = k + j * kvd + g * head_dim;
          float p, ds;
          dm::attend_ds(qr, dm::FloatRow{kj}, dm::FloatRow{v + j * kvd + g * head_dim}, dor,
                        head_dim, scale, {st[0], st[1], st[2]}, &p, &ds);
          for (int64_t d = 0; d < head_dim; ++d) dqr[d] += ds * kj[d];
        }
      }
    }
  }
  // Pass 3 (one thread per sequence, kv head and key row j): dk_j, dv_j over the group's heads,
  // then the query rows i >= j, in order.
  for (int64_t s = 0; s < n_seq; ++s) {
    const int64_t r0 = seq_start[s], r1 = seq_start[s + 1];
    for (int64_t g = 0; g < n_kv; ++g) {
      for (int64_t j = r0; j < r1; ++j) {
        const float* kj = k + j * kvd + g * head_dim;
        const float* vj = v + j * kvd + g * head_dim;
        float* dkj = dk + j * kvd + g * head_dim;
        float* dvj = dv + j * kvd + g * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) dkj[d] = dvj[d] = 0.0f;
        for (int64_t hh = g * group; hh < (g + 1) * group; ++hh) {
          for (int64_t i = j; i < r1; ++i) {
            const float* st = stats + (i * n_heads + hh) * 3;
            const float* qi = q + i * qd + hh * head_dim;
            const float* doi = dout + i * qd + hh * head_dim;
            float p, ds;
            dm::attend_ds(qi, dm::FloatRow{kj}, dm::FloatRow{vj}, doi, head_dim, scale,
                          {st[0], st[1], st[2]}, &p, &ds);
            for (int64_t d = 0; d < head_dim; ++d) {
              dkj[d] += ds * qi[d];
              dvj[d] += p * doi[d];
            }
          }
        }
      }
    }
  }
}

void head_dlogits(float* z, int64_t rows, int64_t vocab, float inv_t, const int32_t* targets,
                  const float* lse, const float* dlogp) {
  for (int64_t r = 0; r < rows; ++r) {
    float* zr = z + r * vocab;
    for (int64_t j = 0; j < vocab; ++j) {
      zr[j] = dm::logprob_dlogit(zr[j], j == targets[r], dlogp[r], inv_t, lse[r]);
    }
  }
}

void embed_backward(const float* dx, const int32_t* tokens, int64_t rows, int64_t h,
                    float* dembed) {
  for (int64_t c = 0; c < h; ++c) {
    for (int64_t r = 0; r < rows; ++r)
      dembed[static_cast<int64_t>(tokens[r]) * h + c] += dx[r * h + c];
  }
}

void kv_fake_quant(float* x, int64_t n, dm::KvDtype dtype, float scale) {
  for (int64_t i = 0; i < n; ++i) x[i] = dm::kv_round_trip(x[i], dtype, scale);
}

void seq_amax(const float* x, int64_t width, const int32_t* seq_start, int64_t n_seq, float* amax) {
  for (int64_t s = 0; s < n_seq; ++s) {
    float m = 0.0f;
    for (int64_t i = seq_start[s] * width; i < seq_start[s + 1] * width; ++i) {
      m = std::fmax(m, std::fabs(x[i]));
    }
    amax[s] = m;
  }
}

}  // namespace fp8rl::kernels::cpu
