// Wall-clock helpers shared by the services, the training layer and the benchmarks.
#pragma once

#include <chrono>

namespace fp8rl {

// Seconds of std::chrono::steady_clock elapsed since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace fp8rl
