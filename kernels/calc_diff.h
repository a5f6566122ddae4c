// calc_diff: DeepGEMM's scale-free distance between two results of the same computation, the
// accuracy measure every GEMM test and benchmark reports (bars in kernels/tolerances.h).
#pragma once

#include <cstddef>
#include <limits>

namespace fp8rl::kernels {

// 1 - 2*sum(x*y) / (sum(x*x) + sum(y*y)), summed in float64. 0 when x == y, about
// 0.5 * |x - y|^2 / |x|^2 when close, 1 when orthogonal, 2 when x == -y; unchanged when both are
// scaled by the same factor. x and y are indexable containers of numbers (std::vector<float>,
// std::vector<double>, ...). Returns NaN when the sizes differ or both are all zero, so that a
// test's EXPECT_LT(calc_diff(...), bar) fails instead of passing on a broken comparison.
template <typename X, typename Y>
double calc_diff(const X& x, const Y& y) {
  if (x.size() != y.size()) return std::numeric_limits<double>::quiet_NaN();
  double xy = 0.0, xx = 0.0, yy = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double a = static_cast<double>(x[i]);
    const double b = static_cast<double>(y[i]);
    xy += a * b;
    xx += a * a;
    yy += b * b;
  }
  return 1.0 - 2.0 * xy / (xx + yy);
}

}  // namespace fp8rl::kernels
