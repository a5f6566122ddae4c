// Safetensors files and Hugging Face checkpoint folders: strict readers (every header field is
// validated before a tensor is used) and atomic writers.
#include "common/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fs.h"
#include "common/json_util.h"
#include "common/status_macros.h"

namespace fp8rl {
namespace {

namespace stdfs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr char kMetadataKey[] = "__metadata__";
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kConfigFile[] = "config.json";

std::string shape_string(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// numel of a shape, or an error if a dimension is negative or the product overflows.
absl::StatusOr<int64_t> checked_numel(const std::vector<int64_t>& shape, int64_t elem_size) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError("negative dimension");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / elem_size / d) {
      return absl::InvalidArgumentError("shape too large");
    }
    n *= d;
  }
  return n;
}

// Reads a non-negative integer array field of a header entry.
absl::StatusOr<std::vector<int64_t>> int_array(const Json& entry, const char* key,
                                               const std::string& where) {
  auto it = entry.find(key);
  if (it == entry.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing '", key, "'"));
  }
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": '", key, "' must be an array, got ", json_type_name(*it)));
  }
  std::vector<int64_t> out;
  for (const Json& v : *it) {
    if (!v.is_number_unsigned() ||
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": '", key, "' must hold non-negative integers, got ", v.dump()));
    }
    out.push_back(static_cast<int64_t>(v.get<uint64_t>()));
  }
  return out;
}

uint64_t read_le_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorInfo::nbytes() const { return numel() * dtype_size(dtype); }

// ---- SafetensorsFile -----------------------------------------------------------------------

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  absl::StatusOr<std::vector<uint8_t>> bytes = read_binary_file(path);
  if (!bytes.ok()) return bytes.status();
  return FromBytes(path, std::move(*bytes));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(const std::string& path,
                                                           std::vector<uint8_t> bytes) {
  SafetensorsFile file;
  file.path_ = path;
  file.data_ = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  const std::vector<uint8_t>& data = *file.data_;
  const uint64_t file_size = data.size();
  if (file_size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": file is ", file_size, " bytes, too short for the 8-byte header length"));
  }
  const uint64_t header_len = read_le_u64(data.data());
  if (header_len > file_size - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_len, " exceeds the file size ", file_size));
  }
  const std::string_view header_text(reinterpret_cast<const char*>(data.data()) + 8, header_len);
  absl::StatusOr<Json> header = parse_json_strict(header_text, absl::StrCat(path, ": header"));
  if (!header.ok()) return header.status();
  if (!header->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header must be a JSON object, got ", json_type_name(*header)));
  }

  const int64_t data_begin = static_cast<int64_t>(8 + header_len);
  const int64_t data_size = static_cast<int64_t>(file_size) - data_begin;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end) within the data section
  std::vector<std::string> range_names;
  for (const auto& [name, value] : header->items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": __metadata__ must be an object of strings"));
      }
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": __metadata__ '", key, "' must be a string, got ", json_type_name(v)));
        }
        file.metadata_[key] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat(path, ": tensor '", name, "'");
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor with an empty name"));
    }
    if (!value.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": entry must be an object, got ", json_type_name(value)));
    }
    auto dtype_it = value.find("dtype");
    if (dtype_it == value.end() || !dtype_it->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": missing string 'dtype'"));
    }
    absl::StatusOr<DType> dtype = parse_dtype(dtype_it->get<std::string>());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", dtype.status().message()));
    }
    absl::StatusOr<std::vector<int64_t>> shape = int_array(value, "shape", where);
    if (!shape.ok()) return shape.status();
    absl::StatusOr<std::vector<int64_t>> offsets = int_array(value, "data_offsets", where);
    if (!offsets.ok()) return offsets.status();
    if (offsets->size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": 'data_offsets' must be [begin, end], got ", shape_string(*offsets)));
    }
    const int64_t begin = (*offsets)[0];
    const int64_t end = (*offsets)[1];
    absl::StatusOr<int64_t> numel = checked_numel(*shape, dtype_size(*dtype));
    if (!numel.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": invalid shape ", shape_string(*shape), ": ", numel.status().message()));
    }
    const int64_t nbytes = *numel * dtype_size(*dtype);
    if (begin > end || end > data_size) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": data_offsets [", begin, ", ", end,
                                                     "] out of range of the ", data_size,
                                                     "-byte data section (truncated file?)"));
    }
    if (end - begin != nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": data_offsets [", begin, ", ", end, "] hold ", end - begin, " bytes but shape ",
          shape_string(*shape), " x ", std::string(dtype_name(*dtype)), " needs ", nbytes));
    }
    Entry entry;
    entry.info.name = name;
    entry.info.dtype = *dtype;
    entry.info.shape = *shape;
    entry.begin = data_begin + begin;
    file.index_.emplace(name, std::move(entry));
    if (nbytes > 0) {
      ranges.emplace_back(begin, end);
      range_names.push_back(name);
    }
  }

  // Non-empty tensors must not share bytes.
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& prev = ranges[order[i - 1]];
    const auto& cur = ranges[order[i]];
    if (cur.first < prev.second) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensors '", range_names[order[i - 1]], "' [", prev.first, ", ", prev.second,
          "] and '", range_names[order[i]], "' [", cur.first, ", ", cur.second, "] overlap"));
    }
  }
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, entry] : index_) out.push_back(name);
  return out;
}

absl::StatusOr<const SafetensorsFile::Entry*> SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  }
  return &it->second;
}

absl::StatusOr<TensorInfo> SafetensorsFile::info(const std::string& name) const {
  FP8RL_ASSIGN_OR_RETURN(const Entry* entry, find(name));
  return entry->info;
}

absl::StatusOr<std::vector<uint8_t>> SafetensorsFile::raw(const std::string& name) const {
  FP8RL_ASSIGN_OR_RETURN(const Entry* entry, find(name));
  const uint8_t* p = data_->data() + entry->begin;
  return std::vector<uint8_t>(p, p + entry->info.nbytes());
}

absl::StatusOr<std::vector<float>> SafetensorsFile::read_f32(const std::string& name) const {
  FP8RL_ASSIGN_OR_RETURN(const Entry* entry, find(name));
  const TensorInfo& info = entry->info;
  std::vector<float> out(static_cast<size_t>(info.numel()));
  absl::Status s =
      convert_to_f32(info.dtype, data_->data() + entry->begin, info.numel(), out.data());
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor '", name, "': cannot read as fp32: ", s.message()));
  }
  return out;
}

// ---- SafetensorsWriter ---------------------------------------------------------------------

absl::Status SafetensorsWriter::add(const std::string& name, DType dtype,
                                    std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  if (name.empty() || name == kMetadataKey) {
    return absl::InvalidArgumentError(absl::StrCat("invalid tensor name '", name, "'"));
  }
  if (tensors_.count(name)) {
    return absl::AlreadyExistsError(absl::StrCat("tensor '", name, "' added twice"));
  }
  absl::StatusOr<int64_t> numel = checked_numel(shape, dtype_size(dtype));
  if (!numel.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': invalid shape ",
                                                   shape_string(shape), ": ",
                                                   numel.status().message()));
  }
  const int64_t nbytes = *numel * dtype_size(dtype);
  if (static_cast<int64_t>(bytes.size()) != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "': ", bytes.size(), " bytes given but shape ", shape_string(shape),
        " x ", std::string(dtype_name(dtype)), " needs ", nbytes));
  }
  Pending p;
  p.info.name = name;
  p.info.dtype = dtype;
  p.info.shape = std::move(shape);
  p.bytes = std::move(bytes);
  tensors_.emplace(name, std::move(p));
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape,
                                        const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return add(name, DType::kF32, std::move(shape), std::move(bytes));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

int64_t SafetensorsWriter::data_bytes() const {
  int64_t total = 0;
  for (const auto& [name, p] : tensors_) total += static_cast<int64_t>(p.bytes.size());
  return total;
}

absl::Status SafetensorsWriter::write(const std::string& path) const {
  Json header = Json::object();
  if (!metadata_.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  int64_t offset = 0;
  for (const auto& [name, p] : tensors_) {
    const int64_t end = offset + static_cast<int64_t>(p.bytes.size());
    header[name] = Json{{"dtype", std::string(dtype_name(p.info.dtype))},
                        {"shape", p.info.shape},
                        {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot encode the header (tensor names must be UTF-8): ", e.what()));
  }
  // Pad with spaces so the data section starts 8-byte aligned.
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>((text.size() >> (8 * i)) & 0xFF);

  std::vector<std::span<const uint8_t>> pieces;
  pieces.reserve(tensors_.size() + 2);
  pieces.emplace_back(len_bytes, 8);
  pieces.emplace_back(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  for (const auto& [name, p] : tensors_) pieces.emplace_back(p.bytes.data(), p.bytes.size());
  return write_file_atomic(path, pieces);
}

// ---- Checkpoint ----------------------------------------------------------------------------

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& dir) {
  std::error_code ec;
  if (!stdfs::exists(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint folder ", dir, " does not exist"));
  }
  if (!stdfs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", dir, " is not a folder"));
  }
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  const stdfs::path root(dir);

  const std::string config_path = (root / kConfigFile).string();
  if (!stdfs::exists(config_path, ec)) {
    return absl::NotFoundError(absl::StrCat(config_path, " not found"));
  }
  absl::StatusOr<std::string> config = read_text_file(config_path);
  if (!config.ok()) return config.status();
  absl::StatusOr<Json> config_json = parse_json_strict(*config, config_path);
  if (!config_json.ok()) return config_json.status();
  if (!config_json->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": must be a JSON object, got ", json_type_name(*config_json)));
  }
  ckpt.config_json_ = std::move(*config);

  const std::string single_path = (root / kSingleFile).string();
  const std::string index_path = (root / kIndexFile).string();
  if (stdfs::exists(single_path, ec)) {
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(single_path);
    if (!file.ok()) return file.status();
    for (const std::string& name : file->names()) ckpt.where_[name] = 0;
    ckpt.files_.push_back(std::move(*file));
    return ckpt;
  }
  if (!stdfs::exists(index_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no ", kSingleFile, " or ", kIndexFile, " in the folder"));
  }

  absl::StatusOr<std::string> index_text = read_text_file(index_path);
  if (!index_text.ok()) return index_text.status();
  absl::StatusOr<Json> index = parse_json_strict(*index_text, index_path);
  if (!index.ok()) return index.status();
  if (!index->is_object() || !index->contains("weight_map") ||
      !(*index)["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": missing object 'weight_map'"));
  }
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::set<std::string> shards;
  for (const auto& [name, shard] : (*index)["weight_map"].items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map['", name,
                                                     "'] must be a file name, got ", shard.dump()));
    }
    const std::string shard_name = shard.get<std::string>();
    if (shard_name.empty() || shard_name.find('/') != std::string::npos || shard_name == "." ||
        shard_name == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map['", name, "'] = '", shard_name,
                       "' is not a file name in the checkpoint folder"));
    }
    weight_map[name] = shard_name;
    shards.insert(shard_name);
  }
  if (shards.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map is empty"));
  }
  for (const std::string& shard : shards) {
    const std::string shard_path = (root / shard).string();
    if (!stdfs::exists(shard_path, ec)) {
      return absl::NotFoundError(
          absl::StrCat(index_path, ": shard ", shard, " is missing (", shard_path, ")"));
    }
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(shard_path);
    if (!file.ok()) return file.status();
    const int file_index = static_cast<int>(ckpt.files_.size());
    for (const std::string& name : file->names()) {
      auto [it, inserted] = ckpt.where_.emplace(name, file_index);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, ": tensor '", name, "' appears in both ",
                         ckpt.files_[it->second].path(), " and ", shard_path));
      }
      auto mapped = weight_map.find(name);
      if (mapped == weight_map.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path, ": tensor '", name, "' of shard ", shard, " is not in weight_map"));
      }
      if (mapped->second != shard) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map puts '", name,
                                                       "' in ", mapped->second,
                                                       " but it is stored in ", shard));
      }
    }
    ckpt.files_.push_back(std::move(*file));
  }
  for (const auto& [name, shard] : weight_map) {
    if (!ckpt.where_.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map lists '", name,
                                                     "' in ", shard, ", which does not hold it"));
    }
  }
  return ckpt;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

absl::StatusOr<const SafetensorsFile*> Checkpoint::file_for(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": no tensor '", name, "'"));
  }
  return &files_[it->second];
}

absl::StatusOr<TensorInfo> Checkpoint::info(const std::string& name) const {
  FP8RL_ASSIGN_OR_RETURN(const SafetensorsFile* file, file_for(name));
  return file->info(name);
}

absl::StatusOr<std::vector<uint8_t>> Checkpoint::raw(const std::string& name) const {
  FP8RL_ASSIGN_OR_RETURN(const SafetensorsFile* file, file_for(name));
  return file->raw(name);
}

absl::StatusOr<std::vector<float>> Checkpoint::read_f32(const std::string& name) const {
  FP8RL_ASSIGN_OR_RETURN(const SafetensorsFile* file, file_for(name));
  return file->read_f32(name);
}

absl::Status write_checkpoint(const std::string& dir, const std::string& config_json,
                              const SafetensorsWriter& tensors,
                              const std::vector<std::string>& copy_files) {
  std::set<std::string> seen = {kConfigFile, kSingleFile};
  for (const std::string& src : copy_files) {
    const std::string name = stdfs::path(src).filename().string();
    if (name.empty() || !seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write ", dir, ": file name of ", src, " is empty or repeated"));
    }
  }
  return write_dir_atomic(dir, [&](const std::string& tmp) -> absl::Status {
    const stdfs::path root(tmp);
    FP8RL_RETURN_IF_ERROR(write_file_atomic((root / kConfigFile).string(), config_json));
    FP8RL_RETURN_IF_ERROR(tensors.write((root / kSingleFile).string()));
    for (const std::string& src : copy_files) {
      const std::string dst = (root / stdfs::path(src).filename()).string();
      FP8RL_RETURN_IF_ERROR(copy_file(src, dst));
    }
    return absl::OkStatus();
  });
}

}  // namespace fp8rl
