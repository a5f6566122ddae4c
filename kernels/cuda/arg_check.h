// Host-side argument checks shared by the CUDA ops' entry points (internal to kernels/cuda): each
// returns InvalidArgumentError naming the function and the argument, before any launch.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fp8rl::kernels::cuda::internal {

inline constexpr int64_t kMaxElements = int64_t{1} << 40;

// Every dimension in [1, 2^40).
inline absl::Status positive(const char* fn,
                             std::initializer_list<std::pair<const char*, int64_t>> dims) {
  for (auto [name, v] : dims) {
    if (v <= 0 || v >= kMaxElements) {
      return absl::InvalidArgumentError(
          absl::StrCat(fn, ": ", name, " must be in [1, 2^40), got ", v));
    }
  }
  return absl::OkStatus();
}

// Every pointer non-null.
inline absl::Status non_null(const char* fn,
                             std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  for (auto [name, p] : ptrs) {
    if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(fn, ": ", name, " is null"));
  }
  return absl::OkStatus();
}

}  // namespace fp8rl::kernels::cuda::internal
