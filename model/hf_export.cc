// Hugging Face (BF16) and block-FP8 checkpoint export, sharded with an index (see hf_export.h).
#include "model/hf_export.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fs.h"
#include "common/json_util.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

namespace fp8rl::model {
namespace {

namespace stdfs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kGenerationConfig[] = "generation_config.json";

bool is_kv_scale(const std::string& name) {
  return name.ends_with(".self_attn.k_scale") || name.ends_with(".self_attn.v_scale");
}

// config.json of the export: the engine's config with the dtype the tensors are stored in.
absl::StatusOr<std::string> export_config_json(const std::string& engine_json) {
  FP8RL_ASSIGN_OR_RETURN(Json j, parse_json_strict(engine_json, "config.json"));
  j["torch_dtype"] = "bfloat16";
  return j.dump(2) + "\n";
}

// generation_config.json from config.json's special ids (when the source folder has none).
std::string generation_config_json(const ModelConfig& c) {
  Json j = Json::object();
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  return j.dump(2) + "\n";
}

}  // namespace

absl::StatusOr<ExportFormat> parse_export_format(std::string_view name) {
  if (name == "hf") return ExportFormat::kHf;
  if (name == "fp8") return ExportFormat::kFp8;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown export format '", std::string(name), "' (expected hf or fp8)"));
}

std::vector<std::vector<size_t>> plan_shards(const std::vector<NamedTensor>& tensors,
                                             int64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  int64_t used = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t n = static_cast<int64_t>(tensors[i].bytes.size());
    if (shards.empty() || (used > 0 && used + n > max_shard_bytes)) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().push_back(i);
    used += n;
  }
  return shards;
}

std::string shard_file_name(int64_t index, int64_t count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index, count);
}

absl::StatusOr<WeightSet> export_tensors(const Model& model, ExportFormat format) {
  FP8RL_ASSIGN_OR_RETURN(WeightSet set,
                         model.export_weights(format == ExportFormat::kFp8 ? WeightFormat::kFP8
                                                                           : WeightFormat::kBF16));
  FP8RL_ASSIGN_OR_RETURN(set.config_json, export_config_json(set.config_json));
  if (format == ExportFormat::kHf) {
    std::erase_if(set.tensors, [](const NamedTensor& t) { return is_kv_scale(t.name); });
  }
  return set;
}

absl::StatusOr<HfExportSummary> export_hf_checkpoint(const Model& model, const std::string& out_dir,
                                                     const HfExportOptions& options) {
  if (options.max_shard_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_shard_bytes: must be > 0, got ", options.max_shard_bytes));
  }
  if (out_dir.empty()) return absl::InvalidArgumentError("out: empty path");
  std::error_code ec;
  if (!options.side_files_dir.empty() && !stdfs::is_directory(options.side_files_dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("side_files_dir: ", options.side_files_dir, " is not a folder"));
  }
  FP8RL_ASSIGN_OR_RETURN(WeightSet set, export_tensors(model, options.format));
  FP8RL_RETURN_IF_ERROR(validate_weight_set(set));

  HfExportSummary summary;
  std::vector<std::string> copies;  // source paths
  if (!options.side_files_dir.empty()) {
    for (const std::string& name : kTokenizerFiles) {
      const stdfs::path p = stdfs::path(options.side_files_dir) / name;
      if (stdfs::is_regular_file(p, ec)) {
        copies.push_back(p.string());
        summary.copied_files.push_back(name);
      }
    }
  }
  std::sort(summary.copied_files.begin(), summary.copied_files.end());
  const bool has_generation_config =
      std::find(summary.copied_files.begin(), summary.copied_files.end(), kGenerationConfig) !=
      summary.copied_files.end();

  const std::vector<std::vector<size_t>> shards = plan_shards(set.tensors, options.max_shard_bytes);
  summary.tensors = static_cast<int64_t>(set.tensors.size());
  summary.shards = static_cast<int64_t>(shards.size());
  for (const NamedTensor& t : set.tensors)
    summary.total_bytes += static_cast<int64_t>(t.bytes.size());

  FP8RL_RETURN_IF_ERROR(write_dir_atomic(out_dir, [&](const std::string& tmp) -> absl::Status {
    const stdfs::path root(tmp);
    FP8RL_RETURN_IF_ERROR(write_file_atomic((root / "config.json").string(), set.config_json));
    Json weight_map = Json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string file =
          shards.size() == 1
              ? std::string(kSingleFile)
              : shard_file_name(static_cast<int64_t>(s) + 1, static_cast<int64_t>(shards.size()));
      SafetensorsWriter writer;
      writer.set_metadata("format", "pt");
      for (size_t i : shards[s]) {
        NamedTensor& t = set.tensors[i];
        FP8RL_RETURN_IF_ERROR(writer.add(t.name, t.dtype, t.shape, std::move(t.bytes)));
        weight_map[t.name] = file;
      }
      FP8RL_RETURN_IF_ERROR(writer.write((root / file).string()));
    }
    if (shards.size() > 1) {
      Json index = {{"metadata", {{"total_size", summary.total_bytes}}},
                    {"weight_map", std::move(weight_map)}};
      FP8RL_RETURN_IF_ERROR(write_file_atomic((root / kIndexFile).string(), index.dump(2) + "\n"));
    }
    for (const std::string& src : copies) {
      FP8RL_RETURN_IF_ERROR(copy_file(src, (root / stdfs::path(src).filename()).string()));
    }
    if (!has_generation_config) {
      FP8RL_RETURN_IF_ERROR(write_file_atomic((root / kGenerationConfig).string(),
                                              generation_config_json(model.config())));
    }
    return absl::OkStatus();
  }));
  return summary;
}

}  // namespace fp8rl::model
