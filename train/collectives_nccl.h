// The NCCL backend of train/collectives.h, for trainers whose engine runs on a GPU (built only
// with CUDA and NCCL: FP8RL_HAVE_NCCL). Rank 0 creates the NCCL unique id and publishes it through
// the group's RendezvousStore ("<prefix>/nccl_id"); every rank then joins the communicator on the
// current CUDA device. The interface takes host arrays: each all-reduce copies the data to a
// device buffer, reduces it there on the backend's stream and copies it back (a GPU engine with
// device-resident gradients would call a device-pointer entry point instead; not written yet).
// A reduction that has not finished within the timeout aborts the communicator and fails with
// DEADLINE_EXCEEDED. See docs/design/training.md "Trainer groups".
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
