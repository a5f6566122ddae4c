// The pieces of a data-parallel update (docs/design/training.md "Trainer groups"): which sequences
// of a minibatch each rank takes, the weight hash ranks compare after every optimizer step, and the
// gathering of every rank's KV amax records so KV calibration sees the whole step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "model/kv_calibration.h"
#include "model/model.h"
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

// The hash of a sharded group's working copies (model::Model::WorkingStreams: codes, scales and
// bf16 bits, in that order; FNV-1a over bytes): equal streams give equal values on every rank.
uint64_t working_weights_hash(std::span<const uint8_t> codes, std::span<const float> scales,
                              std::span<const uint16_t> bf16);

// ZeRO-2's gather of the working copies (TrainBackend::gather_working): every rank's streams,
// concatenated in rank order (flat parameter order), from this rank's `mine`; each rank's stream
// sizes come from `model`'s layout and policy and the cut `bounds` (ranks + 1 offsets), the same
// on every rank. Three all-gathers named "<what> (FP8 codes)", "(block scales)", "(bf16)"; the
// collective's error is returned as is.
absl::StatusOr<model::Model::WorkingStreams> all_gather_working(
    Collectives& group, const model::Model& model, std::span<const int64_t> bounds,
    const model::Model::WorkingStreams& mine, std::string_view what);

// weight_hash over pieces given in order (e.g. fixed-size chunks downloaded from a device): the
// value equals weight_hash of the pieces concatenated, however they are cut.
class WeightHasher {
 public:
  void add(std::span<const float> piece);
  uint64_t value() const;

 private:
  uint64_t h_ = 1469598103934665603ull;  // FNV offset basis
  bool odd_ = false;                     // one float of an 8-byte word is pending
  uint32_t pending_ = 0;
};

// Exchanges the ranks' weight hashes; INTERNAL naming the ranks whose weights differ from rank 0's
// ("weights diverged across the trainer group"). `what` says after which update.
absl::Status check_same_weights(Collectives& group, std::span<const float> weights,
                                std::string_view what);
// The same with this rank's hash already computed (TrainBackend::master_fingerprint).
absl::Status check_same_weights(Collectives& group, uint64_t hash, std::string_view what);

// Replaces `records` (this rank's K/V amax records) with every rank's, rank 0's first. Every rank
// calls it; the percentile calibration does not depend on record order, so the scales equal those
// of one trainer that ran the whole step.
absl::Status gather_kv_records(Collectives& group, model::KvCalibrator* records);

}  // namespace fp8rl::train
