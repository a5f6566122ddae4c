// The backend-independent parts of train/collectives.h: the in-process store, the piece-count
// check and the one-rank group.
#include "train/collectives.h"

#include <algorithm>
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
  absl::Status reduce_scatter(std::span<const float> input, std::span<float> output,
                              std::span<const int64_t> counts, std::string_view what) override {
    return copy(input, output, counts, input.size(), output.size(), what);
  }
  absl::Status all_gather(std::span<const float> input, std::span<float> output,
                          std::span<const int64_t> counts, std::string_view what) override {
    return copy(input, output, counts, output.size(), input.size(), what);
  }
  absl::Status all_gather(std::span<const uint16_t> input, std::span<uint16_t> output,
                          std::span<const int64_t> counts, std::string_view what) override {
    return copy(input, output, counts, output.size(), input.size(), what);
  }
  absl::Status all_gather(std::span<const uint8_t> input, std::span<uint8_t> output,
                          std::span<const int64_t> counts, std::string_view what) override {
    return copy(input, output, counts, output.size(), input.size(), what);
  }
  CollectiveStats stats() const override { return {}; }

 private:
  // One rank owns the whole array: its piece is the array.
  template <typename T>
  static absl::Status copy(std::span<const T> input, std::span<T> output,
                           std::span<const int64_t> counts, size_t whole, size_t piece,
                           std::string_view what) {
    if (absl::Status s = check_pieces(counts, 0, 1, static_cast<int64_t>(whole),
                                      static_cast<int64_t>(piece), what);
        !s.ok()) {
      return s;
    }
    std::copy(input.begin(), input.end(), output.begin());
    return absl::OkStatus();
  }
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

absl::Status check_pieces(std::span<const int64_t> counts, int rank, int size,
                          int64_t whole_elements, int64_t piece_elements, std::string_view what) {
  const std::string w(what);
  if (std::ssize(counts) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(w, ": counts needs one entry per rank (", size, "), got ", counts.size()));
  }
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t n = counts[static_cast<size_t>(r)];
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(w, ": counts[", r, "] = ", n, " < 0"));
    }
    total += n;
  }
  if (whole_elements != total) {
    return absl::InvalidArgumentError(absl::StrCat(w, ": the whole array has ", whole_elements,
                                                   " elements, counts sum to ", total));
  }
  const int64_t mine = counts[static_cast<size_t>(rank)];
  if (piece_elements != mine) {
    return absl::InvalidArgumentError(absl::StrCat(w, ": rank ", rank, "'s piece has ",
                                                   piece_elements, " elements, counts[", rank,
                                                   "] = ", mine));
  }
  return absl::OkStatus();
}

std::unique_ptr<Collectives> make_single_rank_collectives() {
  return std::make_unique<SingleRank>();
}

}  // namespace fp8rl::train
