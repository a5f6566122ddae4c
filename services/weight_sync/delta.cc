// Delta encoding, validation, reconstruction and chunk reassembly (see delta.h).
#include "services/weight_sync/delta.h"

#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"
#include "common/service/crc32c.h"

namespace fp8rl::weight_sync {
namespace {

std::string where(int index, const v1::TensorManifestEntry& t) {
  return absl::StrCat("delta.tensors[", index, "] (", t.name(), ")");
}

// Bytes per element of a validated manifest entry.
size_t element_size(const v1::TensorManifestEntry& t) {
  absl::StatusOr<DType> dtype = parse_dtype(t.dtype());
  return dtype.ok() ? static_cast<size_t>(dtype_size(*dtype)) : 1;
}

// planes[b * n + i] = (a XOR c)[i * es + b]: n elements of es bytes, byte b of every element in
// plane b. Bytes that rarely change (the high byte of a BF16, the sign/exponent byte of an F32)
// then form long zero runs.
void xor_to_planes(const uint8_t* a, const uint8_t* c, size_t bytes, size_t es, uint8_t* planes) {
  const size_t n = bytes / es;
  if (es == 1) {
    for (size_t i = 0; i < n; ++i) planes[i] = a[i] ^ c[i];
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    for (size_t b = 0; b < es; ++b) planes[b * n + i] = a[i * es + b] ^ c[i * es + b];
  }
}

// The inverse: out[i * es + b] = planes[b * n + i] XOR base[i * es + b].
void planes_to_xor(const uint8_t* planes, const uint8_t* base, size_t bytes, size_t es,
                   uint8_t* out) {
  const size_t n = bytes / es;
  if (es == 1) {
    for (size_t i = 0; i < n; ++i) out[i] = planes[i] ^ base[i];
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    for (size_t b = 0; b < es; ++b) out[i * es + b] = planes[b * n + i] ^ base[i * es + b];
  }
}

}  // namespace

absl::StatusOr<EncodedDelta> encode_delta(const v1::VersionManifest& base,
                                          std::string_view base_payload,
                                          const v1::VersionManifest& target,
                                          std::string_view target_payload, int zstd_level) {
  const auto start = std::chrono::steady_clock::now();
  if (base_payload.size() != base.total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("base payload: ", base_payload.size(),
                                                   " bytes but base.total_bytes is ",
                                                   base.total_bytes()));
  }
  if (target_payload.size() != target.total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("target payload: ", target_payload.size(),
                                                   " bytes but target.total_bytes is ",
                                                   target.total_bytes()));
  }
  if (base.version() >= target.version()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "base.version: ", base.version(), " is not older than target.version ", target.version()));
  }
  std::map<std::string_view, const v1::TensorManifestEntry*> base_by_name;
  for (const v1::TensorManifestEntry& t : base.tensors()) base_by_name.emplace(t.name(), &t);

  EncodedDelta out;
  v1::DeltaManifest& m = out.manifest;
  m.set_base_version(base.version());
  m.set_base_total_bytes(base.total_bytes());
  *m.mutable_target() = target;
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
  if (cctx == nullptr) return absl::InternalError("zstd: cannot create a compression context");
  std::vector<uint8_t> planes;
  for (const v1::TensorManifestEntry& t : target.tensors()) {
    v1::TensorDelta* d = m.add_tensors();
    d->set_offset(out.payload.size());
    const auto* bytes = reinterpret_cast<const uint8_t*>(target_payload.data() + t.offset());
    auto it = base_by_name.find(t.name());
    bool encoded = false;
    if (it != base_by_name.end() && it->second->dtype() == t.dtype() &&
        std::equal(it->second->shape().begin(), it->second->shape().end(), t.shape().begin(),
                   t.shape().end()) &&
        t.byte_size() > 0) {
      const auto* old =
          reinterpret_cast<const uint8_t*>(base_payload.data() + it->second->offset());
      planes.resize(t.byte_size());
      xor_to_planes(bytes, old, t.byte_size(), element_size(t), planes.data());
      const size_t bound = ZSTD_compressBound(t.byte_size());
      const size_t before = out.payload.size();
      out.payload.resize(before + bound);
      const size_t n = ZSTD_compressCCtx(cctx.get(), out.payload.data() + before, bound,
                                         planes.data(), planes.size(), zstd_level);
      if (ZSTD_isError(n)) {
        return absl::InternalError(
            absl::StrCat("zstd: compressing ", t.name(), ": ", ZSTD_getErrorName(n)));
      }
      out.payload.resize(before + n);
      if (n < t.byte_size()) {
        d->set_encoding(v1::TENSOR_ENCODING_XOR_ZSTD);
        d->set_base_offset(it->second->offset());
        encoded = true;
      } else {
        out.payload.resize(before);
      }
    }
    if (!encoded) {
      d->set_encoding(v1::TENSOR_ENCODING_RAW);
      out.payload.append(reinterpret_cast<const char*>(bytes), t.byte_size());
    }
    d->set_byte_size(out.payload.size() - d->offset());
  }
  m.set_total_bytes(out.payload.size());
  out.payload.shrink_to_fit();
  out.encode_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

absl::Status validate_delta_manifest(const v1::DeltaManifest& delta, uint64_t max_version_bytes) {
  if (!delta.has_target()) return absl::InvalidArgumentError("delta.target: missing");
  if (absl::Status s = validate_manifest(delta.target(), max_version_bytes); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("delta.target: ", s.message()));
  }
  if (delta.base_version() <= 0 || delta.base_version() >= delta.target().version()) {
    return absl::InvalidArgumentError(absl::StrCat("delta.base_version: must be in (0, ",
                                                   delta.target().version(), "), got ",
                                                   delta.base_version()));
  }
  if (delta.tensors_size() != delta.target().tensors_size()) {
    return absl::InvalidArgumentError(absl::StrCat("delta.tensors: ", delta.tensors_size(),
                                                   " entries for ", delta.target().tensors_size(),
                                                   " target tensors"));
  }
  uint64_t offset = 0;
  for (int i = 0; i < delta.tensors_size(); ++i) {
    const v1::TensorDelta& d = delta.tensors(i);
    const v1::TensorManifestEntry& t = delta.target().tensors(i);
    if (d.encoding() != v1::TENSOR_ENCODING_RAW && d.encoding() != v1::TENSOR_ENCODING_XOR_ZSTD) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(i, t), ".encoding: unknown value ", static_cast<int>(d.encoding())));
    }
    if (d.offset() != offset) {
      return absl::InvalidArgumentError(absl::StrCat(where(i, t), ".offset: ", d.offset(),
                                                     ", expected ", offset,
                                                     " (entries are contiguous, in order)"));
    }
    if (d.encoding() == v1::TENSOR_ENCODING_RAW && d.byte_size() != t.byte_size()) {
      return absl::InvalidArgumentError(absl::StrCat(where(i, t), ".byte_size: ", d.byte_size(),
                                                     " for a RAW tensor of ", t.byte_size(),
                                                     " bytes"));
    }
    if (__builtin_add_overflow(offset, d.byte_size(), &offset) || offset > max_version_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("delta.tensors: payload exceeds the limit of ",
                                                     max_version_bytes, " bytes"));
    }
  }
  if (delta.total_bytes() != offset) {
    return absl::InvalidArgumentError(absl::StrCat("delta.total_bytes: ", delta.total_bytes(),
                                                   " but the entries add up to ", offset));
  }
  return absl::OkStatus();
}

absl::Status apply_delta(const v1::DeltaManifest& delta, std::span<const uint8_t> base,
                         std::string_view delta_payload, std::span<uint8_t> out) {
  const v1::VersionManifest& target = delta.target();
  if (out.size() != target.total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "out: ", out.size(), " bytes but target.total_bytes is ", target.total_bytes()));
  }
  if (delta_payload.size() != delta.total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("delta payload: ", delta_payload.size(),
                                                   " bytes but delta.total_bytes is ",
                                                   delta.total_bytes()));
  }
  if (base.size() != delta.base_total_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat("base: ", base.size(), " bytes but version ",
                                                      delta.base_version(), " has ",
                                                      delta.base_total_bytes()));
  }
  std::vector<uint8_t> planes;
  for (int i = 0; i < target.tensors_size(); ++i) {
    const v1::TensorManifestEntry& t = target.tensors(i);
    const v1::TensorDelta& d = delta.tensors(i);
    const char* src = delta_payload.data() + d.offset();
    uint8_t* dst = out.data() + t.offset();
    if (d.encoding() == v1::TENSOR_ENCODING_RAW) {
      if (t.byte_size() > 0) std::memcpy(dst, src, t.byte_size());
    } else {
      if (d.base_offset() > base.size() || t.byte_size() > base.size() - d.base_offset()) {
        return absl::FailedPreconditionError(
            absl::StrCat(where(i, t), ".base_offset: ", d.base_offset(), " + ", t.byte_size(),
                         " bytes lie outside the base (", base.size(), " bytes)"));
      }
      planes.resize(t.byte_size());
      const size_t n = ZSTD_decompress(planes.data(), planes.size(), src, d.byte_size());
      if (ZSTD_isError(n) || n != t.byte_size()) {
        return absl::DataLossError(
            absl::StrCat(where(i, t), ": zstd frame does not decode to ", t.byte_size(),
                         " bytes: ", ZSTD_isError(n) ? ZSTD_getErrorName(n) : absl::StrCat(n)));
      }
      planes_to_xor(planes.data(), base.data() + d.base_offset(), t.byte_size(), element_size(t),
                    dst);
    }
    const uint32_t crc = service::crc32c(dst, t.byte_size());
    if (crc != t.crc32c()) {
      return absl::DataLossError(absl::StrFormat(
          "tensor %s: crc32c mismatch after applying the delta against version %d: manifest "
          "says %08x, reconstruction has %08x",
          t.name(), delta.base_version(), t.crc32c(), crc));
    }
  }
  return absl::OkStatus();
}

void DeltaReceiver::reset() {
  active_ = false;
  delta_.Clear();
  payload_ = std::string();
}

absl::Status DeltaReceiver::begin(v1::DeltaManifest delta) {
  reset();
  if (absl::Status s = validate_delta_manifest(delta, max_version_bytes_); !s.ok()) return s;
  payload_.reserve(delta.total_bytes());
  delta_ = std::move(delta);
  active_ = true;
  return absl::OkStatus();
}

absl::Status DeltaReceiver::add(const v1::WeightChunk& chunk) {
  if (!active_) return absl::InvalidArgumentError("delta chunk before a delta manifest");
  const uint64_t received = payload_.size();
  absl::Status error;
  if (chunk.version() != delta_.target().version()) {
    error = absl::InvalidArgumentError(absl::StrCat("chunk.version: ", chunk.version(),
                                                    " but the delta is for version ",
                                                    delta_.target().version()));
  } else if (chunk.offset() != received) {
    error = absl::InvalidArgumentError(absl::StrCat("chunk.offset: ", chunk.offset(), " but ",
                                                    received, " delta bytes were received"));
  } else if (chunk.data().empty() || chunk.data().size() > kMaxChunkBytes) {
    error = absl::InvalidArgumentError(
        absl::StrCat("chunk.data: ", chunk.data().size(), " bytes, need 1 to ", kMaxChunkBytes));
  } else if (chunk.data().size() > delta_.total_bytes() - received) {
    error = absl::InvalidArgumentError(absl::StrCat(
        "chunk.data: runs past the delta's total_bytes: ", received + chunk.data().size(), " > ",
        delta_.total_bytes()));
  }
  if (!error.ok()) {
    reset();
    return error;
  }
  payload_.append(chunk.data());
  return absl::OkStatus();
}

}  // namespace fp8rl::weight_sync
