// Collectives for data-parallel trainer groups (docs/design/training.md "Trainer groups"): the few
// operations a group of trainers needs (in-place all-reduce of float, double and int64 arrays with
// sum, min or max; reduce-scatter of float sums and all-gather of float, bf16 bit patterns and
// E4M3 codes into per-rank pieces, for sharded groups: docs/design/sharding.md), behind one
// interface with two backends: Gloo over TCP for CPU trainers (make_gloo_collectives) and NCCL
// for GPU trainers (train/collectives_nccl.h, built with CUDA).
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
  // Payload bytes handed to the operations (elements x element size): all-reduce its array,
  // reduce-scatter its whole input, all-gather its whole output.
  int64_t bytes = 0;
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

  // Pieces: counts[r] >= 0 is the element count of rank r's piece, the same on every rank;
  // piece r is [offset(r), offset(r) + counts[r]) of the whole array, offset(r) = counts[0] + ...
  // + counts[r - 1]. A rank may own an empty piece. Wrong counts or span sizes are
  // INVALID_ARGUMENT naming `what` and the mismatch (check_pieces).
  //
  // Reduce-scatter (sum): `input` is this rank's whole array (sum(counts) elements); `output`
  // (counts[rank()] elements) receives the sum over ranks of piece rank() of their inputs. Gloo
  // adds each element's rank terms in rank order, ((x_0 + x_1) + x_2) + ..., whatever the
  // counts, so the result does not depend on how an array is cut into pieces or buckets; with 2
  // ranks that equals all_reduce bit for bit (a + b = b + a). NCCL adds in its own order.
  virtual absl::Status reduce_scatter(std::span<const float> input, std::span<float> output,
                                      std::span<const int64_t> counts, std::string_view what) = 0;
  // All-gather: every rank's `input` (counts[rank()] elements) lands as piece r of `output`
  // (sum(counts) elements) on every rank. Bytes are moved, never converted: uint16_t carries
  // bf16 bit patterns, uint8_t E4M3 codes.
  virtual absl::Status all_gather(std::span<const float> input, std::span<float> output,
                                  std::span<const int64_t> counts, std::string_view what) = 0;
  virtual absl::Status all_gather(std::span<const uint16_t> input, std::span<uint16_t> output,
                                  std::span<const int64_t> counts, std::string_view what) = 0;
  virtual absl::Status all_gather(std::span<const uint8_t> input, std::span<uint8_t> output,
                                  std::span<const int64_t> counts, std::string_view what) = 0;
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

// The argument check every backend runs first for reduce_scatter / all_gather: counts has `size`
// entries, each >= 0; the whole array has sum(counts) elements and this rank's piece
// counts[rank]. INVALID_ARGUMENT "<what>: ..." naming the count or span that is wrong.
absl::Status check_pieces(std::span<const int64_t> counts, int rank, int size,
                          int64_t whole_elements, int64_t piece_elements, std::string_view what);

// A one-rank group without any transport: every all-reduce leaves the data as it is;
// reduce-scatter and all-gather copy the input to the output.
std::unique_ptr<Collectives> make_single_rank_collectives();

}  // namespace fp8rl::train
