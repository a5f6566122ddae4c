// Bookkeeping of the CUDA backend's one device allocation: a byte budget carved into aligned,
// named regions (weights, KV pool, step scratch) that live as long as the backend. Host
// arithmetic only (offsets), so it is tested without a device; cuda_backend.cc adds the base
// pointer of its single cudaMalloc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fp8rl::engine {

class ArenaPlan {
 public:
  static constexpr int64_t kAlign = 256;  // cudaMalloc's alignment; cuBLASLt needs 16

  explicit ArenaPlan(int64_t budget_bytes) : budget_(budget_bytes) {}

  // Offset of a new region of `bytes` (rounded up to kAlign). ResourceExhausted when the budget
  // cannot hold it: "GPU memory budget: <what> needs N bytes, M of B left".
  absl::StatusOr<int64_t> reserve(int64_t bytes, const std::string& what);
  // Bytes left for later regions.
  int64_t remaining() const { return budget_ - used_; }
  int64_t used() const { return used_; }
  int64_t budget() const { return budget_; }
  // Bytes reserved under each name so far (summed), in first-reservation order.
  const std::vector<std::pair<std::string, int64_t>>& regions() const { return regions_; }

 private:
  int64_t budget_;
  int64_t used_ = 0;
  std::vector<std::pair<std::string, int64_t>> regions_;
};

}  // namespace fp8rl::engine
