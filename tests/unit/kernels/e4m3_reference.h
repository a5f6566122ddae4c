// An independent, deliberately slow E4M3 reference for tests: values from the bit fields in
// float64 and encoding by searching for the nearest value, so it shares no code or trick with
// kernels/formats.cc.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>

namespace fp8rl::kernels::testing {

// Value of an E4M3 code from its fields (S.EEEE.MMM, bias 7), in float64.
inline double e4m3_reference_value(uint8_t code) {
  const int sign = code >> 7;
  const int exp = (code >> 3) & 0xF;
  const int man = code & 0x7;
  if (exp == 15 && man == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag =
      exp == 0 ? std::ldexp(static_cast<double>(man), -9) : std::ldexp(1.0 + man / 8.0, exp - 7);
  return sign ? -mag : mag;
}

// Nearest E4M3 code to x: saturating to +-448, ties to the even code, NaN -> 0x7F, the sign of
// x kept (also for results that are zero).
inline uint8_t e4m3_reference_encode(double x) {
  if (std::isnan(x)) return 0x7F;
  static const std::array<double, 0x7F> kValues = [] {
    std::array<double, 0x7F> v{};
    for (int c = 0; c < 0x7F; ++c) v[c] = e4m3_reference_value(static_cast<uint8_t>(c));
    return v;
  }();
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  uint8_t best = 0;
  double best_err = a;
  for (uint8_t c = 1; c <= 0x7E; ++c) {
    const double err = std::fabs(kValues[c] - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return sign | best;
}

}  // namespace fp8rl::kernels::testing
