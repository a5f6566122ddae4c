// Manifest building and validation, chunking and verified reassembly (see payload.h).
#include "services/weight_sync/payload.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <new>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/service/crc32c.h"

namespace fp8rl::weight_sync {
namespace {

constexpr int64_t kBlock =
    128;  // FP8 weight block edge (docs/design/fp8-recipe.md "The FP8 recipe")
constexpr char kScaleSuffix[] = "_scale_inv";

std::string shape_text(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string where(int index, const v1::TensorManifestEntry& t) {
  return absl::StrCat("manifest.tensors[", index, "] (", t.name(), ")");
}

// numel * element size, or an error when a dim is negative, larger than the version limit or
// the product overflows. The dim limit matters for empty tensors ([2^63 - 1, 0] is 0 bytes):
// without it, later shape arithmetic (FP8 block counts, numel in int64) would overflow.
absl::StatusOr<uint64_t> expected_bytes(const v1::TensorManifestEntry& t, int64_t elem_size,
                                        int index, uint64_t max_version_bytes) {
  uint64_t bytes = static_cast<uint64_t>(elem_size);
  for (int64_t d : t.shape()) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(index, t), ".shape: negative dimension ", d));
    }
    if (static_cast<uint64_t>(d) > max_version_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(where(index, t), ".shape: dimension ", d,
                                                     " exceeds the version limit of ",
                                                     max_version_bytes, " bytes"));
    }
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(index, t), ".shape: ", shape_text(t.shape()), " is too large"));
    }
  }
  return bytes;
}

absl::Status check_fp8_scales(const v1::VersionManifest& manifest,
                              const std::map<std::string, int, std::less<>>& index_of) {
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    const v1::TensorManifestEntry& t = manifest.tensors(i);
    if (t.dtype() != dtype_name(DType::kF8E4M3)) continue;
    if (t.shape_size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(i, t), ".shape: an F8_E4M3 weight must be 2-D [N, K], got ",
                       shape_text(t.shape())));
    }
    const std::string scale_name = absl::StrCat(t.name(), kScaleSuffix);
    auto it = index_of.find(scale_name);
    if (it == index_of.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(i, t), ": F8_E4M3 weight without its scale tensor '", scale_name, "'"));
    }
    const v1::TensorManifestEntry& s = manifest.tensors(it->second);
    const int64_t rows = (t.shape(0) + kBlock - 1) / kBlock;
    const int64_t cols = (t.shape(1) + kBlock - 1) / kBlock;
    if (s.dtype() != dtype_name(DType::kF32) || s.shape_size() != 2 || s.shape(0) != rows ||
        s.shape(1) != cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(it->second, s), ": expected F32 [", rows, ", ", cols, "] block scales for ",
          t.name(), " ", shape_text(t.shape()), ", got ", s.dtype(), " ", shape_text(s.shape())));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view format_label(v1::WeightFormat format) {
  switch (format) {
    case v1::WEIGHT_FORMAT_FP8:
      return "fp8";
    case v1::WEIGHT_FORMAT_BF16:
      return "bf16";
    default:
      return "unspecified";
  }
}

absl::Status validate_manifest(const v1::VersionManifest& manifest, uint64_t max_version_bytes) {
  if (manifest.version() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest.version: must be > 0, got ", manifest.version()));
  }
  if (manifest.format() != v1::WEIGHT_FORMAT_FP8 && manifest.format() != v1::WEIGHT_FORMAT_BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest.format: must be WEIGHT_FORMAT_FP8 or WEIGHT_FORMAT_BF16, got ",
                     v1::WeightFormat_Name(manifest.format())));
  }
  const auto config = nlohmann::json::parse(manifest.model_config_json(), nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError("manifest.model_config_json: not a JSON object");
  }
  if (manifest.tensors_size() == 0) {
    return absl::InvalidArgumentError("manifest.tensors: empty");
  }
  std::map<std::string, int, std::less<>> index_of;
  uint64_t offset = 0;
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    const v1::TensorManifestEntry& t = manifest.tensors(i);
    if (t.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("manifest.tensors[", i, "].name: empty"));
    }
    if (!index_of.emplace(t.name(), i).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(i, t), ".name: duplicate of manifest.tensors[", index_of[t.name()], "]"));
    }
    absl::StatusOr<DType> dtype = parse_dtype(t.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(i, t), ".dtype: unknown dtype '", t.dtype(), "'"));
    }
    if (manifest.format() == v1::WEIGHT_FORMAT_BF16 && *dtype == DType::kF8E4M3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(i, t), ".dtype: F8_E4M3 in a WEIGHT_FORMAT_BF16 version"));
    }
    absl::StatusOr<uint64_t> want = expected_bytes(t, dtype_size(*dtype), i, max_version_bytes);
    if (!want.ok()) return want.status();
    if (t.byte_size() != *want) {
      return absl::InvalidArgumentError(absl::StrCat(where(i, t), ".byte_size: ", t.byte_size(),
                                                     " but ", t.dtype(), " ", shape_text(t.shape()),
                                                     " is ", *want, " bytes"));
    }
    if (t.offset() != offset) {
      return absl::InvalidArgumentError(absl::StrCat(where(i, t), ".offset: ", t.offset(),
                                                     ", expected ", offset,
                                                     " (tensors are contiguous, in order)"));
    }
    if (__builtin_add_overflow(offset, t.byte_size(), &offset) || offset > max_version_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "manifest.tensors: payload exceeds the limit of ", max_version_bytes, " bytes"));
    }
  }
  if (manifest.total_bytes() != offset) {
    return absl::InvalidArgumentError(absl::StrCat("manifest.total_bytes: ", manifest.total_bytes(),
                                                   " but the tensors add up to ", offset));
  }
  if (manifest.format() == v1::WEIGHT_FORMAT_FP8) return check_fp8_scales(manifest, index_of);
  return absl::OkStatus();
}

absl::StatusOr<v1::VersionManifest> build_manifest(const model::WeightSet& set,
                                                   v1::WeightFormat format) {
  if (absl::Status s = model::validate_weight_set(set); !s.ok()) return s;
  v1::VersionManifest manifest;
  manifest.set_version(set.version);
  manifest.set_format(format);
  manifest.set_model_config_json(set.config_json);
  uint64_t offset = 0;
  for (const model::NamedTensor& t : set.tensors) {
    v1::TensorManifestEntry* e = manifest.add_tensors();
    e->set_name(t.name);
    e->set_dtype(std::string(dtype_name(t.dtype)));
    for (int64_t d : t.shape) e->add_shape(d);
    e->set_byte_size(t.bytes.size());
    e->set_offset(offset);
    e->set_crc32c(service::crc32c(t.bytes.data(), t.bytes.size()));
    offset += t.bytes.size();
  }
  manifest.set_total_bytes(offset);
  if (absl::Status s = validate_manifest(manifest); !s.ok()) return s;
  return manifest;
}

absl::Status for_each_chunk(const model::WeightSet& set, uint64_t chunk_bytes,
                            const std::function<absl::Status(uint64_t, std::string_view)>& emit) {
  if (chunk_bytes == 0) return absl::InvalidArgumentError("chunk_bytes: must be > 0");
  std::string buffer;
  buffer.reserve(chunk_bytes);
  uint64_t offset = 0;  // payload offset of buffer[0]
  for (const model::NamedTensor& t : set.tensors) {
    const char* p = reinterpret_cast<const char*>(t.bytes.data());
    uint64_t left = t.bytes.size();
    while (left > 0) {
      const uint64_t n = std::min<uint64_t>(left, chunk_bytes - buffer.size());
      buffer.append(p, n);
      p += n;
      left -= n;
      if (buffer.size() == chunk_bytes) {
        if (absl::Status s = emit(offset, buffer); !s.ok()) return s;
        offset += buffer.size();
        buffer.clear();
      }
    }
  }
  if (!buffer.empty()) return emit(offset, buffer);
  return absl::OkStatus();
}

bool is_multipart(const v1::VersionManifest& manifest) {
  return manifest.part_count() > 1 || manifest.part_offsets_size() > 0 || manifest.part_index() > 0;
}

absl::StatusOr<PartRange> part_range(const v1::VersionManifest& manifest) {
  const uint64_t total = manifest.total_bytes();
  const int num_tensors = manifest.tensors_size();
  if (!is_multipart(manifest)) return PartRange{0, total, 0, num_tensors};
  const uint32_t count = manifest.part_count();
  if (count < 1 || count > kMaxUploadParts) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest.part_count: must be in [1, ", kMaxUploadParts, "], got ", count));
  }
  if (manifest.part_offsets_size() != static_cast<int>(count)) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest.part_offsets: ", manifest.part_offsets_size(),
                     " offsets for part_count ", count, " (one per part)"));
  }
  if (manifest.part_index() >= count) {
    return absl::InvalidArgumentError(absl::StrCat("manifest.part_index: ", manifest.part_index(),
                                                   " is out of range [0, ", count, ")"));
  }
  if (manifest.upload_id() == 0) {
    return absl::InvalidArgumentError(
        "manifest.upload_id: must be non-zero in a parallel upload (one random id per attempt, "
        "the same in every part)");
  }
  if (manifest.part_offsets(0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest.part_offsets[0]: must be 0, got ", manifest.part_offsets(0)));
  }
  // Walk the tensors once, matching each part offset to a tensor's offset.
  PartRange out;
  int t = 0;
  for (uint32_t p = 0; p < count; ++p) {
    const uint64_t at = manifest.part_offsets(static_cast<int>(p));
    if (p > 0 && at <= manifest.part_offsets(static_cast<int>(p) - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "manifest.part_offsets[", p, "]: ", at, " overlaps part ", p - 1, " starting at ",
          manifest.part_offsets(static_cast<int>(p) - 1), " (offsets must strictly increase)"));
    }
    if (at >= total) {
      return absl::InvalidArgumentError(absl::StrCat("manifest.part_offsets[", p, "]: ", at,
                                                     " is not below total_bytes ", total));
    }
    // The first tensor starting at `at` (zero-size tensors at a boundary go to the later part).
    // (validate_manifest made the tensors contiguous, so a tensor starting at `at` means the one
    // before it ends there.)
    while (t < num_tensors && manifest.tensors(t).offset() < at) ++t;
    if (t == num_tensors || manifest.tensors(t).offset() != at) {
      return absl::InvalidArgumentError(absl::StrCat(
          "manifest.part_offsets[", p, "]: ", at, " splits ", where(t - 1, manifest.tensors(t - 1)),
          " (a part must start at a tensor's offset)"));
    }
    if (p == manifest.part_index()) {
      out.begin = at;
      out.first_tensor = t;
    } else if (p == manifest.part_index() + 1) {
      out.end = at;
      out.end_tensor = t;
    }
  }
  if (manifest.part_index() + 1 == count) {
    out.end = total;
    out.end_tensor = num_tensors;
  }
  return out;
}

absl::Status plan_parts(v1::VersionManifest* manifest, uint32_t parts) {
  if (parts < 1 || parts > kMaxUploadParts) {
    return absl::InvalidArgumentError(
        absl::StrCat("parts: must be in [1, ", kMaxUploadParts, "], got ", parts));
  }
  manifest->clear_part_offsets();
  manifest->set_part_index(0);
  manifest->set_part_count(parts);
  if (manifest->upload_id() == 0) {
    // Later attempts get larger ids (the service refuses parts of an earlier attempt).
    manifest->set_upload_id(
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count()));
  }
  const uint64_t total = manifest->total_bytes();
  // Part p starts at the first tensor offset at or past p * total / parts that is past the
  // previous part's start, so every part holds at least one non-empty tensor.
  manifest->add_part_offsets(0);
  int t = 0;
  for (uint32_t p = 1; p < parts; ++p) {
    const uint64_t want = total / parts * p + (total % parts) * p / parts;
    const uint64_t prev = manifest->part_offsets(static_cast<int>(p) - 1);
    while (t < manifest->tensors_size() &&
           (manifest->tensors(t).offset() < want || manifest->tensors(t).offset() <= prev)) {
      ++t;
    }
    if (t == manifest->tensors_size() || manifest->tensors(t).offset() >= total) {
      const uint32_t asked = parts;
      manifest->clear_part_offsets();
      manifest->set_part_count(0);
      return absl::InvalidArgumentError(
          absl::StrCat("parts: ", asked, " parts need ", asked,
                       " tensors to start them, but the version has too few non-empty tensors"));
    }
    manifest->add_part_offsets(manifest->tensors(t).offset());
  }
  if (parts == 1) {
    manifest->clear_part_offsets();
    manifest->set_part_count(0);
    manifest->set_upload_id(0);
  }
  return absl::OkStatus();
}

std::string manifest_difference(const v1::VersionManifest& a, const v1::VersionManifest& b) {
  if (a.version() != b.version()) return "version";
  if (a.format() != b.format()) return "format";
  if (a.model_config_json() != b.model_config_json()) return "model_config_json";
  if (a.total_bytes() != b.total_bytes()) return "total_bytes";
  if (a.part_count() != b.part_count()) return "part_count";
  if (a.upload_id() != b.upload_id()) return "upload_id";
  if (a.part_offsets_size() != b.part_offsets_size()) return "part_offsets";
  for (int i = 0; i < a.part_offsets_size(); ++i) {
    if (a.part_offsets(i) != b.part_offsets(i)) return absl::StrCat("part_offsets[", i, "]");
  }
  if (a.tensors_size() != b.tensors_size()) return "tensors";
  for (int i = 0; i < a.tensors_size(); ++i) {
    const v1::TensorManifestEntry& x = a.tensors(i);
    const v1::TensorManifestEntry& y = b.tensors(i);
    const std::string at = absl::StrCat("tensors[", i, "].");
    if (x.name() != y.name()) return at + "name";
    if (x.dtype() != y.dtype()) return at + "dtype";
    if (!std::equal(x.shape().begin(), x.shape().end(), y.shape().begin(), y.shape().end())) {
      return at + "shape";
    }
    if (x.byte_size() != y.byte_size()) return at + "byte_size";
    if (x.offset() != y.offset()) return at + "offset";
    if (x.crc32c() != y.crc32c()) return at + "crc32c";
  }
  return "";
}

std::string PayloadAssembler::part_note() const {
  if (begin_ == 0 && end_ == manifest_.total_bytes()) return "";
  return absl::StrCat(" (part [", begin_, ", ", end_, "))");
}

void PayloadAssembler::reset() {
  active_ = false;
  manifest_.Clear();
  payload_ = std::string();
  target_ = {};
  received_ = 0;
  begin_ = 0;
  end_ = 0;
  end_tensor_ = 0;
  landing_ = 0;
  next_tensor_ = 0;
  crc_ = 0;
  crc_upto_ = 0;
}

absl::Status PayloadAssembler::begin(v1::VersionManifest manifest, std::string buffer) {
  reset();
  if (absl::Status s = validate_manifest(manifest, max_version_bytes_); !s.ok()) return s;
  payload_ = std::move(buffer);
  payload_.clear();
  try {
    payload_.reserve(manifest.total_bytes());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("manifest.total_bytes: cannot allocate ", manifest.total_bytes(), " bytes"));
  }
  manifest_ = std::move(manifest);
  end_ = manifest_.total_bytes();
  end_tensor_ = manifest_.tensors_size();
  active_ = true;
  // Empty tensors at the front are complete already.
  return check_finished_tensors();
}

absl::Status PayloadAssembler::begin_into(v1::VersionManifest manifest, std::span<char> target) {
  reset();
  if (absl::Status s = validate_manifest(manifest, max_version_bytes_); !s.ok()) return s;
  if (manifest.total_bytes() > target.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("manifest.total_bytes: ", manifest.total_bytes(),
                     " bytes do not fit the receive buffer of ", target.size(), " bytes"));
  }
  manifest_ = std::move(manifest);
  target_ = target;
  end_ = manifest_.total_bytes();
  end_tensor_ = manifest_.tensors_size();
  active_ = true;
  return check_finished_tensors();
}

absl::Status PayloadAssembler::begin_part_into(v1::VersionManifest manifest, std::span<char> target,
                                               const PartRange& range) {
  if (absl::Status s = begin_into(std::move(manifest), target); !s.ok()) return s;
  if (range.begin > range.end || range.end > manifest_.total_bytes() || range.first_tensor < 0 ||
      range.first_tensor > range.end_tensor || range.end_tensor > manifest_.tensors_size()) {
    absl::Status s = absl::InvalidArgumentError(
        absl::StrCat("part range [", range.begin, ", ", range.end, ") does not fit version ",
                     manifest_.version(), " of ", manifest_.total_bytes(), " bytes"));
    reset();
    return s;
  }
  begin_ = range.begin;
  end_ = range.end;
  received_ = range.begin;
  crc_upto_ = range.begin;
  next_tensor_ = range.first_tensor;
  end_tensor_ = range.end_tensor;
  // Empty tensors at the part's start are complete already.
  if (absl::Status s = check_finished_tensors(); !s.ok()) {
    reset();
    return s;
  }
  return absl::OkStatus();
}

absl::Status PayloadAssembler::check_chunk(int64_t version, uint64_t offset, uint64_t size) {
  if (!active_) {
    return absl::InvalidArgumentError("chunk before a manifest (the first message is a manifest)");
  }
  absl::Status error;
  if (version != manifest_.version()) {
    error = absl::InvalidArgumentError(absl::StrCat(
        "chunk.version: ", version, " but the manifest is version ", manifest_.version()));
  } else if (offset > received_) {
    error = absl::InvalidArgumentError(absl::StrCat("chunk.offset: gap: chunk starts at ", offset,
                                                    " but ", received_ - begin_,
                                                    " bytes were received", part_note()));
  } else if (offset < received_) {
    error = absl::InvalidArgumentError(absl::StrCat("chunk.offset: overlap: chunk starts at ",
                                                    offset, " but ", received_ - begin_,
                                                    " bytes were received", part_note()));
  } else if (size == 0) {
    error = absl::InvalidArgumentError(absl::StrCat("chunk.data: empty chunk at offset ", offset));
  } else if (size > kMaxChunkBytes) {
    error = absl::InvalidArgumentError(
        absl::StrCat("chunk.data: ", size, " bytes, more than the limit of ", kMaxChunkBytes));
  } else if (size > end_ - received_) {
    error = end_ == manifest_.total_bytes() && begin_ == 0
                ? absl::InvalidArgumentError(absl::StrCat(
                      "chunk.data: runs past total_bytes: ", received_ + size, " > ", end_))
                : absl::InvalidArgumentError(
                      absl::StrCat("chunk.data: runs past the part's end: ", received_ + size,
                                   " > ", end_, part_note()));
  }
  if (!error.ok()) reset();
  return error;
}

absl::StatusOr<char*> PayloadAssembler::chunk_target(int64_t version, uint64_t offset,
                                                     uint64_t size) {
  if (active_ && target_.empty()) {
    return absl::FailedPreconditionError("chunk_target: the version was not begun with begin_into");
  }
  if (absl::Status s = check_chunk(version, offset, size); !s.ok()) return s;
  landing_ = size;
  return target_.data() + received_;
}

absl::Status PayloadAssembler::commit_chunk() {
  if (!active_ || landing_ == 0) {
    return absl::FailedPreconditionError("commit_chunk: no chunk_target in progress");
  }
  received_ += landing_;
  landing_ = 0;
  if (absl::Status s = check_finished_tensors(); !s.ok()) {
    reset();
    return s;
  }
  return absl::OkStatus();
}

absl::Status PayloadAssembler::add(const v1::WeightChunk& chunk) {
  if (absl::Status s = check_chunk(chunk.version(), chunk.offset(), chunk.data().size()); !s.ok()) {
    return s;
  }
  if (target_.empty()) {
    payload_.append(chunk.data());
  } else {
    std::memcpy(target_.data() + received_, chunk.data().data(), chunk.data().size());
  }
  received_ += chunk.data().size();
  if (absl::Status s = check_finished_tensors(); !s.ok()) {
    reset();
    return s;
  }
  return absl::OkStatus();
}

absl::Status PayloadAssembler::check_finished_tensors() {
  while (next_tensor_ < end_tensor_) {
    const v1::TensorManifestEntry& t = manifest_.tensors(next_tensor_);
    const uint64_t end = t.offset() + t.byte_size();
    const uint64_t upto = std::min(received_, end);
    if (upto > crc_upto_) {
      crc_ = service::crc32c(bytes() + crc_upto_, upto - crc_upto_, crc_);
      crc_upto_ = upto;
    }
    if (received_ < end) break;
    if (crc_ != t.crc32c()) {
      return absl::DataLossError(
          absl::StrFormat("tensor %s: crc32c mismatch: manifest says %08x, payload has %08x",
                          t.name(), t.crc32c(), crc_));
    }
    ++next_tensor_;
    crc_ = 0;
  }
  return absl::OkStatus();
}

absl::StatusOr<AssembledVersion> PayloadAssembler::finish() {
  if (!active_) return absl::InvalidArgumentError("no version in progress (no manifest)");
  if (received_ != end_) {
    const absl::Status s = absl::DataLossError(
        absl::StrCat("incomplete payload for version ", manifest_.version(), ": received ",
                     received_ - begin_, " of ", end_ - begin_, " bytes", part_note()));
    reset();
    return s;
  }
  AssembledVersion out{std::move(manifest_), std::move(payload_)};
  reset();
  return out;
}

absl::StatusOr<model::WeightView> to_weight_view(const v1::VersionManifest& manifest,
                                                 std::span<const char> payload) {
  if (payload.size() != manifest.total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("payload: ", payload.size(),
                                                   " bytes but manifest.total_bytes is ",
                                                   manifest.total_bytes()));
  }
  model::WeightView view;
  view.version = manifest.version();
  view.config_json = manifest.model_config_json();
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    const v1::TensorManifestEntry& e = manifest.tensors(i);
    absl::StatusOr<DType> dtype = parse_dtype(e.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(i, e), ".dtype: unknown dtype '", e.dtype(), "'"));
    }
    if (e.offset() > payload.size() || e.byte_size() > payload.size() - e.offset()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(i, e), ": bytes lie outside the payload"));
    }
    const auto* p = reinterpret_cast<const uint8_t*>(payload.data() + e.offset());
    if (absl::Status s = view.add({e.name(),
                                   *dtype,
                                   {e.shape().begin(), e.shape().end()},
                                   {p, static_cast<size_t>(e.byte_size())}});
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where(i, e), ": ", s.message()));
    }
  }
  return view;
}

absl::StatusOr<model::WeightSet> to_weight_set(const v1::VersionManifest& manifest,
                                               std::string_view payload) {
  absl::StatusOr<model::WeightView> view =
      to_weight_view(manifest, std::span<const char>(payload.data(), payload.size()));
  if (!view.ok()) return view.status();
  model::WeightSet set;
  set.version = view->version;
  set.config_json = view->config_json;
  set.tensors.reserve(view->tensors().size());
  for (const model::TensorView& t : view->tensors()) {
    set.tensors.push_back({t.name, t.dtype, t.shape, {t.bytes.begin(), t.bytes.end()}});
  }
  return set;
}

}  // namespace fp8rl::weight_sync
