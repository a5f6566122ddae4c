// Sharded trainer groups (docs/design/sharding.md): the shard modes a group can run in and which
// contiguous part of the flat parameter space (model::ParamLayout order) each rank owns. A cut
// never falls inside an FP8 128x128 weight block, so a rank can re-quantize its own shard with
// the same scales one trainer would compute.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/params.h"

namespace fp8rl::train {

// What the ranks of a group shard (trainer.shard in a job config, the trainer's --shard):
//   kNone            every rank holds everything (data parallel only).
//   kGradsOptimizer  ZeRO-2: fp32 master, AdamW moments and gradients for the rank's shard only;
//                    working weights whole on every rank.
//   kParams          ZeRO-3: the working weights sharded too, all-gathered layer by layer.
enum class ShardMode { kNone, kGradsOptimizer, kParams };

std::string_view shard_mode_name(ShardMode mode);  // "none", "grads_optimizer", "params"
// INVALID_ARGUMENT "<field>: must be none, grads_optimizer or params, got '<text>'".
absl::StatusOr<ShardMode> parse_shard_mode(std::string_view text, std::string_view field);

// Rank r owns elements [bounds[r], bounds[r + 1]) of the flat parameter buffer.
struct ShardLayout {
  std::vector<int64_t> bounds;  // ranks + 1 offsets: 0 = bounds[0] <= ... <= bounds[ranks] = total

  int ranks() const { return static_cast<int>(bounds.size()) - 1; }
  int64_t begin(int r) const { return bounds[static_cast<size_t>(r)]; }
  int64_t end(int r) const { return bounds[static_cast<size_t>(r) + 1]; }
  int64_t size(int r) const { return end(r) - begin(r); }
  int64_t largest() const;              // elements of the largest shard
  std::vector<int64_t> counts() const;  // size(r) for every r: Collectives piece counts
};

// Cuts the parameters of `layout` into `ranks` contiguous shards. Cuts may fall only at a
// tensor's start and, inside a 2-D tensor [rows, cols], at every 128th row (offset + 128 k cols):
// row-major, the 128 rows of a block row hold whole 128x128 blocks, so no FP8 weight block (nor
// the transposed block of the dgrad) spans two ranks; 1-D tensors (norms, biases) are never cut.
// Cut r (r = 1 .. ranks - 1) is the allowed point nearest to r * total / ranks (the lower one on
// a tie), never before cut r - 1; a rank owns nothing when there are fewer pieces than ranks.
// INVALID_ARGUMENT for ranks < 1.
absl::StatusOr<ShardLayout> shard_parameters(const model::ParamLayout& layout, int ranks);

}  // namespace fp8rl::train
