// The NCCL backend of train/collectives.h (see collectives_nccl.h).
#include "train/collectives_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fp8rl::train {
namespace {

using Clock = std::chrono::steady_clock;

// How often a wait looks at the event and the communicator's error.
constexpr auto kPollInterval = std::chrono::microseconds(50);

absl::Status cuda_error(cudaError_t e, std::string_view what) {
  return absl::InternalError(absl::StrCat(std::string(what), ": ", cudaGetErrorString(e)));
}

absl::Status nccl_error(ncclResult_t r, std::string_view what) {
  return absl::UnavailableError(absl::StrCat(std::string(what), ": ", ncclGetErrorString(r)));
}

// A call that enqueued: with a nonblocking communicator NCCL may answer ncclInProgress.
bool enqueued(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

template <typename T>
ncclDataType_t nccl_type();
template <>
ncclDataType_t nccl_type<float>() {
  return ncclFloat32;
}
template <>
ncclDataType_t nccl_type<double>() {
  return ncclFloat64;
}
template <>
ncclDataType_t nccl_type<int64_t>() {
  return ncclInt64;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

bool all_equal(std::span<const int64_t> counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}

// Waits until `comm` has no call in progress (a nonblocking communicator's init or enqueue), its
// error, or the deadline: OK, the communicator's error, or DEADLINE_EXCEEDED. `what` names the
// call in errors.
absl::Status settle(ncclComm_t comm, Clock::time_point deadline, std::chrono::milliseconds timeout,
                    const std::string& what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) {
      return nccl_error(r, absl::StrCat(what, ": ncclCommGetAsyncError"));
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return nccl_error(state, what);
    if (Clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": timed out after ", timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

// Every operation: the host data is copied into a pinned staging buffer, up to a device buffer,
// the NCCL call runs on the backend's stream, the result goes back to the pinned buffer, an event
// is recorded after it, and the caller polls that event and the communicator's error until the
// group's deadline. Pinned memory keeps the copies asynchronous: a copy from pageable memory can
// block the host until the collective before it finishes, which would make a missing peer a hang
// instead of a timeout. A timeout or an NCCL error aborts the communicator at once.
class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(ncclComm_t comm, cudaStream_t stream, cudaEvent_t done, int rank, int size,
                  std::chrono::milliseconds timeout)
      : comm_(comm), stream_(stream), done_(done), rank_(rank), size_(size), timeout_(timeout) {}
  ~NcclCollectives() override {
    if (comm_ != nullptr) {
      // A healthy nonblocking communicator is finalized (which may be in progress) before it is
      // destroyed; one that failed, or does not finalize within the timeout, is aborted.
      bool finalized = false;
      if (!failed_ && enqueued(ncclCommFinalize(comm_))) {
        finalized = settle(comm_, Clock::now() + timeout_, timeout_, "ncclCommFinalize").ok();
      }
      finalized ? ncclCommDestroy(comm_) : ncclCommAbort(comm_);
    }
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (device_ != nullptr) cudaFree(device_);
    if (host_ != nullptr) cudaFreeHost(host_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status all_reduce(std::span<float> data, ReduceOp op, std::string_view what) override {
    return reduce(data, op, what);
  }
  absl::Status all_reduce(std::span<double> data, ReduceOp op, std::string_view what) override {
    return reduce(data, op, what);
  }
  absl::Status all_reduce(std::span<int64_t> data, ReduceOp op, std::string_view what) override {
    return reduce(data, op, what);
  }

  // Equal counts: ncclReduceScatter; otherwise one ncclReduce per non-empty piece to its owner,
  // in one NCCL group.
  absl::Status reduce_scatter(std::span<const float> input, std::span<float> output,
                              std::span<const int64_t> counts, std::string_view what) override {
    if (absl::Status s =
            check_pieces(counts, rank_, size_, std::ssize(input), std::ssize(output), what);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = usable(what); !s.ok() || input.empty()) return s;
    const auto start = Clock::now();
    const size_t whole = input.size_bytes(), piece = output.size_bytes();
    if (absl::Status s = reserve(whole + piece, whole, what); !s.ok()) return s;
    std::memcpy(host_, input.data(), whole);
    float* in = static_cast<float*>(device_);
    float* out = in + input.size();
    if (absl::Status s = copy(device_, host_, whole, cudaMemcpyHostToDevice, what); !s.ok()) {
      return s;
    }
    ncclResult_t r = ncclSuccess;
    if (all_equal(counts)) {
      r = ncclReduceScatter(in, out, output.size(), ncclFloat32, ncclSum, comm_, stream_);
    } else {
      r = ncclGroupStart();
      int64_t offset = 0;
      for (int root = 0; root < size_ && enqueued(r); ++root) {
        const int64_t n = counts[static_cast<size_t>(root)];
        if (n > 0) {
          r = ncclReduce(in + offset, out, static_cast<size_t>(n), ncclFloat32, ncclSum, root,
                         comm_, stream_);
        }
        offset += n;
      }
      const ncclResult_t end = ncclGroupEnd();
      if (enqueued(r)) r = end;
    }
    if (absl::Status s = after_enqueue(r, start, what); !s.ok()) return s;
    if (absl::Status s = copy(host_, out, piece, cudaMemcpyDeviceToHost, what); !s.ok()) return s;
    if (absl::Status s = wait(start, what); !s.ok()) return s;
    std::memcpy(output.data(), host_, piece);
    count(whole, start);
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
  std::string where(std::string_view what) const {
    return absl::StrCat(std::string(what), " failed on rank ", rank_, " of ", size_);
  }

  absl::Status usable(std::string_view what) const {
    if (!failed_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(std::string(what), ": the group failed earlier and must be formed again"));
  }

  // Aborts the communicator now (its kernels stop) and marks the group failed.
  absl::Status fail(absl::Status status) {
    failed_ = true;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    return status;
  }

  // Grows the device and pinned host staging buffers to at least the given sizes.
  absl::Status reserve(size_t device_bytes, size_t host_bytes, std::string_view what) {
    if (device_bytes > device_bytes_) {
      if (device_ != nullptr) cudaFree(device_);
      device_ = nullptr;
      device_bytes_ = 0;
      if (cudaError_t e = cudaMalloc(&device_, device_bytes); e != cudaSuccess) {
        return cuda_error(
            e, absl::StrCat(std::string(what), ": cudaMalloc of ", device_bytes, " staging bytes"));
      }
      device_bytes_ = device_bytes;
    }
    if (host_bytes > host_bytes_) {
      if (host_ != nullptr) cudaFreeHost(host_);
      host_ = nullptr;
      host_bytes_ = 0;
      if (cudaError_t e = cudaMallocHost(&host_, host_bytes); e != cudaSuccess) {
        return cuda_error(e, absl::StrCat(std::string(what), ": cudaMallocHost of ", host_bytes,
                                          " pinned staging bytes"));
      }
      host_bytes_ = host_bytes;
    }
    return absl::OkStatus();
  }

  absl::Status copy(void* to, const void* from, size_t bytes, cudaMemcpyKind kind,
                    std::string_view what) {
    if (bytes == 0) return absl::OkStatus();
    if (cudaError_t e = cudaMemcpyAsync(to, from, bytes, kind, stream_); e != cudaSuccess) {
      return cuda_error(
          e, absl::StrCat(std::string(what),
                          kind == cudaMemcpyHostToDevice ? ": copy to device" : ": copy to host"));
    }
    return absl::OkStatus();
  }

  // After an NCCL call (or group) returned `r`: an error fails the group; in progress (a
  // nonblocking communicator) waits until NCCL has enqueued it, within the deadline.
  absl::Status after_enqueue(ncclResult_t r, Clock::time_point start, std::string_view what) {
    if (!enqueued(r)) return fail(nccl_error(r, where(what)));
    if (r == ncclInProgress) {
      if (absl::Status s = settle(comm_, start + timeout_, timeout_, where(what)); !s.ok()) {
        return fail(std::move(s));
      }
    }
    return absl::OkStatus();
  }

  // Records the event after the work enqueued so far and polls it, and the communicator's error,
  // until the deadline (start + timeout).
  absl::Status wait(Clock::time_point start, std::string_view what) {
    if (cudaError_t e = cudaEventRecord(done_, stream_); e != cudaSuccess) {
      return fail(cuda_error(e, absl::StrCat(where(what), ": cudaEventRecord")));
    }
    const auto deadline = start + timeout_;
    for (;;) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return fail(cuda_error(q, where(what)));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        return fail(nccl_error(async, where(what)));
      }
      if (Clock::now() > deadline) {
        return fail(absl::DeadlineExceededError(
            absl::StrCat(where(what), ": timed out after ", timeout_.count(), " ms")));
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  void count(size_t bytes, Clock::time_point start) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.calls;
    stats_.bytes += static_cast<int64_t>(bytes);
    stats_.seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }

  template <typename T>
  absl::Status reduce(std::span<T> data, ReduceOp op, std::string_view what) {
    if (absl::Status s = usable(what); !s.ok() || data.empty()) return s;
    const auto start = Clock::now();
    const size_t bytes = data.size_bytes();
    if (absl::Status s = reserve(bytes, bytes, what); !s.ok()) return s;
    std::memcpy(host_, data.data(), bytes);
    if (absl::Status s = copy(device_, host_, bytes, cudaMemcpyHostToDevice, what); !s.ok()) {
      return s;
    }
    if (absl::Status s = after_enqueue(ncclAllReduce(device_, device_, data.size(), nccl_type<T>(),
                                                     nccl_op(op), comm_, stream_),
                                       start, what);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = copy(host_, device_, bytes, cudaMemcpyDeviceToHost, what); !s.ok()) {
      return s;
    }
    if (absl::Status s = wait(start, what); !s.ok()) return s;
    std::memcpy(data.data(), host_, bytes);
    count(bytes, start);
    return absl::OkStatus();
  }

  // Moves bytes (any T): equal counts ncclAllGather in place; otherwise one in-place
  // ncclBroadcast per non-empty piece from its owner, in one NCCL group.
  template <typename T>
  absl::Status gather(std::span<const T> input, std::span<T> output,
                      std::span<const int64_t> counts, std::string_view what) {
    if (absl::Status s =
            check_pieces(counts, rank_, size_, std::ssize(output), std::ssize(input), what);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = usable(what); !s.ok() || output.empty()) return s;
    const auto start = Clock::now();
    const size_t whole = output.size_bytes();
    if (absl::Status s = reserve(whole, whole, what); !s.ok()) return s;
    std::vector<size_t> offsets(static_cast<size_t>(size_) + 1, 0);  // bytes
    for (int r = 0; r < size_; ++r) {
      offsets[static_cast<size_t>(r) + 1] =
          offsets[static_cast<size_t>(r)] +
          static_cast<size_t>(counts[static_cast<size_t>(r)]) * sizeof(T);
    }
    auto* dev = static_cast<uint8_t*>(device_);
    const size_t mine = offsets[static_cast<size_t>(rank_)];
    std::memcpy(static_cast<uint8_t*>(host_) + mine, input.data(), input.size_bytes());
    if (absl::Status s = copy(dev + mine, static_cast<uint8_t*>(host_) + mine, input.size_bytes(),
                              cudaMemcpyHostToDevice, what);
        !s.ok()) {
      return s;
    }
    ncclResult_t r = ncclSuccess;
    if (all_equal(counts)) {
      r = ncclAllGather(dev + mine, dev, input.size_bytes(), ncclUint8, comm_, stream_);
    } else {
      r = ncclGroupStart();
      for (int root = 0; root < size_ && enqueued(r); ++root) {
        const size_t at = offsets[static_cast<size_t>(root)];
        const size_t n = offsets[static_cast<size_t>(root) + 1] - at;
        if (n > 0) r = ncclBroadcast(dev + at, dev + at, n, ncclUint8, root, comm_, stream_);
      }
      const ncclResult_t end = ncclGroupEnd();
      if (enqueued(r)) r = end;
    }
    if (absl::Status s = after_enqueue(r, start, what); !s.ok()) return s;
    if (absl::Status s = copy(host_, dev, whole, cudaMemcpyDeviceToHost, what); !s.ok()) return s;
    if (absl::Status s = wait(start, what); !s.ok()) return s;
    std::memcpy(output.data(), host_, whole);
    count(whole, start);
    return absl::OkStatus();
  }

  ncclComm_t comm_;  // null after an abort
  cudaStream_t stream_;
  cudaEvent_t done_;  // recorded after each operation's last copy
  const int rank_, size_;
  const std::chrono::milliseconds timeout_;
  // Staging buffers, grown on demand. Operations come from one thread at a time (the caller's, or
  // a BucketedAllReduce's communication thread), so these and comm_ need no lock.
  void* device_ = nullptr;
  size_t device_bytes_ = 0;
  void* host_ = nullptr;  // pinned (cudaMallocHost)
  size_t host_bytes_ = 0;
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;  // guards stats_ (stats() may be called from a metrics thread)
  CollectiveStats stats_;  // guarded by mu_
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collectives>> make_nccl_collectives(
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
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError("NCCL trainer group: no CUDA device");
  }
  const std::string key = absl::StrCat(options.prefix, "/nccl_id");
  ncclUniqueId id;
  if (options.rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return nccl_error(r, "ncclGetUniqueId");
    }
    if (absl::Status s = store->set(key, std::string(id.internal, sizeof(id.internal))); !s.ok()) {
      return s;
    }
  } else {
    absl::StatusOr<std::string> value = store->get(key, options.timeout);
    if (!value.ok()) {
      return absl::DeadlineExceededError(absl::StrCat("trainer group '", options.prefix, "': rank ",
                                                      options.rank,
                                                      " waited for rank(s) 0 to publish the NCCL "
                                                      "id: ",
                                                      value.status().message()));
    }
    if (value->size() != sizeof(id.internal)) {
      return absl::InternalError(
          absl::StrCat(key, ": ", value->size(), " bytes, want ", sizeof(id.internal)));
    }
    std::copy(value->begin(), value->end(), id.internal);
  }
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return cuda_error(e, "cudaStreamCreate");
  }
  cudaEvent_t done = nullptr;
  if (cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming); e != cudaSuccess) {
    cudaStreamDestroy(stream);
    return cuda_error(e, "cudaEventCreate");
  }
  // Nonblocking init, polled until the group's timeout: a rank that never joins ends in
  // DEADLINE_EXCEEDED, not a hang. Every later call on the communicator may then also answer
  // ncclInProgress (NcclCollectives::after_enqueue).
  const std::string what =
      absl::StrCat("trainer group '", options.prefix, "': ncclCommInitRankConfig (rank ",
                   options.rank, " of ", options.size, ")");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  absl::Status status;
  if (ncclResult_t r = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
      !enqueued(r)) {
    status = nccl_error(r, what);
  } else {
    status = settle(comm, Clock::now() + options.timeout, options.timeout, what);
  }
  if (!status.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaEventDestroy(done);
    cudaStreamDestroy(stream);
    return status;
  }
  return std::unique_ptr<Collectives>(std::make_unique<NcclCollectives>(
      comm, stream, done, options.rank, options.size, options.timeout));
}

}  // namespace fp8rl::train
