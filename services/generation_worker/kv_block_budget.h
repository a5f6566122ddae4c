// The generation worker's KV-cache budget in blocks (paged KV): each running sequence holds
// ceil((prompt + max_new_tokens) / block_size) blocks from admission to its end, so continuous
// batching admits a sample only while enough blocks are free. The blocks are those of the
// inference backend's paged pool: the device pool's pages on the CUDA path, the CPU backend's host
// pool (sized to this budget, grown as blocks are held) on the CPU path (docs/design/engine.md).
#pragma once

#include <cstdint>

namespace fp8rl::generation {

class KvBlockBudget {
 public:
  // `block_size` tokens per block (>= 1), `total_blocks` in the pool (>= 1).
  KvBlockBudget(int64_t block_size, int64_t total_blocks);

  // Blocks a sequence of `tokens` positions occupies: ceil(tokens / block_size).
  int64_t blocks_for(int64_t tokens) const;
  // Takes `blocks` when that many are free; false (and nothing taken) otherwise.
  bool try_reserve(int64_t blocks);
  // Gives back blocks taken by try_reserve.
  void release(int64_t blocks);
  void release_all() { used_ = 0; }

  int64_t block_size() const { return block_size_; }
  int64_t total_blocks() const { return total_blocks_; }
  int64_t used_blocks() const { return used_; }
  int64_t free_blocks() const { return total_blocks_ - used_; }
  // used / total, in [0, 1].
  double usage() const;

 private:
  int64_t block_size_;
  int64_t total_blocks_;
  int64_t used_ = 0;
};

}  // namespace fp8rl::generation
