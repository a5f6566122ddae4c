// The NCCL backend of train/collectives.h, for trainers whose engine runs on a GPU (built only
// with CUDA and NCCL: FP8RL_HAVE_NCCL). Rank 0 creates the NCCL unique id and publishes it through
// the group's RendezvousStore ("<prefix>/nccl_id"); every rank then joins the communicator on the
// current CUDA device, nonblocking (ncclCommInitRankConfig with blocking = 0), polled until the
// group's timeout. The interface takes host arrays: each operation copies the data into a pinned
// staging buffer and up to a device buffer, runs the collective there on the backend's stream and
// copies the result back (a GPU engine with device-resident gradients would call a device-pointer
// entry point instead; not written yet). Completion is polled on an event recorded after the
// last copy, with the communicator's asynchronous error, until the group's deadline; a timeout or
// an NCCL error aborts the communicator and fails with DEADLINE_EXCEEDED / UNAVAILABLE naming the
// operation and the rank. Never run on a GPU. See docs/design/training.md "Trainer groups" and
// docs/design/sharding.md.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "train/collectives.h"

namespace fp8rl::train {

// GroupOptions.hostname is unused (NCCL finds its own transport). FAILED_PRECONDITION without a
// CUDA device; errors of NCCL name the call and its message.
absl::StatusOr<std::unique_ptr<Collectives>> make_nccl_collectives(
    std::shared_ptr<RendezvousStore> store, const GroupOptions& options);

}  // namespace fp8rl::train
