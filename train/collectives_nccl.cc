// The NCCL backend of train/collectives.h (see collectives_nccl.h).
#include "train/collectives_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace fp8rl::train {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status cuda_error(cudaError_t e, std::string_view what) {
  return absl::InternalError(absl::StrCat(std::string(what), ": ", cudaGetErrorString(e)));
}

absl::Status nccl_error(ncclResult_t r, std::string_view what) {
  return absl::UnavailableError(absl::StrCat(std::string(what), ": ", ncclGetErrorString(r)));
}

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

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(ncclComm_t comm, cudaStream_t stream, int rank, int size,
                  std::chrono::milliseconds timeout)
      : comm_(comm), stream_(stream), rank_(rank), size_(size), timeout_(timeout) {}
  ~NcclCollectives() override {
    if (device_ != nullptr) cudaFree(device_);
    if (comm_ != nullptr) failed_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
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
  CollectiveStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  template <typename T>
  absl::Status reduce(std::span<T> data, ReduceOp op, std::string_view what) {
    if (failed_) {
      return absl::FailedPreconditionError(
          absl::StrCat(std::string(what), ": the group failed earlier and must be formed again"));
    }
    if (data.empty()) return absl::OkStatus();
    const auto start = Clock::now();
    const size_t bytes = data.size_bytes();
    if (bytes > device_bytes_) {
      if (device_ != nullptr) cudaFree(device_);
      device_ = nullptr;
      device_bytes_ = 0;
      if (cudaError_t e = cudaMalloc(&device_, bytes); e != cudaSuccess) {
        return cuda_error(e, absl::StrCat(std::string(what), ": cudaMalloc"));
      }
      device_bytes_ = bytes;
    }
    if (cudaError_t e =
            cudaMemcpyAsync(device_, data.data(), bytes, cudaMemcpyHostToDevice, stream_);
        e != cudaSuccess) {
      return cuda_error(e, absl::StrCat(std::string(what), ": copy to device"));
    }
    if (ncclResult_t r = ncclAllReduce(device_, device_, data.size(), nccl_type<T>(), nccl_op(op),
                                       comm_, stream_);
        r != ncclSuccess) {
      failed_ = true;
      return nccl_error(r,
                        absl::StrCat(std::string(what), " failed on rank ", rank_, " of ", size_));
    }
    if (cudaError_t e =
            cudaMemcpyAsync(data.data(), device_, bytes, cudaMemcpyDeviceToHost, stream_);
        e != cudaSuccess) {
      return cuda_error(e, absl::StrCat(std::string(what), ": copy to host"));
    }
    // Poll rather than block, so a peer that never arrives ends in a timeout, not a hang.
    const auto deadline = start + timeout_;
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) return cuda_error(q, what);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        failed_ = true;
        return nccl_error(
            async, absl::StrCat(std::string(what), " failed on rank ", rank_, " of ", size_));
      }
      if (Clock::now() > deadline) {
        failed_ = true;
        return absl::DeadlineExceededError(absl::StrCat(std::string(what), " failed on rank ",
                                                        rank_, " of ", size_, ": timed out after ",
                                                        timeout_.count(), " ms"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.calls;
    stats_.bytes += static_cast<int64_t>(bytes);
    stats_.seconds += std::chrono::duration<double>(Clock::now() - start).count();
    return absl::OkStatus();
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  const int rank_, size_;
  const std::chrono::milliseconds timeout_;
  void* device_ = nullptr;  // staging buffer, grown on demand (calling thread only)
  size_t device_bytes_ = 0;
  bool failed_ = false;    // calling thread only
  mutable std::mutex mu_;  // guards stats_
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
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, options.size, id, options.rank); r != ncclSuccess) {
    cudaStreamDestroy(stream);
    return nccl_error(
        r, absl::StrCat("ncclCommInitRank (rank ", options.rank, " of ", options.size, ")"));
  }
  return std::unique_ptr<Collectives>(
      std::make_unique<NcclCollectives>(comm, stream, options.rank, options.size, options.timeout));
}

}  // namespace fp8rl::train
