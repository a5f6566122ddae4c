// Shard modes and the block-aligned cut of the parameter space (see shard.h).
#include "train/shard.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace fp8rl::train {
namespace {

constexpr int64_t kBlockRows = 128;  // FP8 weight blocks are 128x128 (kernels/quantize.h)

// Every offset a cut may fall at, ascending, ending with the total.
std::vector<int64_t> allowed_cuts(const model::ParamLayout& layout) {
  std::vector<int64_t> cuts;
  for (const model::ParamInfo& p : layout.params()) {
    cuts.push_back(p.offset);
    if (p.shape.size() == 2) {
      for (int64_t row = kBlockRows; row < p.shape[0]; row += kBlockRows) {
        cuts.push_back(p.offset + row * p.shape[1]);
      }
    }
  }
  cuts.push_back(layout.total());
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

}  // namespace

std::string_view shard_mode_name(ShardMode mode) {
  switch (mode) {
    case ShardMode::kNone:
      return "none";
    case ShardMode::kGradsOptimizer:
      return "grads_optimizer";
    case ShardMode::kParams:
      return "params";
  }
  return "none";
}

absl::StatusOr<ShardMode> parse_shard_mode(std::string_view text, std::string_view field) {
  for (ShardMode m : {ShardMode::kNone, ShardMode::kGradsOptimizer, ShardMode::kParams}) {
    if (text == shard_mode_name(m)) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat(std::string(field),
                                                 ": must be none, grads_optimizer or params, got '",
                                                 std::string(text), "'"));
}

int64_t ShardLayout::largest() const {
  int64_t m = 0;
  for (int r = 0; r < ranks(); ++r) m = std::max(m, size(r));
  return m;
}

std::vector<int64_t> ShardLayout::counts() const {
  std::vector<int64_t> c;
  for (int r = 0; r < ranks(); ++r) c.push_back(size(r));
  return c;
}

absl::StatusOr<ShardLayout> shard_parameters(const model::ParamLayout& layout, int ranks) {
  if (ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("shard ranks: must be >= 1, got ", ranks));
  }
  const std::vector<int64_t> cuts = allowed_cuts(layout);
  const int64_t total = layout.total();
  ShardLayout out;
  out.bounds.assign(static_cast<size_t>(ranks) + 1, total);
  out.bounds[0] = 0;
  for (int r = 1; r < ranks; ++r) {
    // target = r * total / ranks, compared exactly as target_num / ranks.
    const int64_t target_num = static_cast<int64_t>(r) * total;
    // The first allowed point at or above the target, and the one before it (below the target).
    auto it = std::lower_bound(cuts.begin(), cuts.end(), (target_num + ranks - 1) / ranks);
    int64_t best = it == cuts.end() ? total : *it;
    if (it != cuts.begin()) {
      const int64_t below = *(it - 1);
      // |below * ranks - target_num| <= |best * ranks - target_num|: the lower wins a tie.
      if (target_num - below * ranks <= best * ranks - target_num) best = below;
    }
    out.bounds[static_cast<size_t>(r)] = std::max(best, out.bounds[static_cast<size_t>(r) - 1]);
  }
  return out;
}

}  // namespace fp8rl::train
