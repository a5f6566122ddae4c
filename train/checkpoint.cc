// Trainer checkpoint save/load (see checkpoint.h).
#include "train/checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/safetensors.h"
#include "common/status_prefix.h"

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

uint64_t folder_bytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  }
  return total;
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
  const std::filesystem::path dir = std::filesystem::absolute(path);
  std::error_code ec;
  std::filesystem::create_directories(dir.parent_path(), ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("path: cannot create '", dir.parent_path().string(), "': ", ec.message()));
  }
  absl::StatusOr<model::WeightSet> set =
      learner.backend().export_weights(model::WeightFormat::kF32, learner.version());
  if (!set.ok()) return set.status();
  const nlohmann::ordered_json state = {
      {"format", "fp8rl-trainer-checkpoint"},
      {"version", learner.version()},
      {"published_version", learner.published_version()},
      {"job_id", learner.job_id()},
      {"precision", precision_config_to_json(learner.precision())},
      {"optimizer", adamw_to_json(learner.optimizer_config())},
      {"optimizer_state", include_optimizer},
      {"reference", learner.reference() != nullptr}};
  absl::Status written = write_dir_atomic(dir.string(), [&](const std::string& tmp) {
    SafetensorsWriter writer;
    if (auto s = model::add_to_writer(*set, &writer); !s.ok()) return s;
    writer.set_metadata("format", "pt");
    if (auto s = writer.write(tmp + "/model.safetensors"); !s.ok()) return s;
    if (auto s = write_file_atomic(tmp + "/config.json", set->config_json); !s.ok()) return s;
    if (include_optimizer) {
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
  absl::StatusOr<std::unique_ptr<TrainBackend>> backend =
      make_train_backend(placement.device, std::move(*model), adamw, placement.memory_budget_bytes);
  if (!backend.ok()) return with_prefix(backend.status(), "device: ");
  (*backend)->set_recompute(placement.recompute);
  if (has_optimizer) {
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
  out.optimizer_restored = has_optimizer;
  return out;
}

}  // namespace fp8rl::train
