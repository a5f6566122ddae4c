// The shared AdamW element update (kernels/device_math/adamw.h) that model::AdamW and the CUDA
// optimizer kernel both run: bit-identical to the fp32 loop model::AdamW ran before it was shared,
// and within a derived rounding bound of the same update in double precision.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/device_math/adamw.h"
#include "model/optimizer.h"
#include "model/params.h"

namespace fp8rl::kernels::dm {
namespace {

struct Hyper {
  double lr, beta1, beta2, eps, wd;
  int64_t t;
};

const Hyper kHypers[] = {
    {1e-3, 0.9, 0.999, 1e-8, 0.0, 1},   {3e-4, 0.9, 0.95, 1e-8, 0.1, 7},
    {1e-2, 0.8, 0.99, 1e-6, 0.01, 250}, {2e-5, 0.95, 0.999, 1e-8, 0.05, 10000},
    {1.0, 0.0, 0.5, 1e-3, 1.0, 2},
};

// Random moments and gradients spanning many magnitudes (no zeros), v >= 0.
struct Element {
  float p, m, v, g;
};
std::vector<Element> random_elements(uint32_t seed, int n) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-12, 4);
  std::vector<Element> out;
  for (int i = 0; i < n; ++i) {
    Element x;
    x.p = std::ldexp(normal(gen), e(gen)) + 1e-30f;
    x.g = std::ldexp(normal(gen), e(gen)) + 1e-30f;
    x.m = std::ldexp(normal(gen), e(gen)) + 1e-30f;
    const float s = std::ldexp(normal(gen), e(gen));
    x.v = s * s + 1e-30f;
    out.push_back(x);
  }
  return out;
}

// The element loop of model::AdamW::step as it was written before the update moved into
// adamw.h, kept verbatim as the regression oracle of the refactoring.
void old_loop(const Hyper& h, bool decay, float g, float& p, float& m, float& v) {
  const double b1 = h.beta1, b2 = h.beta2;
  const double c1 = 1.0 - std::pow(b1, static_cast<double>(h.t));
  const double c2 = 1.0 - std::pow(b2, static_cast<double>(h.t));
  const float lr = static_cast<float>(h.lr), wd = static_cast<float>(h.wd),
              eps = static_cast<float>(h.eps);
  const float step_size = static_cast<float>(h.lr / c1);
  const float inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(c2));
  m = static_cast<float>(b1) * m + static_cast<float>(1 - b1) * g;
  v = static_cast<float>(b2) * v + static_cast<float>(1 - b2) * g * g;
  if (decay) p -= lr * wd * p;
  p -= step_size * m / (std::sqrt(v) * inv_sqrt_c2 + eps);
}

TEST(AdamWMath, BitIdenticalToThePreviousOptimizerLoop) {
  int64_t checked = 0, moved = 0;
  for (const Hyper& h : kHypers) {
    const AdamWCoeffs c = adamw_coeffs(h.lr, h.beta1, h.beta2, h.eps, h.wd, h.t);
    for (const Element& e : random_elements(static_cast<uint32_t>(h.t), 4000)) {
      for (bool decay : {false, true}) {
        float p0 = e.p, m0 = e.m, v0 = e.v;
        float p1 = e.p, m1 = e.m, v1 = e.v;
        old_loop(h, decay, e.g, p0, m0, v0);
        adamw_update(e.g, decay, c, p1, m1, v1);
        ASSERT_EQ(std::bit_cast<uint32_t>(p0), std::bit_cast<uint32_t>(p1)) << p0 << " " << p1;
        ASSERT_EQ(std::bit_cast<uint32_t>(m0), std::bit_cast<uint32_t>(m1));
        ASSERT_EQ(std::bit_cast<uint32_t>(v0), std::bit_cast<uint32_t>(v1));
        moved += p1 != e.p;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 5 * 4000 * 2);
  EXPECT_GT(moved, checked / 2);  // most updates change the weight (not a no-op comparison)
}

// The textbook AdamW step in double from the same fp32 inputs. With u = 2^-24 (one fp32
// rounding), counting the roundings of adamw_update and of the fp32 coefficients:
//   m: 2 coefficient roundings + 2 products + 1 sum  -> |dm| <= 5u (|b1 m| + |(1-b1) g|)
//   v: 2 coefficients + 3 products + 1 sum (all terms >= 0) -> |dv| <= 6u v
//   D = sqrt(v) inv_sqrt_c2 + eps: 3u + dv/2 + 2u (coefficient, eps) -> rel <= 8u
//   U = step_size m / D: step_size 1u, product 1u, division 1u, plus dm and D's error
//       -> |dU| <= 11u |U| + |step_size| |dm| / D
//   decay: lr_wd 3u, product 1u, subtraction 1u; final subtraction 1u.
// So |p_f - p_d| <= 2u |p| + 5u |lr wd p| + 12u |U| + |step_size| |dm| / D; the test allows
// twice that.
TEST(AdamWMath, WithinTheDerivedBoundOfTheDoubleFormula) {
  const double u = std::ldexp(1.0, -24);
  double worst = 0;  // largest error / bound seen
  for (const Hyper& h : kHypers) {
    const AdamWCoeffs c = adamw_coeffs(h.lr, h.beta1, h.beta2, h.eps, h.wd, h.t);
    for (const Element& e : random_elements(static_cast<uint32_t>(h.t) + 99, 4000)) {
      for (bool decay : {false, true}) {
        float p = e.p, m = e.m, v = e.v;
        adamw_update(e.g, decay, c, p, m, v);
        const double g = e.g;
        const double md = h.beta1 * e.m + (1 - h.beta1) * g;
        const double vd = h.beta2 * e.v + (1 - h.beta2) * g * g;
        const double m_hat = md / (1 - std::pow(h.beta1, double(h.t)));
        const double v_hat = vd / (1 - std::pow(h.beta2, double(h.t)));
        const double decayed = decay ? e.p - h.lr * h.wd * e.p : double(e.p);
        const double upd = h.lr * m_hat / (std::sqrt(v_hat) + h.eps);
        const double pd = decayed - upd;
        const double dm_bound = 5 * u * (std::fabs(h.beta1 * e.m) + std::fabs((1 - h.beta1) * g));
        ASSERT_LE(std::fabs(m - md), 2 * dm_bound);
        ASSERT_LE(std::fabs(v - vd), 2 * 6 * u * vd);
        const double d = std::sqrt(v_hat) + h.eps;
        const double step_size = h.lr / (1 - std::pow(h.beta1, double(h.t)));
        const double bound = 2 * u * std::fabs(e.p) +
                             (decay ? 5 * u * std::fabs(h.lr * h.wd * e.p) : 0.0) +
                             12 * u * std::fabs(upd) + step_size * dm_bound / d;
        const double err = std::fabs(double(p) - pd);
        ASSERT_LE(err, 2 * bound) << "p " << p << " exact " << pd;
        worst = std::max(worst, err / bound);
      }
    }
  }
  EXPECT_GT(worst, 0.0);  // the fp32 path does round somewhere
  std::printf("AdamW fp32 vs double: worst error / derived bound = %.3f\n", worst);
}

TEST(AdamWMath, ClipFactor) {
  EXPECT_EQ(clip_factor(0.5, 1.0), 1.0f);
  EXPECT_FALSE(clip_applies(0.5, 1.0));
  EXPECT_EQ(clip_factor(5.0, 0.0), 1.0f);  // clipping off
  EXPECT_TRUE(clip_applies(4.0, 1.0));
  EXPECT_EQ(clip_factor(4.0, 1.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(clip_factor(1.0, 1.0), 1.0f);  // not above the limit
}

TEST(AdamWMath, LrScheduleAndDecayHelpersMatchTheOptimizer) {
  const model::AdamWConfig cfg{.lr = 1e-2,
                               .warmup_steps = 3,
                               .schedule = model::LrSchedule::kCosine,
                               .total_steps = 20,
                               .min_lr_ratio = 0.1};
  EXPECT_DOUBLE_EQ(model::adamw_lr_at(cfg, 0), 1e-2 / 3);
  EXPECT_DOUBLE_EQ(model::adamw_lr_at(cfg, 3), 1e-2);
  EXPECT_DOUBLE_EQ(model::adamw_lr_at(cfg, 20), 1e-3);
  EXPECT_TRUE(model::adamw_decays(model::ParamKind::kLinear));
  EXPECT_TRUE(model::adamw_decays(model::ParamKind::kRouter));
  EXPECT_FALSE(model::adamw_decays(model::ParamKind::kNorm));
  EXPECT_FALSE(model::adamw_decays(model::ParamKind::kBias));
}

}  // namespace
}  // namespace fp8rl::kernels::dm
