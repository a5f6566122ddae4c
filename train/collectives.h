// Collectives for data-parallel trainer groups (docs/design/training.md "Trainer groups"): the few
// operations a group of trainers needs (in-place all-reduce of float, double and int64 arrays with
// sum, min or max), behind one interface with two backends: Gloo over TCP for CPU trainers
// (make_gloo_collectives) and NCCL for GPU trainers (train/collectives_nccl.h, built with CUDA).
//
// Every rank calls the same operations in the same order with the same element counts. Every
// rank ends with bit-identical results (the backends reduce each element once and broadcast it),
// so ranks that apply the same optimizer step to the same all-reduced gradient keep identical
// weights. An operation that does not complete within the group's timeout (a rank died or hangs)
// fails with DEADLINE_EXCEEDED or UNAVAILABLE naming the operation; after any failure the group is
// unusable and must be formed again.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fp8rl::train {

enum class ReduceOp { kSum, kMin, kMax };

// What the group moved so far (per-rank metrics: all-reduce time and bytes).
struct CollectiveStats {
  int64_t calls = 0;
  int64_t bytes = 0;  // payload bytes handed to all-reduce (elements x element size)
  double seconds = 0;
};

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place all-reduce; `what` names the operation in errors ("gradient all-reduce").
  virtual absl::Status all_reduce(std::span<float> data, ReduceOp op, std::string_view what) = 0;
  virtual absl::Status all_reduce(std::span<double> data, ReduceOp op, std::string_view what) = 0;
  virtual absl::Status all_reduce(std::span<int64_t> data, ReduceOp op, std::string_view what) = 0;
  virtual CollectiveStats stats() const = 0;
};

// The key-value store a group meets through (docs/design/training.md "Trainer groups": the
// coordinator serves one over gRPC). Keys are set once; get waits until the key exists or the
// timeout passes (DEADLINE_EXCEEDED naming the key).
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  virtual absl::Status set(const std::string& key, const std::string& value) = 0;
  virtual absl::StatusOr<std::string> get(const std::string& key,
                                          std::chrono::milliseconds timeout) = 0;
};

// An in-process store (tests, and a one-process group of threads).
std::shared_ptr<RendezvousStore> make_memory_store();

struct GroupOptions {
  int rank = 0;
  int size = 1;
  // Keys of this group are "<prefix>/..." so one store serves many groups (job id and attempt).
  std::string prefix;
  // Bounds forming the group and every later operation.
  std::chrono::milliseconds timeout{60000};
  // Interface address other ranks reach this one at ("127.0.0.1" on loopback; a pod's address).
  std::string hostname = "127.0.0.1";
};

// Forms a Gloo group of `size` ranks over TCP (every rank calls this at once); returns when all
// ranks are connected. INVALID_ARGUMENT for a rank outside [0, size); DEADLINE_EXCEEDED naming the
// ranks that did not arrive within the timeout.
absl::StatusOr<std::unique_ptr<Collectives>> make_gloo_collectives(
    std::shared_ptr<RendezvousStore> store, const GroupOptions& options);

// Which collective library a trainer's group uses, chosen by the device its engine runs on.
enum class CollectiveBackend { kGloo, kNccl };
std::string_view backend_name(CollectiveBackend backend);  // "gloo", "nccl"

// "cpu" -> Gloo; "cuda" or "cuda:<index>" -> NCCL (train/collectives_nccl.h). INVALID_ARGUMENT
// naming `field` for anything else ("--device: must be cpu, cuda or cuda:<index>, got 'tpu'").
absl::StatusOr<CollectiveBackend> backend_for_device(std::string_view device,
                                                     std::string_view field = "device");

// A one-rank group without any transport: every all-reduce leaves the data as it is.
std::unique_ptr<Collectives> make_single_rank_collectives();

}  // namespace fp8rl::train
