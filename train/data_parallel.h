// The pieces of a data-parallel update (docs/design.md "Trainer groups"): which sequences of a
// minibatch each rank takes, the weight hash ranks compare after every optimizer step, and the
// gathering of every rank's KV amax records so KV calibration sees the whole step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "model/kv_calibration.h"
#include "train/collectives.h"

namespace fp8rl::train {

// Contiguous shares of sequences [0, lengths.size()) for `ranks` ranks, balanced by tokens (the
// forward and backward cost grows with a sequence's length): rank r takes the sequences whose
// token midpoint falls in [r * T / ranks, (r + 1) * T / ranks), T the total. Returns ranks + 1
// boundaries (rank r: [out[r], out[r + 1])); a rank may get no sequence when there are fewer
// sequences than ranks.
std::vector<int64_t> token_balanced_shares(std::span<const int64_t> lengths, int ranks);

// A 64-bit hash of the fp32 weights' bit patterns (FNV-1a over 8-byte words): equal weights give
// equal hashes on every rank; any bit flip changes it with high probability.
uint64_t weight_hash(std::span<const float> weights);

// Exchanges the ranks' weight hashes; INTERNAL naming the ranks whose weights differ from rank 0's
// ("weights diverged across the trainer group"). `what` says after which update.
absl::Status check_same_weights(Collectives& group, std::span<const float> weights,
                                std::string_view what);

// Replaces `records` (this rank's K/V amax records) with every rank's, rank 0's first. Every rank
// calls it; the percentile calibration does not depend on record order, so the scales equal those
// of one trainer that ran the whole step.
absl::Status gather_kv_records(Collectives& group, model::KvCalibrator* records);

}  // namespace fp8rl::train
