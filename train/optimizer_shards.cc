// Sharded optimizer checkpoint files: one safetensors file per rank and a manifest (see
// optimizer_shards.h).
#include "train/optimizer_shards.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fs.h"
#include "common/safetensors.h"
#include "train/data_parallel.h"

namespace fp8rl::train {
namespace {

constexpr char kManifestFormat[] = "fp8rl-optimizer-shards";

std::string hash_hex(uint64_t h) { return absl::StrFormat("%016x", h); }

// 16 lowercase or uppercase hex digits -> value.
bool parse_hash_hex(const std::string& text, uint64_t* out) {
  if (text.size() != 16 || !std::all_of(text.begin(), text.end(), [](char c) {
        return std::isxdigit(static_cast<unsigned char>(c)) != 0;
      })) {
    return false;
  }
  *out = std::strtoull(text.c_str(), nullptr, 16);
  return true;
}

// The integer metadata `key` of a shard file; INVALID_ARGUMENT naming the file when absent or bad.
absl::StatusOr<int64_t> metadata_int(const SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata().find(key);
  int64_t v = 0;
  if (it == f.metadata().end() || !absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": missing or bad '", key, "' metadata"));
  }
  return v;
}

}  // namespace

std::string optimizer_shard_file_name(int rank, int ranks) {
  return absl::StrCat("rank-", rank, "-of-", ranks, ".safetensors");
}

uint64_t optimizer_shard_hash(const model::AdamW::RangeState& state) {
  WeightHasher h;
  h.add(state.m);
  h.add(state.v);
  return h.value();
}

absl::StatusOr<uint64_t> write_optimizer_shard(const std::string& path,
                                               const model::AdamW::RangeState& state,
                                               int64_t begin) {
  if (state.m.size() != state.v.size()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": exp_avg has ", state.m.size(),
                                                   " values, exp_avg_sq ", state.v.size()));
  }
  const int64_t n = static_cast<int64_t>(state.m.size());
  SafetensorsWriter w;
  if (auto s = w.add_f32("adamw.exp_avg", {n}, state.m); !s.ok()) return s;
  if (auto s = w.add_f32("adamw.exp_avg_sq", {n}, state.v); !s.ok()) return s;
  w.set_metadata("step", absl::StrCat(state.step));
  w.set_metadata("begin", absl::StrCat(begin));
  w.set_metadata("end", absl::StrCat(begin + n));
  if (auto s = w.write(path); !s.ok()) return s;
  return optimizer_shard_hash(state);
}

std::string optimizer_shard_manifest_json(const OptimizerShardManifest& manifest) {
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (int r = 0; r < manifest.ranks(); ++r) {
    files.push_back({{"name", optimizer_shard_file_name(r, manifest.ranks())},
                     {"begin", manifest.bounds[static_cast<size_t>(r)]},
                     {"end", manifest.bounds[static_cast<size_t>(r) + 1]},
                     {"hash", hash_hex(manifest.hashes[static_cast<size_t>(r)])}});
  }
  const nlohmann::ordered_json j = {
      {"format", kManifestFormat}, {"ranks", manifest.ranks()}, {"num_params", manifest.num_params},
      {"step", manifest.step},     {"bounds", manifest.bounds}, {"files", files}};
  return j.dump(2);
}

absl::StatusOr<OptimizerShardManifest> read_optimizer_shard_manifest(const std::string& dir,
                                                                     int64_t num_params) {
  const std::string path =
      (std::filesystem::path(dir) / kOptimizerShardsDir / kOptimizerShardsManifest).string();
  absl::StatusOr<std::string> text = read_text_file(path);
  if (!text.ok()) return text.status();
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, ": ", why));
  };
  if (!j.is_object()) return bad("manifest", "not a JSON object");
  OptimizerShardManifest m;
  int64_t ranks = 0;
  try {
    if (j.at("format").get<std::string>() != kManifestFormat) {
      return bad("format", absl::StrCat("must be '", kManifestFormat, "'"));
    }
    ranks = j.at("ranks").get<int64_t>();
    m.num_params = j.at("num_params").get<int64_t>();
    m.step = j.at("step").get<int64_t>();
    m.bounds = j.at("bounds").get<std::vector<int64_t>>();
    const nlohmann::json& files = j.at("files");
    if (!files.is_array()) return bad("files", "must be an array");
    for (size_t r = 0; r < files.size(); ++r) {
      uint64_t h = 0;
      if (!parse_hash_hex(files[r].at("hash").get<std::string>(), &h)) {
        return bad(absl::StrCat("files[", r, "].hash"), "must be 16 hex digits");
      }
      m.hashes.push_back(h);
    }
  } catch (const nlohmann::json::exception& e) {
    return bad("manifest", e.what());
  }
  if (ranks < 1 || ranks > 1024)
    return bad("ranks", absl::StrCat("must be in [1, 1024], got ", ranks));
  if (std::ssize(m.bounds) != ranks + 1 || std::ssize(m.hashes) != ranks) {
    return bad("bounds",
               absl::StrCat("must hold ranks + 1 = ", ranks + 1, " offsets and files ", ranks,
                            " entries; got ", m.bounds.size(), " and ", m.hashes.size()));
  }
  if (m.num_params != num_params) {
    return bad("num_params", absl::StrCat("the shards hold ", m.num_params,
                                          " parameters, the checkpoint's model has ", num_params));
  }
  if (m.step < 0) return bad("step", absl::StrCat("must be >= 0, got ", m.step));
  if (m.bounds.front() != 0 || m.bounds.back() != num_params ||
      !std::is_sorted(m.bounds.begin(), m.bounds.end())) {
    return bad("bounds", absl::StrCat("must rise from 0 to num_params (", num_params, ")"));
  }
  return m;
}

absl::StatusOr<model::AdamW::RangeState> read_optimizer_range(
    const std::string& dir, const OptimizerShardManifest& manifest, int64_t begin, int64_t end) {
  if (begin < 0 || begin > end || end > manifest.num_params) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer shards: range [", begin, ", ", end,
                                                   ") is outside [0, ", manifest.num_params, "]"));
  }
  model::AdamW::RangeState out;
  out.step = manifest.step;
  out.m.reserve(static_cast<size_t>(end - begin));
  out.v.reserve(static_cast<size_t>(end - begin));
  const int ranks = manifest.ranks();
  for (int r = 0; r < ranks; ++r) {
    const int64_t b = manifest.bounds[static_cast<size_t>(r)];
    const int64_t e = manifest.bounds[static_cast<size_t>(r) + 1];
    const int64_t from = std::max(b, begin), to = std::min(e, end);
    if (from >= to) continue;  // no overlap (or an empty old shard)
    const std::string path =
        (std::filesystem::path(dir) / kOptimizerShardsDir / optimizer_shard_file_name(r, ranks))
            .string();
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
    if (!f.ok()) return f.status();
    absl::StatusOr<int64_t> step = metadata_int(*f, "step");
    if (!step.ok()) return step.status();
    absl::StatusOr<int64_t> fb = metadata_int(*f, "begin");
    if (!fb.ok()) return fb.status();
    absl::StatusOr<int64_t> fe = metadata_int(*f, "end");
    if (!fe.ok()) return fe.status();
    if (*fb != b || *fe != e || *step != manifest.step) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": holds [", *fb, ", ", *fe,
                                                     ") at step ", *step, "; the manifest says [",
                                                     b, ", ", e, ") at step ", manifest.step));
    }
    model::AdamW::RangeState shard;
    absl::StatusOr<std::vector<float>> m = f->read_f32("adamw.exp_avg");
    if (!m.ok()) return m.status();
    absl::StatusOr<std::vector<float>> v = f->read_f32("adamw.exp_avg_sq");
    if (!v.ok()) return v.status();
    shard.m = std::move(*m);
    shard.v = std::move(*v);
    if (std::ssize(shard.m) != e - b || std::ssize(shard.v) != e - b) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", shard.m.size(), " exp_avg and ",
                                                     shard.v.size(), " exp_avg_sq values for [", b,
                                                     ", ", e, ")"));
    }
    if (const uint64_t h = optimizer_shard_hash(shard);
        h != manifest.hashes[static_cast<size_t>(r)]) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": hash ", hash_hex(h), " differs from the manifest's ",
                       hash_hex(manifest.hashes[static_cast<size_t>(r)]), " (corrupt file)"));
    }
    out.m.insert(out.m.end(), shard.m.begin() + (from - b), shard.m.begin() + (to - b));
    out.v.insert(out.v.end(), shard.v.begin() + (from - b), shard.v.begin() + (to - b));
  }
  return out;
}

}  // namespace fp8rl::train
