// Trainer checkpoint save/load (see checkpoint.h).
#include "train/checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/safetensors.h"
#include "common/status_prefix.h"
#include "train/optimizer_shards.h"

namespace fp8rl::train {
namespace {

nlohmann::ordered_json adamw_to_json(const model::AdamWConfig& c) {
  return {{"lr", c.lr},
          {"beta1", c.beta1},
          {"beta2", c.beta2},
          {"eps", c.eps},
          {"weight_decay", c.weight_decay},
          {"max_grad_norm", c.max_grad_norm}};
}

// A checkpoint folder's trainer_state.json as JSON (an empty object when absent and optional).
absl::StatusOr<nlohmann::json> read_state(const std::string& dir, bool required) {
  const std::string path = (std::filesystem::path(dir) / kTrainerStateFile).string();
  if (!std::filesystem::exists(path)) {
    if (!required) return nlohmann::json::object();
    return absl::InvalidArgumentError(absl::StrCat("path: '", dir, "' has no ", kTrainerStateFile,
                                                   " (not written by SaveCheckpoint)"));
  }
  absl::StatusOr<std::string> text = read_text_file(path);
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  return j;
}

// A byte every rank sends and every rank receives (ok flags): the group's barrier of a sharded
// save. out[r] is rank r's byte.
absl::StatusOr<std::vector<uint8_t>> exchange_flags(Collectives& group, uint8_t mine,
                                                    std::string_view what) {
  const std::vector<uint8_t> in = {mine};
  std::vector<uint8_t> out(static_cast<size_t>(group.size()));
  const std::vector<int64_t> counts(static_cast<size_t>(group.size()), 1);
  if (absl::Status s = group.all_gather(std::span<const uint8_t>(in), out, counts, what); !s.ok()) {
    return s;
  }
  return out;
}

// Every rank's 8-byte hash (little-endian) and ok flag, in one all-gather.
absl::StatusOr<std::vector<std::pair<bool, uint64_t>>> exchange_hashes(Collectives& group, bool ok,
                                                                       uint64_t hash) {
  constexpr size_t kBytes = 9;
  std::vector<uint8_t> in(kBytes);
  in[0] = ok ? 1 : 0;
  for (size_t i = 0; i < 8; ++i) in[1 + i] = static_cast<uint8_t>(hash >> (8 * i));
  std::vector<uint8_t> out(kBytes * static_cast<size_t>(group.size()));
  const std::vector<int64_t> counts(static_cast<size_t>(group.size()), kBytes);
  if (absl::Status s = group.all_gather(std::span<const uint8_t>(in), out, counts,
                                        "SaveCheckpoint optimizer shards");
      !s.ok()) {
    return s;
  }
  std::vector<std::pair<bool, uint64_t>> result;
  for (int r = 0; r < group.size(); ++r) {
    const uint8_t* p = out.data() + kBytes * static_cast<size_t>(r);
    uint64_t h = 0;
    for (size_t i = 0; i < 8; ++i) h |= static_cast<uint64_t>(p[1 + i]) << (8 * i);
    result.emplace_back(p[0] != 0, h);
  }
  return result;
}

// Where rank `rank` of `ranks` stages its optimizer shard before rank 0 moves it into the new
// folder: beside `dir`, so the move is a rename on the same file system.
std::string staged_shard_path(const std::filesystem::path& dir, int rank, int ranks) {
  return absl::StrCat(dir.string(), ".", kOptimizerShardsDir, ".",
                      optimizer_shard_file_name(rank, ranks));
}

uint64_t folder_bytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  }
  return total;
}

// `whole_master`: a sharded learner's master, gathered (empty: the backend exports its own).
absl::StatusOr<SavedCheckpoint> save_folder(const Learner& learner,
                                            const std::filesystem::path& dir,
                                            bool include_optimizer,
                                            const OptimizerShardManifest* shards,
                                            std::span<const float> whole_master) {
  std::error_code ec;
  std::filesystem::create_directories(dir.parent_path(), ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("path: cannot create '", dir.parent_path().string(), "': ", ec.message()));
  }
  absl::StatusOr<model::WeightSet> set =
      whole_master.empty()
          ? learner.backend().export_weights(model::WeightFormat::kF32, learner.version())
          : learner.backend().export_weights_with_master(model::WeightFormat::kF32,
                                                         learner.version(), whole_master);
  if (!set.ok()) return set.status();
  const nlohmann::ordered_json state = {
      {"format", "fp8rl-trainer-checkpoint"},
      {"version", learner.version()},
      {"published_version", learner.published_version()},
      {"job_id", learner.job_id()},
      {"precision", precision_config_to_json(learner.precision())},
      {"optimizer", adamw_to_json(learner.optimizer_config())},
      {"optimizer_state", include_optimizer},
      {"optimizer_shards", shards != nullptr ? shards->ranks() : 0},
      {"reference", learner.reference() != nullptr}};
  absl::Status written = write_dir_atomic(dir.string(), [&](const std::string& tmp) {
    SafetensorsWriter writer;
    if (auto s = model::add_to_writer(*set, &writer); !s.ok()) return s;
    writer.set_metadata("format", "pt");
    if (auto s = writer.write(tmp + "/model.safetensors"); !s.ok()) return s;
    if (auto s = write_file_atomic(tmp + "/config.json", set->config_json); !s.ok()) return s;
    if (shards != nullptr) {
      // The ranks' staged shards move in (rank 0's too), then the manifest.
      const std::string into = tmp + "/" + kOptimizerShardsDir;
      std::error_code move_ec;
      std::filesystem::create_directories(into, move_ec);
      if (move_ec) {
        return absl::InternalError(absl::StrCat("cannot create ", into, ": ", move_ec.message()));
      }
      for (int r = 0; r < shards->ranks(); ++r) {
        const std::string from = staged_shard_path(dir, r, shards->ranks());
        std::filesystem::rename(from, into + "/" + optimizer_shard_file_name(r, shards->ranks()),
                                move_ec);
        if (move_ec) {
          return absl::FailedPreconditionError(
              absl::StrCat("cannot move rank ", r, "'s optimizer shard ", from, " into ", into,
                           ": ", move_ec.message(), " (every rank must write the same folder)"));
        }
      }
      if (auto s = write_file_atomic(into + "/" + kOptimizerShardsManifest,
                                     optimizer_shard_manifest_json(*shards));
          !s.ok()) {
        return s;
      }
    } else if (include_optimizer) {
      if (auto s = learner.backend().save_optimizer_state(tmp + "/" + kOptimizerStateFile);
          !s.ok()) {
        return s;
      }
    }
    if (learner.reference() != nullptr) {
      if (auto s = learner.reference()->save(tmp + "/" + kReferenceDir, model::WeightFormat::kF32);
          !s.ok()) {
        return s;
      }
    }
    return write_file_atomic(tmp + "/" + kTrainerStateFile, state.dump(2));
  });
  if (!written.ok()) return with_prefix(written, "SaveCheckpoint: ");
  return SavedCheckpoint{dir.string(), folder_bytes(dir.string()), learner.version()};
}

}  // namespace

absl::StatusOr<int64_t> checkpoint_version(const std::string& dir) {
  absl::StatusOr<nlohmann::json> state = read_state(dir, /*required=*/false);
  if (!state.ok()) return state.status();
  const nlohmann::json v = state->value("version", nlohmann::json(0));
  return v.is_number_integer() ? v.get<int64_t>() : 0;
}

absl::StatusOr<SavedCheckpoint> save_checkpoint(const Learner& learner, const std::string& path,
                                                bool include_optimizer) {
  if (learner.optimizer_restore_pending()) {
    return absl::FailedPreconditionError(
        "SaveCheckpoint: the optimizer state of the loaded checkpoint is not restored yet "
        "(Learner::set_shard_mode or the first update restores it)");
  }
  const std::filesystem::path dir = std::filesystem::absolute(path);
  // Sharded (a group of 2 or more under grads_optimizer): every rank takes part, each writing its
  // optimizer shard; rank 0 writes the folder.
  Collectives* group = learner.shard_layout() != nullptr ? learner.group() : nullptr;
  if (group != nullptr) {
    if (absl::Status s = learner.check_shard_group(); !s.ok()) {
      return with_prefix(s, "SaveCheckpoint: ");
    }
  }
  const int rank = group != nullptr ? group->rank() : 0;
  const int ranks = group != nullptr ? group->size() : 1;
  const bool sharded_optimizer = group != nullptr && include_optimizer;
  OptimizerShardManifest manifest;
  if (sharded_optimizer) {
    // 1. This rank's shard, staged beside the folder; then every rank learns every rank's hash.
    const std::string staged = staged_shard_path(dir, rank, ranks);
    std::error_code ec;
    std::filesystem::create_directories(dir.parent_path(), ec);  // failing: the write says why
    absl::StatusOr<model::AdamW::RangeState> state = learner.backend().optimizer_range_state();
    const absl::StatusOr<uint64_t> hash =
        state.ok() ? write_optimizer_shard(staged, *state, learner.shard_layout()->begin(rank))
                   : state.status();
    absl::StatusOr<std::vector<std::pair<bool, uint64_t>>> all =
        exchange_hashes(*group, hash.ok(), hash.ok() ? *hash : 0);
    if (!all.ok() || !hash.ok()) remove_all_quietly(staged);
    if (!all.ok()) return all.status();
    if (!hash.ok()) return with_prefix(hash.status(), "SaveCheckpoint: optimizer shard: ");
    std::string failed;
    for (int r = 0; r < ranks; ++r) {
      if (!(*all)[static_cast<size_t>(r)].first) {
        absl::StrAppend(&failed, failed.empty() ? "" : ", ", r);
      }
    }
    if (!failed.empty()) {
      remove_all_quietly(staged);
      return absl::AbortedError(
          absl::StrCat("SaveCheckpoint: writing the optimizer shard failed on rank(s) ", failed,
                       "; nothing was written"));
    }
    manifest.num_params = learner.backend().num_params();
    manifest.step = state->step;
    manifest.bounds = learner.shard_layout()->bounds;
    for (const auto& written : *all) manifest.hashes.push_back(written.second);
  }
  absl::StatusOr<SavedCheckpoint> saved = SavedCheckpoint{dir.string(), 0, learner.version()};
  // model.safetensors needs the whole fp32 master, which a sharded rank holds a shard of: every
  // rank takes part in its all-gather (transient: 4 bytes per parameter, and rank 0's copy in
  // checkpoint layout beside it while it writes); the other ranks drop it at once.
  std::vector<float> whole_master;
  if (group != nullptr) {
    absl::StatusOr<std::vector<float>> gathered = learner.whole_master("SaveCheckpoint:");
    if (!gathered.ok()) {
      if (sharded_optimizer) remove_all_quietly(staged_shard_path(dir, rank, ranks));
      return gathered.status();
    }
    if (rank == 0) whole_master = *std::move(gathered);
  }
  if (rank == 0) {
    saved = save_folder(learner, dir, include_optimizer, sharded_optimizer ? &manifest : nullptr,
                        whole_master);
  }
  whole_master = {};
  if (group == nullptr) return saved;
  // 2. Every rank answers as rank 0 did (the other ranks' staged shards moved into the folder, or
  // are removed).
  absl::StatusOr<std::vector<uint8_t>> done =
      exchange_flags(*group, saved.ok() ? 1 : 0, "SaveCheckpoint result");
  if (sharded_optimizer) remove_all_quietly(staged_shard_path(dir, rank, ranks));
  if (!done.ok()) return done.status();
  if (rank != 0 && (*done)[0] == 0) {
    return absl::AbortedError(
        "SaveCheckpoint: the checkpoint failed on rank 0 (it wrote the folder); see its error");
  }
  if (rank != 0 && saved.ok()) saved->bytes = folder_bytes(dir.string());
  return saved;
}

absl::StatusOr<LoadedCheckpoint> load_checkpoint(const std::string& dir,
                                                 const TrainPlacement& placement) {
  absl::StatusOr<nlohmann::json> state = read_state(dir, /*required=*/true);
  if (!state.ok()) return state.status();
  const std::string what = absl::StrCat(dir, "/", kTrainerStateFile, ": ");
  PrecisionConfig precision;
  model::AdamWConfig adamw;
  int64_t version = 0, published = 0;
  std::string job_id;
  bool has_optimizer = false;
  int64_t optimizer_shards = 0;
  try {
    if (auto s = precision_config_from_json(state->at("precision"), "precision", &precision);
        !s.ok()) {
      return with_prefix(s, what);
    }
    const nlohmann::json& o = state->at("optimizer");
    adamw.lr = o.at("lr").get<double>();
    adamw.beta1 = o.at("beta1").get<double>();
    adamw.beta2 = o.at("beta2").get<double>();
    adamw.eps = o.at("eps").get<double>();
    adamw.weight_decay = o.at("weight_decay").get<double>();
    adamw.max_grad_norm = o.at("max_grad_norm").get<double>();
    version = state->at("version").get<int64_t>();
    published = state->at("published_version").get<int64_t>();
    job_id = state->at("job_id").get<std::string>();
    has_optimizer = state->at("optimizer_state").get<bool>();
    optimizer_shards = state->value("optimizer_shards", int64_t{0});  // absent before sharding
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, e.what()));
  }
  if (auto s = model::validate_adamw_config(adamw); !s.ok()) return with_prefix(s, what);
  if (auto s = validate_precision(precision, "precision"); !s.ok()) return with_prefix(s, what);
  const PrecisionPolicy policy = precision.training_policy();

  absl::StatusOr<std::unique_ptr<model::Model>> model = model::Model::Load(dir, policy);
  if (!model.ok()) return model.status();
  absl::StatusOr<MemoryPlan> plan = plan_for((*model)->config(), precision, placement);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<InitialShard> initial = initial_shard((*model)->layout(), placement);
  if (!initial.ok()) return initial.status();
  absl::StatusOr<std::unique_ptr<TrainBackend>> backend = make_train_backend(
      placement.device, std::move(*model), adamw, placement.memory_budget_bytes, *initial);
  if (!backend.ok()) return with_prefix(backend.status(), "device: ");
  (*backend)->set_recompute(placement.recompute);
  std::optional<OptimizerShardManifest> shards;
  if (has_optimizer && optimizer_shards > 0) {
    // Read when the learner knows its range (Learner::set_shard_mode or its first update).
    absl::StatusOr<OptimizerShardManifest> manifest =
        read_optimizer_shard_manifest(dir, (*backend)->num_params());
    if (!manifest.ok()) return manifest.status();
    if (manifest->ranks() != optimizer_shards) {
      return absl::InvalidArgumentError(absl::StrCat(what, "optimizer_shards: ", optimizer_shards,
                                                     " ranks, the manifest has ",
                                                     manifest->ranks()));
    }
    shards = std::move(*manifest);
  } else if (has_optimizer) {
    if (auto s = (*backend)->load_optimizer_state(dir + "/" + kOptimizerStateFile); !s.ok()) {
      return s;
    }
  }
  std::unique_ptr<model::Model> reference;
  const std::string ref_dir = dir + "/" + kReferenceDir;
  if (std::filesystem::exists(ref_dir)) {
    absl::StatusOr<std::unique_ptr<model::Model>> r = model::Model::Load(ref_dir, policy);
    if (!r.ok()) return r.status();
    reference = std::move(*r);
  }
  LoadedCheckpoint out;
  out.learner = std::make_unique<Learner>(job_id, precision, std::move(*backend),
                                          std::move(reference), version, published);
  out.learner->set_memory_plan(std::move(*plan));
  if (shards.has_value()) out.learner->set_pending_optimizer_shards(dir, std::move(*shards));
  out.optimizer_restored = has_optimizer;
  return out;
}

}  // namespace fp8rl::train
