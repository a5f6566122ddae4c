// How the trainer hands a re-quantized policy version to the weight-sync service. An interface,
// so the Trainer can be tested with an in-memory recorder as well as the real gRPC client.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/service/security.h"
#include "fp8rl/v1/common.pb.h"
#include "fp8rl/v1/weight_sync.pb.h"
#include "model/weight_set.h"
#include "services/weight_sync/same_host.h"

namespace fp8rl::trainer {

class WeightPublisher {
 public:
  virtual ~WeightPublisher() = default;
  // Newest version the weight-sync service at `address` holds (0 when none); the trainer
  // publishes above it, so a fresh trainer never collides with an earlier job's versions.
  virtual absl::StatusOr<int64_t> latest_version(const std::string& address) = 0;
  // Uploads `set` (its version, config_json and tensors) as `format`; returns the bytes received.
  virtual absl::StatusOr<uint64_t> upload(const std::string& address, const model::WeightSet& set,
                                          v1::WeightFormat format) = 0;
  // One part of a version, what each rank of a sharded trainer group uploads
  // (weight_sync::upload_part): `manifest` is the whole version's, with the part fields set and
  // part_index naming this part; `tensors` are that part's. Returns once every part ended and
  // weight sync stored the version (this part's bytes), or the error that failed it.
  virtual absl::StatusOr<uint64_t> upload_part(const std::string& address,
                                               const v1::VersionManifest& manifest,
                                               std::span<const model::NamedTensor> tensors) = 0;
};

// The real thing: services/weight_sync/client.h over gRPC channels per address (cached).
// `timeout` bounds each call; `security` gives TLS and the cluster token (security.h).
// `upload_streams` > 1 uploads each version as that many parts on as many concurrent streams,
// each on its own connection (weight_sync::upload_parallel; a version with fewer non-empty
// tensors than streams is refused with INVALID_ARGUMENT); 1 is the single-stream upload.
// `same_host` auto: a single-stream upload to a weight sync that runs on this host and takes
// same-host uploads (its GetStatus says so) is handed over as a file in its same-host directory
// (weight_sync::upload_same_host). One that is refused (FAILED_PRECONDITION or UNAVAILABLE) is
// logged and sent over the stream, and so are the later versions to that address until its
// GetStatus (latest_version, asked before each publish) offers something else than it did right
// after the refusal: a weight sync restarted with --same-host auto after off, or back after being
// unreachable, gets files again; one that keeps offering the directory it refused stays on the
// stream. Each change is logged once.
std::unique_ptr<WeightPublisher> make_grpc_weight_publisher(
    std::chrono::milliseconds timeout, service::ClientSecurity security = {},
    uint32_t upload_streams = 1,
    weight_sync::SameHostMode same_host = weight_sync::SameHostMode::kAuto);

}  // namespace fp8rl::trainer
