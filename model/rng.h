// A small, fully specified random generator (xoshiro256** seeded by splitmix64): the same seed
// gives the same numbers on every platform and standard library, which std::*_distribution does
// not guarantee. Used for initialisation and sampling.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace fp8rl::model {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A stream seed derived from (seed, index): different indices give independent streams.
inline uint64_t derive_seed(uint64_t seed, uint64_t index) {
  uint64_t s = seed ^ (0xD1B54A32D192ED03ull * (index + 1));
  return splitmix64(s);
}

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) {
    uint64_t s = seed;
    for (auto& w : s_) w = splitmix64(s);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // The four state words, so another device can continue the same stream (and hand it back).
  std::array<uint64_t, 4> state() const { return {s_[0], s_[1], s_[2], s_[3]}; }
  void set_state(const std::array<uint64_t, 4>& s) {
    for (int i = 0; i < 4; ++i) s_[i] = s[i];
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Standard normal (Box-Muller, one value per call).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace fp8rl::model
