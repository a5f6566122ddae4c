// How weight sync spreads a version over N generation workers (docs/design/weight-sync-fanout.md):
// `direct` sends every worker its own copy (the sender's bytes grow with N); `chain` and `tree:K`
// send one copy to the first worker(s), and each worker relays the chunks to its successors as
// they land. RelayTopology is the order weight sync keeps: who takes versions from whom.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fp8rl::weight_sync {

struct Fanout {
  enum class Kind { kDirect, kChain, kTree };
  Kind kind = Kind::kDirect;
  int k = 1;  // children per node (1 for chain)
  bool relays() const { return kind != Kind::kDirect; }
};

inline constexpr int kMaxTreeFanout = 64;

// "direct", "chain" or "tree:K" with K in [1, 64] (tree:1 is a chain). InvalidArgument otherwise:
// "--fanout: must be direct, chain or tree:K with K in [1, 64], got 'x'".
absl::StatusOr<Fanout> parse_fanout(std::string_view text);
std::string fanout_name(const Fanout& fanout);

// The relay order: workers that can relay, in the order they first subscribed. Position i (from
// 0) takes versions from position parent(i) = i / K - 1 (weight sync itself when negative), so
// positions 0..K-1 are fed by weight sync, a chain is K = 1, and a parent always joined before its
// children (no cycles). Removing a worker moves everyone behind it up one position: its successors
// are re-attached to its predecessor. Thread-safe.
class RelayTopology {
 public:
  explicit RelayTopology(Fanout fanout) : fanout_(fanout) {}

  struct Upstream {
    std::string worker_id;
    std::string address;
  };
  // Adds `worker` (at the end; a known worker keeps its place and takes the new address) and
  // returns where it takes versions from: nullopt for weight sync itself.
  std::optional<Upstream> join(const std::string& worker, const std::string& address);
  // Drops `worker` (it died or stalled); false when it was not in the order.
  bool remove(const std::string& worker);
  // Worker ids in relay order.
  std::vector<std::string> order() const;

 private:
  struct Member {
    std::string worker_id;
    std::string address;
  };
  const Fanout fanout_;
  mutable std::mutex mu_;
  std::vector<Member> members_;  // guarded by mu_
};

}  // namespace fp8rl::weight_sync
