// Full or delta, per worker, from what each kind measurably cost that worker. A delta moves ~10x
// fewer bytes but costs an encode on weight sync and a decode on the worker; on a fast link (or
// with few workers sharing one encode) that can take longer than sending the full version
// (docs/perf.md "Weight sync"). So each Subscribe stream times its pushes from the moment it
// starts one to the worker's ack and keeps, per kind, a running estimate of those seconds per
// full-version byte; it sends whichever kind is cheaper and, to notice when the link or the load
// changes, sends the other kind once after kReprobeAfter choices in a row
// (docs/design/weight-sync.md "Choosing full or delta per worker").
#pragma once

#include <cstdint>
#include <optional>

namespace fp8rl::weight_sync {

enum class PushKind { kFull = 0, kDelta = 1 };

class PushChooser {
 public:
  // Same-kind choices in a row after which the other kind is tried once.
  static constexpr int kReprobeAfter = 8;
  // Weight of a new observation in the running estimate.
  static constexpr double kSmoothing = 0.5;

  struct Choice {
    PushKind kind = PushKind::kFull;
    // Not the cheaper kind by the estimates: sent to measure it (first delta, or a re-probe).
    bool probe = false;
  };

  // The kind to push when a delta is possible. No delta measured yet: a delta (probe). No full
  // push measured yet: full. Otherwise the cheaper estimate, except every kReprobeAfter + 1-th
  // choice, which is the other kind.
  Choice choose();

  // A push of `kind` of a version of `full_bytes` (> 0) took `seconds` (>= 0) from the start of
  // the push to the worker's ack.
  void observed(PushKind kind, double seconds, uint64_t full_bytes);

  // Estimated seconds per full-version byte of a push of `kind` (nullopt: never measured).
  std::optional<double> seconds_per_byte(PushKind kind) const {
    return estimate_[static_cast<int>(kind)];
  }

 private:
  std::optional<double> estimate_[2];
  PushKind last_ = PushKind::kFull;
  int streak_ = 0;  // choices of last_ in a row
};

}  // namespace fp8rl::weight_sync
