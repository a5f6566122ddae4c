// The backend-independent parts of train/collectives.h: the in-process store and the one-rank
// group.
#include "train/collectives.h"

#include <condition_variable>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace fp8rl::train {
namespace {

class MemoryStore final : public RendezvousStore {
 public:
  absl::Status set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
    }
    cv_.notify_all();
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> get(const std::string& key,
                                  std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return values_.contains(key); })) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous key '", key, "' not set within ", timeout.count(), " ms"));
    }
    return values_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;  // guarded by mu_
};

class SingleRank final : public Collectives {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status all_reduce(std::span<float>, ReduceOp, std::string_view) override {
    return absl::OkStatus();
  }
  absl::Status all_reduce(std::span<double>, ReduceOp, std::string_view) override {
    return absl::OkStatus();
  }
  absl::Status all_reduce(std::span<int64_t>, ReduceOp, std::string_view) override {
    return absl::OkStatus();
  }
  CollectiveStats stats() const override { return {}; }
};

}  // namespace

std::shared_ptr<RendezvousStore> make_memory_store() { return std::make_shared<MemoryStore>(); }

std::string_view backend_name(CollectiveBackend backend) {
  return backend == CollectiveBackend::kNccl ? "nccl" : "gloo";
}

absl::StatusOr<CollectiveBackend> backend_for_device(std::string_view device,
                                                     std::string_view field) {
  if (device == "cpu") return CollectiveBackend::kGloo;
  if (device == "cuda") return CollectiveBackend::kNccl;
  if (device.starts_with("cuda:")) {
    const std::string_view index = device.substr(5);
    if (!index.empty() && index.size() <= 4 &&
        index.find_first_not_of("0123456789") == std::string_view::npos) {
      return CollectiveBackend::kNccl;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(field), ": must be cpu, cuda or cuda:<index>, got '", std::string(device), "'"));
}

std::unique_ptr<Collectives> make_single_rank_collectives() {
  return std::make_unique<SingleRank>();
}

}  // namespace fp8rl::train
