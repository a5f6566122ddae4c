// CPU reference implementations of the decoder's elementwise, normalisation and attention math.
#include "model/ops.h"

#include <algorithm>
#include <cmath>

#include "kernels/formats.h"

namespace fp8rl::model::ops {

float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void round_bf16_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = kernels::round_bf16(x[i]);
}

void rmsnorm_forward(const float* x, const float* g, int64_t rows, int64_t h, float eps, float* y,
                     float* inv_rms) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    const float ms = dot(xr, xr, h) / static_cast<float>(h);
    const float inv = 1.0f / std::sqrt(ms + eps);
    if (inv_rms) inv_rms[r] = inv;
    float* yr = y + r * h;
    for (int64_t i = 0; i < h; ++i) yr[i] = xr[i] * inv * g[i];
  }
}

void rmsnorm_backward(const float* x, const float* g, const float* inv_rms, const float* dy,
                      int64_t rows, int64_t h, float* dx, float* dg) {
  // y = x * inv * g, inv = (mean(x^2) + eps)^-1/2; d inv / dx_i = -inv^3 x_i / h.
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    const float* dyr = dy + r * h;
    const float inv = inv_rms[r];
    double s = 0;  // sum dy_i g_i x_i
    for (int64_t i = 0; i < h; ++i) {
      s += static_cast<double>(dyr[i]) * g[i] * xr[i];
      dg[i] += dyr[i] * xr[i] * inv;
    }
    const float c = static_cast<float>(s) * inv * inv * inv / static_cast<float>(h);
    float* dxr = dx + r * h;
    for (int64_t i = 0; i < h; ++i) dxr[i] = dyr[i] * g[i] * inv - c * xr[i];
  }
}

std::vector<float> rope_inv_freq(double theta, int64_t head_dim, const RopeScaling& scaling) {
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    // HF computes inv_freq in fp32; keep that value.
    inv_freq[i] = static_cast<float>(
        1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim)));
  }
  if (!scaling.llama3()) return inv_freq;
  const double old_len = static_cast<double>(scaling.original_max_position_embeddings);
  const double low_wavelen = old_len / scaling.low_freq_factor;
  const double high_wavelen = old_len / scaling.high_freq_factor;
  for (float& f : inv_freq) {
    const double freq = f;
    const double wavelen = 2.0 * M_PI / freq;
    double scaled = freq;
    if (wavelen > low_wavelen) {
      scaled = freq / scaling.factor;
    } else if (wavelen >= high_wavelen) {
      const double s = (old_len / wavelen - scaling.low_freq_factor) /
                       (scaling.high_freq_factor - scaling.low_freq_factor);
      scaled = (1.0 - s) * freq / scaling.factor + s * freq;
    }
    f = static_cast<float>(scaled);
  }
  return inv_freq;
}

void rope_fill(const std::vector<float>& inv_freq, int64_t max_pos, float* cos, float* sin) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  for (int64_t i = 0; i < half; ++i) {
    for (int64_t p = 0; p < max_pos; ++p) {
      const double angle = static_cast<double>(p) * static_cast<double>(inv_freq[i]);
      cos[p * half + i] = static_cast<float>(std::cos(angle));
      sin[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void rope_apply(const RopeTable& t, const int32_t* pos, int64_t rows, int64_t heads,
                int64_t head_dim, float* x, bool inverse) {
  const int64_t half = t.half;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = t.cos + static_cast<int64_t>(pos[r]) * half;
    const float* s = t.sin + static_cast<int64_t>(pos[r]) * half;
    for (int64_t hh = 0; hh < heads; ++hh) {
      float* v = x + (r * heads + hh) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        if (!inverse) {
          v[i] = a * c[i] - b * s[i];
          v[i + half] = b * c[i] + a * s[i];
        } else {
          v[i] = a * c[i] + b * s[i];
          v[i + half] = b * c[i] - a * s[i];
        }
      }
    }
  }
}

void attend_row(const float* q, const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                int64_t n, int64_t hd, float scale, float* scores, float* out) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = dot(q, k + j * k_stride, hd) * scale;
    mx = std::max(mx, scores[j]);
  }
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - mx);
    sum += scores[j];
  }
  const float inv = 1.0f / sum;
  std::fill(out, out + hd, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const float p = scores[j] * inv;
    const float* vj = v + j * v_stride;
    for (int64_t d = 0; d < hd; ++d) out[d] += p * vj[d];
  }
}

void attend_row_backward(const float* q, const float* k, int64_t k_stride, const float* v,
                         int64_t v_stride, int64_t n, int64_t hd, float scale, const float* dout,
                         float* scores, float* dscores, float* dq, float* dk, float* dv) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = dot(q, k + j * k_stride, hd) * scale;
    mx = std::max(mx, scores[j]);
  }
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - mx);
    sum += scores[j];
  }
  const float inv = 1.0f / sum;
  float pdp = 0;  // sum_j p_j dp_j
  for (int64_t j = 0; j < n; ++j) {
    scores[j] *= inv;
    dscores[j] = dot(dout, v + j * v_stride, hd);
    pdp += scores[j] * dscores[j];
  }
  for (int64_t j = 0; j < n; ++j) {
    const float p = scores[j];
    const float ds = p * (dscores[j] - pdp) * scale;
    const float* kj = k + j * k_stride;
    float* dkj = dk + j * k_stride;
    float* dvj = dv + j * v_stride;
    for (int64_t d = 0; d < hd; ++d) {
      dq[d] += ds * kj[d];
      dkj[d] += ds * q[d];
      dvj[d] += p * dout[d];
    }
  }
}

void swiglu_forward(const float* g, const float* u, int64_t n, float* act) {
  for (int64_t i = 0; i < n; ++i) {
    const float sig = 1.0f / (1.0f + std::exp(-g[i]));
    act[i] = g[i] * sig * u[i];
  }
}

void swiglu_backward(const float* g, const float* u, const float* dact, int64_t n, float* dg,
                     float* du) {
  for (int64_t i = 0; i < n; ++i) {
    const float sig = 1.0f / (1.0f + std::exp(-g[i]));
    const float silu = g[i] * sig;
    du[i] = dact[i] * silu;
    dg[i] = dact[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
  }
}

float logsumexp_scaled(const float* z, int64_t n, float inv_t) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, z[i] * inv_t);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(z[i] * inv_t - mx));
  return mx + static_cast<float>(std::log(sum));
}

}  // namespace fp8rl::model::ops
