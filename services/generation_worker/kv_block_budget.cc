// Block accounting of the paged KV cache (see kv_block_budget.h).
#include "services/generation_worker/kv_block_budget.h"

#include <algorithm>

namespace fp8rl::generation {

KvBlockBudget::KvBlockBudget(int64_t block_size, int64_t total_blocks)
    : block_size_(std::max<int64_t>(1, block_size)),
      total_blocks_(std::max<int64_t>(1, total_blocks)) {}

int64_t KvBlockBudget::blocks_for(int64_t tokens) const {
  return tokens <= 0 ? 0 : (tokens + block_size_ - 1) / block_size_;
}

bool KvBlockBudget::try_reserve(int64_t blocks) {
  if (blocks < 0 || blocks > free_blocks()) return false;
  used_ += blocks;
  return true;
}

void KvBlockBudget::release(int64_t blocks) { used_ = std::max<int64_t>(0, used_ - blocks); }

double KvBlockBudget::usage() const {
  return static_cast<double>(used_) / static_cast<double>(total_blocks_);
}

}  // namespace fp8rl::generation
