// Reuse of version payload buffers (see payload_pool.h).
#include "services/weight_sync/payload_pool.h"

#include <utility>

namespace fp8rl::weight_sync {

std::string PayloadPool::take(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t best = spares_.size();
  for (size_t i = 0; i < spares_.size(); ++i) {
    if (spares_[i].capacity() >= bytes &&
        (best == spares_.size() || spares_[i].capacity() < spares_[best].capacity())) {
      best = i;
    }
  }
  if (best == spares_.size()) return std::string();
  std::string out = std::move(spares_[best]);
  spares_.erase(spares_.begin() + static_cast<std::ptrdiff_t>(best));
  out.clear();  // keeps the capacity
  ++reused_;
  return out;
}

void PayloadPool::give(std::string payload) {
  if (payload.capacity() == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (spares_.size() < max_spares_) {
    spares_.push_back(std::move(payload));
    return;
  }
  // Full: keep the larger buffers (a growing model needs them).
  size_t smallest = 0;
  for (size_t i = 1; i < spares_.size(); ++i) {
    if (spares_[i].capacity() < spares_[smallest].capacity()) smallest = i;
  }
  if (!spares_.empty() && spares_[smallest].capacity() < payload.capacity()) {
    spares_[smallest] = std::move(payload);
  }
}

void PayloadPool::set_max_spares(size_t max_spares) {
  std::lock_guard<std::mutex> lock(mu_);
  max_spares_ = max_spares;
  if (spares_.size() > max_spares_) spares_.resize(max_spares_);
}

size_t PayloadPool::spares() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spares_.size();
}

uint64_t PayloadPool::reused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reused_;
}

}  // namespace fp8rl::weight_sync
