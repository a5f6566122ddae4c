// Fan-out modes and the relay order (see fanout.h).
#include "services/weight_sync/fanout.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fp8rl::weight_sync {

absl::StatusOr<Fanout> parse_fanout(std::string_view text) {
  if (text == "direct") return Fanout{Fanout::Kind::kDirect, 1};
  if (text == "chain") return Fanout{Fanout::Kind::kChain, 1};
  int k = 0;
  if (text.starts_with("tree:") && absl::SimpleAtoi(std::string(text.substr(5)), &k) && k >= 1 &&
      k <= kMaxTreeFanout) {
    return Fanout{Fanout::Kind::kTree, k};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--fanout: must be direct, chain or tree:K with K in [1, ", kMaxTreeFanout,
                   "], got '", std::string(text), "'"));
}

std::string fanout_name(const Fanout& fanout) {
  switch (fanout.kind) {
    case Fanout::Kind::kDirect:
      return "direct";
    case Fanout::Kind::kChain:
      return "chain";
    case Fanout::Kind::kTree:
      return absl::StrCat("tree:", fanout.k);
  }
  return "direct";
}

std::optional<RelayTopology::Upstream> RelayTopology::join(const std::string& worker,
                                                           const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(members_.begin(), members_.end(),
                         [&](const Member& m) { return m.worker_id == worker; });
  if (it == members_.end()) {
    members_.push_back({worker, address});
    it = members_.end() - 1;
  } else {
    it->address = address;
  }
  const int64_t position = it - members_.begin();
  const int64_t k = fanout_.kind == Fanout::Kind::kChain ? 1 : fanout_.k;
  const int64_t parent = position / k - 1;
  if (parent < 0) return std::nullopt;
  const Member& p = members_[static_cast<size_t>(parent)];
  return Upstream{p.worker_id, p.address};
}

bool RelayTopology::remove(const std::string& worker) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::erase_if(members_, [&](const Member& m) { return m.worker_id == worker; }) > 0;
}

std::vector<std::string> RelayTopology::order() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(members_.size());
  for (const Member& m : members_) out.push_back(m.worker_id);
  return out;
}

}  // namespace fp8rl::weight_sync
