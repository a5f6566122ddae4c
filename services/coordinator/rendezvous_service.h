// fp8rl.v1.Rendezvous: the key-value store trainer groups meet through (docs/design/training.md
// "Trainer groups"). Values live in memory: a group is formed again (new group id) after a
// coordinator restart anyway. Keys are limited in size and number so a misbehaving client cannot
// grow it without bound: the oldest group's keys go first.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "common/service/auth.h"
#include "fp8rl/v1/rendezvous.grpc.pb.h"

namespace fp8rl::coordinator {

// Longest a Get waits server-side; clients wait longer by calling again.
inline constexpr std::chrono::milliseconds kRendezvousMaxWait{60000};
inline constexpr size_t kRendezvousMaxKeys = 4096;
inline constexpr size_t kRendezvousMaxValueBytes = 1 << 20;
inline constexpr size_t kRendezvousMaxAbandoned = 256;

class RendezvousImpl final : public v1::Rendezvous::Service {
 public:
  grpc::Status Set(grpc::ServerContext* context, const v1::RendezvousSetRequest* request,
                   v1::RendezvousSetResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::RendezvousGetRequest* request,
                   v1::RendezvousGetResponse* response) override;

  size_t size();
  // Gives up on forming the group `group_id`: every Get of one of its keys ("<group_id>/...")
  // that waits now or later answers ABORTED "trainer group '<group_id>' abandoned: <reason>", so
  // the ranks that did join stop waiting for the one that could not (instead of waiting out the
  // group timeout). The last kRendezvousMaxAbandoned groups are remembered.
  void abandon(const std::string& group_id, const std::string& reason);
  // Every call then needs one of these tokens (the cluster token); null: open.
  void require_tokens(std::shared_ptr<const service::TokenSet> tokens) {
    auth_ = std::move(tokens);
  }

 private:
  std::shared_ptr<const service::TokenSet> auth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;     // guarded by mu_
  std::deque<std::string> order_;                 // guarded by mu_; keys, oldest first
  std::map<std::string, std::string> abandoned_;  // guarded by mu_; group id -> reason
  std::deque<std::string> abandoned_order_;       // guarded by mu_; group ids, oldest first
};

}  // namespace fp8rl::coordinator
