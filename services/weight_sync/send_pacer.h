// A token bucket that holds every chunk a service sends to the rate of one network link shared by
// all its streams, for benchmarks that emulate one host per process on a single machine
// (bench/weight_sync/fanout_bench.cc: weight sync's NIC carries N copies with --fanout direct,
// each relay's carries one with chain). Not a production flow control: gRPC's own does that.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace fp8rl::weight_sync {

class SendPacer {
 public:
  // bytes_per_second <= 0: unlimited (take() returns at once).
  explicit SendPacer(double bytes_per_second) : rate_(bytes_per_second) {}

  // Reserves the link for `bytes` after everything reserved before, and sleeps until they would
  // have left it (so a chunk is sent when a link of this rate would have finished sending it).
  void take(uint64_t bytes);

 private:
  const double rate_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point free_at_{};  // guarded by mu_: the link is busy until then
};

}  // namespace fp8rl::weight_sync
