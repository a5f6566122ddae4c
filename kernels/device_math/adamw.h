// The AdamW update of one parameter element and the gradient-clipping factor, written once for
// the CPU optimizer (model/optimizer.cc) and the CUDA kernels (kernels/cuda/optim_kernels.cu), so
// both run the same fp32 arithmetic in the same order (see hd.h: the kernels are compiled with
// --fmad=false and sqrt is IEEE on both sides, so an element's update is bit-identical).
//
// The per-step scalars (bias corrections, learning rate) are computed once per step on the host
// in double and rounded to fp32 (adamw_coeffs); only the per-element loop runs on the device.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::dm {

// The fp32 scalars of one AdamW step (1-based step t):
//   beta1, one_minus_beta1, beta2, one_minus_beta2: the moments' coefficients (1 - beta taken in
//     double, then rounded);
//   lr_wd = fp32(lr) * fp32(weight_decay) (an fp32 product), the decoupled decay factor;
//   step_size = fp32(lr / (1 - beta1^t)), inv_sqrt_c2 = fp32(1 / sqrt(1 - beta2^t));
//   eps = fp32(eps).
struct AdamWCoeffs {
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float lr_wd = 0, step_size = 0, inv_sqrt_c2 = 0, eps = 0;
};

// Host only: the coefficients of step `t` (>= 1) at learning rate `lr`.
inline AdamWCoeffs adamw_coeffs(double lr, double beta1, double beta2, double eps,
                                double weight_decay, int64_t t) {
  const double c1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double c2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  AdamWCoeffs c;
  c.beta1 = static_cast<float>(beta1);
  c.one_minus_beta1 = static_cast<float>(1 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1 - beta2);
  c.lr_wd = static_cast<float>(lr) * static_cast<float>(weight_decay);
  c.step_size = static_cast<float>(lr / c1);
  c.inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(c2));
  c.eps = static_cast<float>(eps);
  return c;
}

// One element: g is the (scaled, clipped) gradient; m, v the moments; p the fp32 master weight.
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   p = p - lr * wd * p                          (decay: matrices only)
//   p = p - step_size * m / (sqrt(v) * inv_sqrt_c2 + eps)
// i.e. p -= lr * m_hat / (sqrt(v_hat) + eps) with m_hat = m / (1 - beta1^t) and
// sqrt(v_hat) = sqrt(v) / sqrt(1 - beta2^t). Every operation is one fp32 rounding, left to right.
FP8RL_HD void adamw_update(float g, bool decay, const AdamWCoeffs& c, float& p, float& m,
                           float& v) {
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  if (decay) p -= c.lr_wd * p;
  p -= c.step_size * m / (sqrt_f32(v) * c.inv_sqrt_c2 + c.eps);
}

// The factor every gradient element is multiplied by: max_grad_norm / (grad_norm + 1e-6) in
// double, rounded to fp32, when clipping is on (max_grad_norm > 0) and grad_norm exceeds it;
// exactly 1 otherwise.
FP8RL_HD bool clip_applies(double grad_norm, double max_grad_norm) {
  return max_grad_norm > 0 && grad_norm > max_grad_norm;
}
FP8RL_HD float clip_factor(double grad_norm, double max_grad_norm) {
  return clip_applies(grad_norm, max_grad_norm)
             ? static_cast<float>(max_grad_norm / (grad_norm + 1e-6))
             : 1.0f;
}

}  // namespace fp8rl::kernels::dm
