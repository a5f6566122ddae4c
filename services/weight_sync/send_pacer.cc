// Link-rate pacing for emulated hosts (see send_pacer.h).
#include "services/weight_sync/send_pacer.h"

#include <algorithm>
#include <thread>

namespace fp8rl::weight_sync {

void SendPacer::take(uint64_t bytes) {
  if (rate_ <= 0) return;
  std::chrono::steady_clock::time_point done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto start = std::max(std::chrono::steady_clock::now(), free_at_);
    free_at_ = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(static_cast<double>(bytes) / rate_));
    done = free_at_;
  }
  std::this_thread::sleep_until(done);
}

}  // namespace fp8rl::weight_sync
