// Payload buffers of evicted versions, kept for the next upload to be received into. A fresh
// 125 MB std::string per version costs ~30k page faults (zero-filling every 4 KiB page) before a
// byte is received; a reused one has its pages already mapped (docs/perf.md "Weight sync").
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace fp8rl::weight_sync {

class PayloadPool {
 public:
  // Keeps at most `max_spares` buffers (0: reuse nothing, every take() is a new string).
  explicit PayloadPool(size_t max_spares) : max_spares_(max_spares) {}

  // An empty string with capacity >= `bytes` when a spare has it (the smallest such), else an
  // empty new string.
  std::string take(uint64_t bytes);
  // Keeps `payload`'s allocation for a later take() when there is room; drops it otherwise.
  void give(std::string payload);

  // Changes the limit; 0 drops every spare (benchmarks compare with and without reuse).
  void set_max_spares(size_t max_spares);

  size_t spares() const;
  uint64_t reused() const;  // take() calls served from a spare

 private:
  // Guards max_spares_, spares_ and reused_.
  mutable std::mutex mu_;
  size_t max_spares_;                // guarded by mu_
  std::vector<std::string> spares_;  // guarded by mu_
  uint64_t reused_ = 0;              // guarded by mu_
};

}  // namespace fp8rl::weight_sync
