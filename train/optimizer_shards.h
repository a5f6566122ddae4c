// Sharded optimizer checkpoints (docs/design/sharding.md "Sharded checkpoints"): under
// trainer.shard grads_optimizer each rank holds the AdamW moments of its own shard only, so each
// rank writes them to its own file and a manifest records the cut. Loading re-cuts: a rank reads
// the part of every old shard that overlaps its new range, so a checkpoint of N ranks resumes on
// M ranks (or on one unsharded trainer).
//
// Layout inside a checkpoint folder (train/checkpoint.h):
//   optimizer_shards/manifest.json   {"format": "fp8rl-optimizer-shards", "ranks": N,
//                                     "num_params": P, "step": S, "bounds": [0, ..., P],
//                                     "files": [{"name", "begin", "end", "hash"}, ...]}
//   optimizer_shards/rank-R-of-N.safetensors
//                                    F32 "adamw.exp_avg", "adamw.exp_avg_sq" [end - begin] of
//                                    rank R's range; metadata "step", "begin", "end"
// "hash" is train::weight_hash (FNV-1a, data_parallel.h) of exp_avg followed by exp_avg_sq, as 16
// hex digits: a truncated file fails to open, a changed byte fails the hash.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/optimizer.h"

namespace fp8rl::train {

inline constexpr char kOptimizerShardsDir[] = "optimizer_shards";
inline constexpr char kOptimizerShardsManifest[] = "manifest.json";

// "rank-<rank>-of-<ranks>.safetensors".
std::string optimizer_shard_file_name(int rank, int ranks);

struct OptimizerShardManifest {
  int64_t num_params = 0;
  int64_t step = 0;
  std::vector<int64_t> bounds;   // ranks + 1 offsets: rank r held [bounds[r], bounds[r + 1])
  std::vector<uint64_t> hashes;  // per rank, of its file's exp_avg then exp_avg_sq
  int ranks() const { return static_cast<int>(bounds.size()) - 1; }
};

// The hash a manifest records for a shard's moments.
uint64_t optimizer_shard_hash(const model::AdamW::RangeState& state);

// Writes one rank's shard (`state` holds the moments of [begin, begin + state.m.size())) to `path`
// atomically; returns its hash.
absl::StatusOr<uint64_t> write_optimizer_shard(const std::string& path,
                                               const model::AdamW::RangeState& state,
                                               int64_t begin);

// The manifest as JSON text (OptimizerShardManifest layout above).
std::string optimizer_shard_manifest_json(const OptimizerShardManifest& manifest);

// Reads `<dir>/optimizer_shards/manifest.json` and checks it against a model of `num_params`:
// INVALID_ARGUMENT naming the file and the field when it is malformed, its bounds are not
// 0 = b_0 <= ... <= b_N = num_params, or it was written for another parameter count.
absl::StatusOr<OptimizerShardManifest> read_optimizer_shard_manifest(const std::string& dir,
                                                                     int64_t num_params);

// The moments of [begin, end) and the step count, read from every shard file of `manifest`
// (in `dir`) that overlaps the range (reshard on load). Each file read is checked whole against
// the manifest: its range and step metadata and its hash. NOT_FOUND naming a missing file,
// INVALID_ARGUMENT naming one that is truncated, changed or does not match; INVALID_ARGUMENT for a
// range outside [0, num_params].
absl::StatusOr<model::AdamW::RangeState> read_optimizer_range(
    const std::string& dir, const OptimizerShardManifest& manifest, int64_t begin, int64_t end);

}  // namespace fp8rl::train
