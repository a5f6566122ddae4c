// The Gloo backend of train/collectives.h: a full mesh of TCP pairs formed through the
// RendezvousStore, ring all-reduce (every element is reduced on one rank and then copied to the
// others, so all ranks hold bit-identical results), reduce-scatter as an all-to-all of the pieces
// followed by a sum in rank order on the owner, all-gather as Gloo's ring allgatherv.
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "train/collectives.h"

namespace fp8rl::train {
namespace {

using Clock = std::chrono::steady_clock;

// Gloo's store interface over ours, under the group's key prefix. Gloo's full-mesh connect sets
// one key per rank (its decimal rank) and waits for the others'; the ranks whose keys never came
// are remembered for the error message.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<RendezvousStore> store, std::string prefix,
                   std::chrono::milliseconds timeout)
      : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = store_->set(full(key), std::string(data.begin(), data.end()));
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = store_->get(full(key), timeout_);
    if (!v.ok()) {
      record_missing(key);
      throw std::runtime_error(std::string(v.status().message()));
    }
    return std::vector<char>(v->begin(), v->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (const std::string& key : keys) {
      const auto left =
          std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                   std::chrono::milliseconds(1));
      if (!store_->get(full(key), left).ok()) record_missing(key);
    }
    if (!missing().empty()) {
      throw std::runtime_error(
          absl::StrCat("rendezvous keys not set: ", absl::StrJoin(missing(), ", ")));
    }
  }

  std::vector<std::string> missing() {
    std::lock_guard<std::mutex> lock(mu_);
    return missing_;
  }

 private:
  std::string full(const std::string& key) const { return absl::StrCat(prefix_, "/", key); }
  void record_missing(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::find(missing_.begin(), missing_.end(), key) == missing_.end()) {
      missing_.push_back(key);
    }
  }

  std::shared_ptr<RendezvousStore> store_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::vector<std::string> missing_;  // guarded by mu_
};

// A failed Gloo operation as a status: a timeout is DEADLINE_EXCEEDED, anything else (a peer's
// connection closed) UNAVAILABLE; both say which operation on which rank.
absl::Status gloo_error(const std::exception& e, std::string_view what, int rank, int size) {
  const std::string message =
      absl::StrCat(std::string(what), " failed on rank ", rank, " of ", size, ": ", e.what());
  if (absl::StrContains(e.what(), "imed out")) return absl::DeadlineExceededError(message);
  return absl::UnavailableError(message);
}

class GlooCollectives final : public Collectives {
 public:
  GlooCollectives(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout)
      : context_(std::move(context)), timeout_(timeout) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  absl::Status all_reduce(std::span<float> data, ReduceOp op, std::string_view what) override {
    return reduce(data, op, what);
  }
  absl::Status all_reduce(std::span<double> data, ReduceOp op, std::string_view what) override {
    return reduce(data, op, what);
  }
  absl::Status all_reduce(std::span<int64_t> data, ReduceOp op, std::string_view what) override {
    return reduce(data, op, what);
  }

  absl::Status reduce_scatter(std::span<const float> input, std::span<float> output,
                              std::span<const int64_t> counts, std::string_view what) override {
    if (absl::Status s =
            check_pieces(counts, rank(), size(), std::ssize(input), std::ssize(output), what);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = usable(what); !s.ok() || input.empty()) return s;
    if (size() == 1) {
      std::copy(input.begin(), input.end(), output.begin());
      return absl::OkStatus();
    }
    const auto n = static_cast<size_t>(size());
    const size_t mine = output.size();
    // pieces[r * mine, (r + 1) * mine): rank r's terms of this rank's piece (one extra element so
    // the buffer is never null).
    std::vector<float> pieces(n * mine + 1);
    absl::Status s = run(what, input.size_bytes(), [&] {
      gloo::AlltoallvOptions opts(context_);
      // Gloo's options take mutable pointers; the input is only sent from.
      opts.setInput(const_cast<float*>(input.data()),
                    std::vector<int64_t>(counts.begin(), counts.end()));
      opts.setOutput(pieces.data(), std::vector<int64_t>(n, static_cast<int64_t>(mine)));
      opts.setTimeout(timeout_);
      gloo::alltoallv(opts);
    });
    if (!s.ok()) return s;
    for (size_t j = 0; j < mine; ++j) {
      float sum = pieces[j];
      for (size_t r = 1; r < n; ++r) sum += pieces[r * mine + j];
      output[j] = sum;
    }
    return absl::OkStatus();
  }

  absl::Status all_gather(std::span<const float> input, std::span<float> output,
                          std::span<const int64_t> counts, std::string_view what) override {
    return gather(input, output, counts, what);
  }
  absl::Status all_gather(std::span<const uint16_t> input, std::span<uint16_t> output,
                          std::span<const int64_t> counts, std::string_view what) override {
    return gather(input, output, counts, what);
  }
  absl::Status all_gather(std::span<const uint8_t> input, std::span<uint8_t> output,
                          std::span<const int64_t> counts, std::string_view what) override {
    return gather(input, output, counts, what);
  }

  CollectiveStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  // FAILED_PRECONDITION once an operation failed: the group must be formed again.
  absl::Status usable(std::string_view what) const {
    if (!failed_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(std::string(what), ": the group failed earlier and must be formed again"));
  }

  // Runs one Gloo operation `op` (which throws on failure) and counts `bytes` in the stats. A
  // failure marks the group failed.
  template <typename Op>
  absl::Status run(std::string_view what, size_t bytes, Op op) {
    if (absl::Status s = usable(what); !s.ok()) return s;
    const auto start = Clock::now();
    try {
      op();
    } catch (const std::exception& e) {
      failed_ = true;
      return gloo_error(e, what, rank(), size());
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.calls;
    stats_.bytes += static_cast<int64_t>(bytes);
    stats_.seconds += std::chrono::duration<double>(Clock::now() - start).count();
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status gather(std::span<const T> input, std::span<T> output,
                      std::span<const int64_t> counts, std::string_view what) {
    if (absl::Status s =
            check_pieces(counts, rank(), size(), std::ssize(output), std::ssize(input), what);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = usable(what); !s.ok()) return s;
    // This rank's piece goes in place first; allgatherv without an input then only moves the
    // other ranks' pieces into the output.
    int64_t offset = 0;
    for (int r = 0; r < rank(); ++r) offset += counts[static_cast<size_t>(r)];
    std::copy(input.begin(), input.end(), output.begin() + offset);
    if (output.empty() || size() == 1) return absl::OkStatus();
    return run(what, output.size_bytes(), [&] {
      gloo::AllgathervOptions opts(context_);
      opts.setOutput(output.data(), std::vector<size_t>(counts.begin(), counts.end()));
      opts.setTimeout(timeout_);
      gloo::allgatherv(opts);
    });
  }

  template <typename T>
  absl::Status reduce(std::span<T> data, ReduceOp op, std::string_view what) {
    if (absl::Status s = usable(what); !s.ok() || data.empty() || size() == 1) return s;
    return run(what, data.size_bytes(), [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data.data(), data.size());
      opts.setTimeout(timeout_);
      switch (op) {
        case ReduceOp::kSum:
          opts.setReduceFunction(
              static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
          break;
        case ReduceOp::kMin:
          opts.setReduceFunction(
              static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::min<T>));
          break;
        case ReduceOp::kMax:
          opts.setReduceFunction(
              static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<T>));
          break;
      }
      gloo::allreduce(opts);
    });
  }

  std::shared_ptr<gloo::Context> context_;
  const std::chrono::milliseconds timeout_;
  // Set by a failed operation; operations come from one thread at a time (the caller's, or a
  // BucketedAllReduce's communication thread), atomic so either may read it.
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;  // guards stats_ (stats() may be called from a metrics thread)
  CollectiveStats stats_;  // guarded by mu_
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collectives>> make_gloo_collectives(
    std::shared_ptr<RendezvousStore> store, const GroupOptions& options) {
  if (options.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_parallel: group size must be >= 1, got ", options.size));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: must be in [0, ", options.size, "), got ", options.rank));
  }
  if (store == nullptr) return absl::InvalidArgumentError("rendezvous store: required");
  GlooStoreAdapter adapter(std::move(store), options.prefix, options.timeout);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(options.timeout);
    context->connectFullMesh(adapter, device);
    return std::unique_ptr<Collectives>(
        std::make_unique<GlooCollectives>(std::move(context), options.timeout));
  } catch (const std::exception& e) {
    const std::vector<std::string> missing = adapter.missing();
    if (!missing.empty()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "trainer group '", options.prefix, "': rank ", options.rank, " waited ",
          options.timeout.count(), " ms for rank(s) ", absl::StrJoin(missing, ", "), " to join"));
    }
    return absl::UnavailableError(absl::StrCat("trainer group '", options.prefix, "': rank ",
                                               options.rank, " could not connect: ", e.what()));
  }
}

}  // namespace fp8rl::train
