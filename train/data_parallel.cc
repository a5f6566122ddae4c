// Share split, weight hash and KV-record gathering of a data-parallel update (see
// data_parallel.h).
#include "train/data_parallel.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fp8rl::train {

std::vector<int64_t> token_balanced_shares(std::span<const int64_t> lengths, int ranks) {
  std::vector<int64_t> out(static_cast<size_t>(ranks) + 1, 0);
  int64_t total = 0;
  for (int64_t n : lengths) total += n;
  // Twice the midpoint, to stay in integers: sequence i belongs to rank r when
  // r * 2T <= ranks * (2 * before_i + n_i) < (r + 1) * 2T.
  int64_t before = 0;
  int rank = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t mid2 = static_cast<int64_t>(ranks) * (2 * before + lengths[i]);
    while (rank + 1 < ranks && mid2 >= static_cast<int64_t>(rank + 1) * 2 * total) {
      out[static_cast<size_t>(++rank)] = static_cast<int64_t>(i);
    }
    before += lengths[i];
  }
  for (int r = rank + 1; r <= ranks; ++r) out[static_cast<size_t>(r)] = std::ssize(lengths);
  return out;
}

namespace {
constexpr uint64_t kFnvPrime = 1099511628211ull;
}  // namespace

void WeightHasher::add(std::span<const float> piece) {
  size_t i = 0;
  if (odd_ && !piece.empty()) {
    uint32_t second;
    std::memcpy(&second, piece.data(), sizeof(second));
    // The 8-byte word as memcpy of two consecutive floats reads it (little-endian).
    const uint64_t word = static_cast<uint64_t>(pending_) | (static_cast<uint64_t>(second) << 32);
    h_ = (h_ ^ word) * kFnvPrime;
    odd_ = false;
    i = 1;
  }
  for (; i + 2 <= piece.size(); i += 2) {
    uint64_t word;
    std::memcpy(&word, piece.data() + i, sizeof(word));
    h_ = (h_ ^ word) * kFnvPrime;
  }
  if (i < piece.size()) {
    std::memcpy(&pending_, piece.data() + i, sizeof(pending_));
    odd_ = true;
  }
}

uint64_t WeightHasher::value() const {
  // An odd count ends with one 4-byte word.
  return odd_ ? (h_ ^ pending_) * kFnvPrime : h_;
}

uint64_t weight_hash(std::span<const float> weights) {
  WeightHasher h;
  h.add(weights);
  return h.value();
}

absl::StatusOr<model::Model::WorkingStreams> all_gather_working(
    Collectives& group, const model::Model& model, std::span<const int64_t> bounds,
    const model::Model::WorkingStreams& mine, std::string_view what) {
  std::vector<int64_t> codes, scales, bf16;
  int64_t total[3] = {0, 0, 0};
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    absl::StatusOr<model::Model::WorkingCounts> n = model.working_counts(bounds[r], bounds[r + 1]);
    if (!n.ok()) return n.status();
    codes.push_back(n->codes);
    scales.push_back(n->scales);
    bf16.push_back(n->bf16);
    total[0] += n->codes;
    total[1] += n->scales;
    total[2] += n->bf16;
  }
  model::Model::WorkingStreams all;
  all.codes.resize(static_cast<size_t>(total[0]));
  all.scales.resize(static_cast<size_t>(total[1]));
  all.bf16.resize(static_cast<size_t>(total[2]));
  if (absl::Status s =
          group.all_gather(std::span<const uint8_t>(mine.codes), std::span<uint8_t>(all.codes),
                           codes, absl::StrCat(std::string(what), " (FP8 codes)"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          group.all_gather(std::span<const float>(mine.scales), std::span<float>(all.scales),
                           scales, absl::StrCat(std::string(what), " (block scales)"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          group.all_gather(std::span<const uint16_t>(mine.bf16), std::span<uint16_t>(all.bf16),
                           bf16, absl::StrCat(std::string(what), " (bf16)"));
      !s.ok()) {
    return s;
  }
  return all;
}

uint64_t working_weights_hash(std::span<const uint8_t> codes, std::span<const float> scales,
                              std::span<const uint16_t> bf16) {
  uint64_t h = 14695981039346656037ull;  // the FNV-1a offset basis
  auto add = [&](const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * kFnvPrime;
  };
  add(codes.data(), codes.size_bytes());
  add(scales.data(), scales.size_bytes());
  add(bf16.data(), bf16.size_bytes());
  return h;
}

absl::Status check_same_weights(Collectives& group, std::span<const float> weights,
                                std::string_view what) {
  if (group.size() == 1) return absl::OkStatus();
  return check_same_weights(group, weight_hash(weights), what);
}

absl::Status check_same_weights(Collectives& group, uint64_t hash, std::string_view what) {
  if (group.size() == 1) return absl::OkStatus();
  // A gather through a sum: every rank fills its own slot, the others are 0.
  std::vector<int64_t> hashes(static_cast<size_t>(group.size()), 0);
  hashes[static_cast<size_t>(group.rank())] = static_cast<int64_t>(hash);
  if (absl::Status s = group.all_reduce(std::span<int64_t>(hashes), ReduceOp::kSum,
                                        absl::StrCat("weight hash exchange ", std::string(what)));
      !s.ok()) {
    return s;
  }
  std::vector<int> differ;
  for (int r = 1; r < group.size(); ++r) {
    if (hashes[static_cast<size_t>(r)] != hashes[0]) differ.push_back(r);
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("weights diverged across the trainer group ", std::string(what), ": rank(s) ",
                   absl::StrJoin(differ, ", "), " hold weights different from rank 0's"));
}

absl::Status gather_kv_records(Collectives& group, model::KvCalibrator* records) {
  if (group.size() == 1 || records == nullptr) return absl::OkStatus();
  const std::vector<std::vector<float>> k = records->k_records(), v = records->v_records();
  const int64_t layers = std::ssize(k);
  std::vector<int64_t> counts(static_cast<size_t>(group.size()), 0);
  counts[static_cast<size_t>(group.rank())] = records->num_records();
  if (absl::Status s =
          group.all_reduce(std::span<int64_t>(counts), ReduceOp::kSum, "KV record count gather");
      !s.ok()) {
    return s;
  }
  int64_t total = 0, offset = 0;
  for (int r = 0; r < group.size(); ++r) {
    if (r == group.rank()) offset = total;
    total += counts[static_cast<size_t>(r)];
  }
  // [2][layer][total]: K then V; this rank writes its records at its offset, zeros elsewhere.
  std::vector<float> all(static_cast<size_t>(2 * layers * total), 0.0f);
  for (int64_t l = 0; l < layers; ++l) {
    const size_t n = std::min(k[static_cast<size_t>(l)].size(), v[static_cast<size_t>(l)].size());
    for (size_t j = 0; j < n; ++j) {
      all[static_cast<size_t>(l * total + offset) + j] = k[static_cast<size_t>(l)][j];
      all[static_cast<size_t>((layers + l) * total + offset) + j] = v[static_cast<size_t>(l)][j];
    }
  }
  if (absl::Status s = group.all_reduce(std::span<float>(all), ReduceOp::kSum, "KV record gather");
      !s.ok()) {
    return s;
  }
  records->clear();
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t j = 0; j < total; ++j) {
      records->record(l, all[static_cast<size_t>(l * total + j)],
                      all[static_cast<size_t>((layers + l) * total + j)]);
    }
  }
  return absl::OkStatus();
}

}  // namespace fp8rl::train
