// The in-memory rendezvous store behind fp8rl.v1.Rendezvous (see rendezvous_service.h).
#include "services/coordinator/rendezvous_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fp8rl::coordinator {

grpc::Status RendezvousImpl::Set(grpc::ServerContext* context,
                                 const v1::RendezvousSetRequest* request,
                                 v1::RendezvousSetResponse*) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  if (request->key().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "key: required");
  }
  if (request->value().size() > kRendezvousMaxValueBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("value: ", request->value().size(), " bytes is over the ",
                                     kRendezvousMaxValueBytes, "-byte limit"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (values_.insert_or_assign(request->key(), request->value()).second) {
      order_.push_back(request->key());
    }
    while (order_.size() > kRendezvousMaxKeys) {
      values_.erase(order_.front());
      order_.pop_front();
    }
  }
  cv_.notify_all();
  return grpc::Status::OK;
}

grpc::Status RendezvousImpl::Get(grpc::ServerContext* context,
                                 const v1::RendezvousGetRequest* request,
                                 v1::RendezvousGetResponse* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  if (request->key().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "key: required");
  }
  if (request->wait_ms() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("wait_ms: must be >= 0, got ", request->wait_ms()));
  }
  const auto wait = std::min(std::chrono::milliseconds(request->wait_ms()), kRendezvousMaxWait);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  const std::string group = request->key().substr(0, request->key().find('/'));
  std::unique_lock<std::mutex> lock(mu_);
  // Wakes at least every 100 ms to notice a cancelled call (client gone).
  while (!values_.contains(request->key())) {
    if (auto it = abandoned_.find(group); it != abandoned_.end()) {
      return grpc::Status(grpc::StatusCode::ABORTED,
                          absl::StrCat("trainer group '", group, "' abandoned: ", it->second));
    }
    if (context->IsCancelled() || std::chrono::steady_clock::now() >= deadline) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("rendezvous key '", request->key(), "' not set within ",
                                       wait.count(), " ms"));
    }
    cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
  response->set_value(values_[request->key()]);
  return grpc::Status::OK;
}

void RendezvousImpl::abandon(const std::string& group_id, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abandoned_.emplace(group_id, reason).second) abandoned_order_.push_back(group_id);
    while (abandoned_order_.size() > kRendezvousMaxAbandoned) {
      abandoned_.erase(abandoned_order_.front());
      abandoned_order_.pop_front();
    }
  }
  cv_.notify_all();
}

size_t RendezvousImpl::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.size();
}

}  // namespace fp8rl::coordinator
