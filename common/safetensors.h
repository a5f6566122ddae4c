// Safetensors I/O and Hugging Face checkpoint folders (single file or sharded with an index).
//
// Reading validates the whole header before any tensor is used: header length within the file,
// JSON well formed, every dtype known, offsets in bounds, non-overlapping and matching
// shape x dtype size. Writing goes to "<path>.tmp.<pid>" and is renamed at the end, so a failed
// write never leaves a half-written file.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace fp8rl {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t numel() const;
  int64_t nbytes() const;
};

// One .safetensors file, read fully into memory.
class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  // The same checks on the bytes of a whole file already in memory; `path` only names it in
  // errors.
  static absl::StatusOr<SafetensorsFile> FromBytes(const std::string& path,
                                                   std::vector<uint8_t> bytes);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  absl::StatusOr<TensorInfo> info(const std::string& name) const;
  // Raw little-endian bytes of a tensor.
  absl::StatusOr<std::vector<uint8_t>> raw(const std::string& name) const;
  // Any float dtype (F32/F16/BF16/F8_E4M3/F64) converted to fp32.
  absl::StatusOr<std::vector<float>> read_f32(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    TensorInfo info;
    int64_t begin = 0;  // offset of the tensor's first byte in data_ (header included)
  };
  absl::StatusOr<const Entry*> find(const std::string& name) const;

  std::string path_;
  std::shared_ptr<std::vector<uint8_t>> data_;  // the whole file (shared by copies)
  std::map<std::string, Entry> index_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors and writes one .safetensors file atomically.
class SafetensorsWriter {
 public:
  absl::Status add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                   std::vector<uint8_t> bytes);
  absl::Status add_f32(const std::string& name, std::vector<int64_t> shape,
                       const std::vector<float>& values);
  void set_metadata(const std::string& key, const std::string& value);
  // Tensors are written in name order after a header padded with spaces to a multiple of 8 bytes.
  absl::Status write(const std::string& path) const;

  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  size_t size() const { return tensors_.size(); }
  int64_t data_bytes() const;  // sum of all tensors' bytes

 private:
  struct Pending {
    TensorInfo info;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A Hugging Face checkpoint folder: config.json plus model.safetensors, or
// model.safetensors.index.json with its shards. Tensor names are unique across shards.
class Checkpoint {
 public:
  static absl::StatusOr<Checkpoint> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::string& config_json() const { return config_json_; }  // raw text of config.json
  std::vector<std::string> names() const;                          // sorted, all shards
  bool has(const std::string& name) const { return where_.count(name) > 0; }
  absl::StatusOr<TensorInfo> info(const std::string& name) const;
  absl::StatusOr<std::vector<uint8_t>> raw(const std::string& name) const;
  absl::StatusOr<std::vector<float>> read_f32(const std::string& name) const;

 private:
  absl::StatusOr<const SafetensorsFile*> file_for(const std::string& name) const;

  std::string dir_;
  std::string config_json_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, int> where_;  // tensor name -> index into files_
};

// Writes a checkpoint folder atomically: everything goes into "<dir>.tmp.<pid>", which is renamed
// to dir at the end (an existing dir is replaced only after the new one is complete). The folder
// holds config.json, model.safetensors and a copy of each of `copy_files` (by file name).
absl::Status write_checkpoint(const std::string& dir, const std::string& config_json,
                              const SafetensorsWriter& tensors,
                              const std::vector<std::string>& copy_files = {});

}  // namespace fp8rl
