// Per-worker choice between full and delta pushes (see push_choice.h).
#include "services/weight_sync/push_choice.h"

namespace fp8rl::weight_sync {

PushChooser::Choice PushChooser::choose() {
  const std::optional<double>& full = estimate_[static_cast<int>(PushKind::kFull)];
  const std::optional<double>& delta = estimate_[static_cast<int>(PushKind::kDelta)];
  Choice c;
  if (!delta) {
    c = {PushKind::kDelta, /*probe=*/true};
  } else if (!full) {
    c = {PushKind::kFull, /*probe=*/true};
  } else {
    const PushKind cheaper = *delta < *full ? PushKind::kDelta : PushKind::kFull;
    const PushKind other = cheaper == PushKind::kDelta ? PushKind::kFull : PushKind::kDelta;
    c = last_ == cheaper && streak_ >= kReprobeAfter ? Choice{other, true} : Choice{cheaper, false};
  }
  streak_ = c.kind == last_ ? streak_ + 1 : 1;
  last_ = c.kind;
  return c;
}

void PushChooser::observed(PushKind kind, double seconds, uint64_t full_bytes) {
  if (full_bytes == 0 || seconds < 0) return;
  const double per_byte = seconds / static_cast<double>(full_bytes);
  std::optional<double>& e = estimate_[static_cast<int>(kind)];
  e = e ? (1 - kSmoothing) * *e + kSmoothing * per_byte : per_byte;
}

}  // namespace fp8rl::weight_sync
