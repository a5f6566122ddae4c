// ArenaPlan: aligned bump reservation under a byte budget.
#include "engine/arena.h"

#include "absl/strings/str_cat.h"

namespace fp8rl::engine {

absl::StatusOr<int64_t> ArenaPlan::reserve(int64_t bytes, const std::string& what) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative size"));
  const int64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  if (size > budget_ - used_) {
    return absl::ResourceExhaustedError(absl::StrCat("GPU memory budget: ", what, " needs ", size,
                                                     " bytes, ", budget_ - used_, " of ", budget_,
                                                     " left"));
  }
  const int64_t at = used_;
  used_ += size;
  for (auto& [name, n] : regions_) {
    if (name == what) {
      n += size;
      return at;
    }
  }
  regions_.emplace_back(what, size);
  return at;
}

}  // namespace fp8rl::engine
