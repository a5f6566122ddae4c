// Sampling seeds of the RL loop (see sample_seeds.h).
#include "rl/sample_seeds.h"

namespace fp8rl::rl {
namespace {

// splitmix64's finalizer (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", 2014): the increment is 2^64 / golden ratio, the multipliers and shifts are the
// published mixing constants. Any change re-seeds every job.
constexpr uint64_t kSplitMixIncrement = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kSplitMixMultiplier1 = 0xBF58476D1CE4E5B9ull;
constexpr uint64_t kSplitMixMultiplier2 = 0x94D049BB133111EBull;

uint64_t splitmix64(uint64_t x) {
  x += kSplitMixIncrement;
  x = (x ^ (x >> 30)) * kSplitMixMultiplier1;
  x = (x ^ (x >> 27)) * kSplitMixMultiplier2;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t sample_seed(uint64_t job_seed, int64_t step, int64_t prompt, int64_t sample) {
  uint64_t h = splitmix64(job_seed);
  h = splitmix64(h ^ static_cast<uint64_t>(step));
  h = splitmix64(h ^ static_cast<uint64_t>(prompt));
  return splitmix64(h ^ static_cast<uint64_t>(sample));
}

uint64_t validation_sample_seed(uint64_t job_seed, int64_t step, int64_t prompt) {
  return sample_seed(job_seed, -step - 1, prompt, 0);
}

}  // namespace fp8rl::rl
