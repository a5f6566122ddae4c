// The fp8rl.v1.WeightSyncService implementation: accepts verified uploads from the trainer into
// the version store, pushes each new version to every Subscribe stream, records worker acks, and
// reports status. Corrupt or incomplete uploads are rejected before they reach the store, so
// nothing unverified is ever served.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "common/service/auth.h"
#include "fp8rl/v1/weight_sync.grpc.pb.h"
#include "services/weight_sync/delta.h"
#include "services/weight_sync/fanout.h"
#include "services/weight_sync/part_assembly.h"
#include "services/weight_sync/payload.h"
#include "services/weight_sync/payload_pool.h"
#include "services/weight_sync/push_choice.h"
#include "services/weight_sync/same_host.h"
#include "services/weight_sync/send_pacer.h"
#include "services/weight_sync/version_store.h"
#include "services/weight_sync/weight_sync_metrics.h"
#include "services/weight_sync/worker_table.h"

namespace fp8rl::weight_sync {

class PushSink;  // where a Subscribe stream's messages go (weight_sync_service.cc)

struct WeightSyncOptions {
  int keep_versions = 2;                                 // versions kept in memory (>= 1)
  uint64_t chunk_bytes = kDefaultChunkBytes;             // size of pushed chunks
  uint64_t max_version_bytes = kDefaultMaxVersionBytes;  // larger uploads are rejected
  // How often an idle Subscribe stream checks whether its client went away.
  std::chrono::milliseconds poll_interval{200};
  // Push a version as a delta against the one a worker acknowledged when the delta is at most
  // delta_max_fraction of the full payload (only to workers that subscribe with accept_delta): a
  // delta that saves little is not worth the worker's decode time.
  bool deltas = true;
  // With deltas: push the kind that measurably reached each worker sooner (push_choice.h), or a
  // delta every time one is possible (the earlier rule, kept for tests and comparisons).
  enum class DeltaChoice { kMeasured, kAlways };
  DeltaChoice delta_choice = DeltaChoice::kMeasured;
  double delta_max_fraction = 0.9;                // in (0, 1]
  int delta_zstd_level = kDefaultDeltaZstdLevel;  // in [1, 19]
  // Receive each upload into the payload buffer of a version the store evicted (payload_pool.h),
  // at the cost of holding one extra version's bytes while idle.
  bool reuse_payload_buffers = true;
  // Cut-through: a full version is pushed to subscribers while its upload is still arriving
  // (each chunk once the upload's bytes up to its end are in and their tensors verified), so the
  // upload and the push overlap instead of running one after the other. Needs the zero-copy
  // receive (set_zero_copy_receive); deltas still wait for the whole version.
  bool cut_through = true;
  // direct: every Subscribe stream gets its own copy. chain / tree:K: a worker that subscribes
  // with a relay_address is told (RelayRedirect) to take versions from the relay before it in the
  // RelayTopology; only the first K are fed from here (docs/design/weight-sync-fanout.md).
  Fanout fanout;
  // False for a worker's relay (relay.h): its versions come from the worker's own subscriber
  // (LocalUpload), and UploadVersion is refused with FAILED_PRECONDITION.
  bool accept_uploads = true;
  // > 0: benchmarks only. Every chunk this service sends waits its turn on one emulated link of
  // this many bytes per second shared by all streams (send_pacer.h), as if the process were a
  // host with that NIC.
  double emulated_link_bytes_per_second = 0;
  // Parallel upload (a version in N parts on N streams, VersionManifest.part_count): every part
  // must have begun within this long of the first one, or the version fails (DEADLINE_EXCEEDED
  // naming the missing parts) and nothing is stored.
  std::chrono::milliseconds part_timeout{std::chrono::seconds(60)};
  // Same-host shortcut (same_host.h): with kAuto, a worker that subscribes with this host's
  // local_host_id gets each full version as a MappedVersion naming a file under same_host_dir
  // (written once per version, shared by every such worker) instead of chunks over its stream.
  // Deltas are not sent to those workers (reading the file is cheaper than decoding one).
  SameHostMode same_host = SameHostMode::kOff;
  std::string same_host_dir = "/dev/shm";
};

// InvalidArgument naming the field for keep_versions < 1, chunk_bytes outside [1, 8 MiB],
// max_version_bytes == 0, a non-positive poll_interval or part_timeout, delta_max_fraction outside
// (0, 1], delta_zstd_level outside [1, 19] or an empty same_host_dir with same_host auto.
absl::Status validate_options(const WeightSyncOptions& options);

class WeightSyncServiceImpl final : public v1::WeightSyncService::Service {
 public:
  // `metrics` must outlive the service; options must pass validate_options.
  WeightSyncServiceImpl(WeightSyncOptions options, WeightSyncMetrics* metrics);
  // Every call then needs the cluster token (UNAUTHENTICATED otherwise). Before serving.
  void require_tokens(std::shared_ptr<const service::TokenSet> tokens) {
    auth_ = std::move(tokens);
  }

  grpc::Status UploadVersion(grpc::ServerContext* context,
                             grpc::ServerReader<v1::UploadVersionRequest>* reader,
                             v1::UploadVersionResponse* response) override;
  grpc::Status Subscribe(grpc::ServerContext* context, const v1::SubscribeRequest* request,
                         grpc::ServerWriter<v1::SubscribeResponse>* writer) override;
  grpc::Status Ack(grpc::ServerContext* context, const v1::AckRequest* request,
                   v1::AckResponse* response) override;
  grpc::Status GetStatus(grpc::ServerContext* context,
                         const v1::GetWeightSyncStatusRequest* request,
                         v1::WeightSyncStatus* response) override;

  // Ends every open Subscribe stream (UNAVAILABLE) and refuses new streams and uploads, so the
  // gRPC server's Shutdown does not wait on them. Call before GrpcServer::shutdown. Idempotent.
  void begin_shutdown();

  // A version fed in process (a worker's relay: the bytes its subscriber has verified), stored
  // and pushed to Subscribe streams as it arrives, like an upload with cut-through.
  class LocalUpload {
   public:
    ~LocalUpload();  // an unfinished upload is withdrawn (streams relaying it stop)
    // Appends verified bytes; `offset` must equal the bytes given so far (InvalidArgument).
    absl::Status add(uint64_t offset, std::span<const char> bytes);
    // Stores the version once every byte was given (FailedPrecondition before that).
    absl::Status finish();
    int64_t version() const { return arriving_->version(); }

   private:
    friend class WeightSyncServiceImpl;
    LocalUpload(WeightSyncServiceImpl* service, std::shared_ptr<StoredVersion> version,
                std::shared_ptr<ArrivingVersion> arriving)
        : service_(service), version_(std::move(version)), arriving_(std::move(arriving)) {}
    WeightSyncServiceImpl* service_;
    std::shared_ptr<StoredVersion> version_;
    std::shared_ptr<ArrivingVersion> arriving_;
    uint64_t received_ = 0;
    bool stored_ = false;
  };
  // InvalidArgument for a manifest that is not newer than the latest stored version or whose
  // total_bytes is 0 or above max_version_bytes; Unavailable after begin_shutdown().
  absl::StatusOr<std::unique_ptr<LocalUpload>> begin_local_upload(
      const v1::VersionManifest& manifest);

  const VersionStore& store() const { return store_; }
  const RelayTopology& relay_topology() const { return topology_; }
  const WorkerTable& workers() const { return workers_; }
  uint64_t rejected_uploads() const { return rejected_.load(); }
  // Buffers of evicted versions that uploads are received into (set_max_spares(0) turns reuse
  // off, for benchmarks).
  PayloadPool& payload_pool() { return *pool_; }
  // Chunks go out as gRPC slices over the stored version's bytes (true, the default) or, as
  // before, copied into a SubscribeResponse that gRPC then serializes (false: for benchmarks).
  void set_zero_copy_send(bool on) { zero_copy_send_.store(on); }
  // Upload chunks are copied from gRPC's slices straight into the payload buffer (true, the
  // default) or parsed into a message first and then appended (false: for benchmarks).
  void set_zero_copy_receive(bool on) { zero_copy_receive_.store(on); }
  // WeightSyncOptions::cut_through, switchable at run time (for benchmarks).
  void set_cut_through(bool on) { cut_through_.store(on); }
  // WeightSyncOptions::same_host on (auto) or off at run time, from the next push (benchmarks).
  void set_same_host(bool on) { same_host_.store(on); }
  // The same-host files (tests reach in to corrupt one).
  SameHostFiles& same_host_files() { return same_host_files_; }

 private:
  grpc::Status reject_upload(const absl::Status& status, int64_t version);
  // An upload whose messages `read` yields as raw ByteBuffers (false: the client is done).
  grpc::Status receive_upload(grpc::ServerContext* context,
                              const std::function<bool(grpc::ByteBuffer*)>& read,
                              v1::UploadVersionResponse* response);
  // One part of a parallel upload, from its manifest (already read) to the end of the version:
  // the part's chunks go into the shared payload buffer; the stream answers once every part
  // ended and the version is stored, or with the error that failed the version.
  grpc::Status receive_part(grpc::ServerContext* context,
                            const std::function<bool(grpc::ByteBuffer*)>& read,
                            v1::VersionManifest manifest, v1::UploadVersionResponse* response);
  // A same-host upload (MappedUpload, already read): the uploader's file is read and verified
  // into a payload buffer, the version stored, and the file kept as its same-host file.
  // FailedPrecondition when this weight sync does not take them (--same-host off, another host,
  // a file it cannot read): the uploader sends the version over the stream instead.
  grpc::Status receive_mapped_upload(const std::function<bool(grpc::ByteBuffer*)>& read,
                                     v1::MappedUpload mapped, v1::UploadVersionResponse* response);
  // Metrics and log line of a newly stored version.
  void record_stored(int64_t version, v1::WeightFormat format, int num_tensors, uint64_t bytes,
                     uint32_t parts);
  // Fails a parallel upload for every part (first failure wins): its arrival is withdrawn
  // (streams relaying it stop) and it is forgotten, so nothing of it is stored.
  void fail_parts(const std::shared_ptr<PartAssembly>& assembly, const absl::Status& status);
  // Stores a parallel upload whose parts all ended (the last part's stream calls it).
  absl::Status store_parts(const std::shared_ptr<PartAssembly>& assembly);
  // The Subscribe stream behind both entry points (the registered raw handler, which writes
  // ByteBuffers, and the generated Subscribe override).
  grpc::Status subscribe(grpc::ServerContext* context, const v1::SubscribeRequest& request,
                         PushSink& sink);
  // Streams one version (manifest, then chunks); false when the stream broke or shutdown began.
  bool send_version(const StoredVersionPtr& version, grpc::ServerContext* context, PushSink& sink);
  // Offers `version` to a worker on this host as `file` (one MappedVersion message).
  bool send_same_host(const StoredVersionPtr& version, const SameHostFile& file, PushSink& sink);
  // Streams an encoded delta (delta manifest, then chunks of its payload); false as above.
  bool send_delta(const std::shared_ptr<const EncodedDelta>& delta, grpc::ServerContext* context,
                  PushSink& sink);
  // Streams a version while its upload arrives (cut-through): the manifest at once, each chunk
  // when the upload has received its bytes. False as above, or when the upload failed
  // (*upload_failed: what was sent is an incomplete version, which the worker drops when the next
  // manifest arrives).
  bool relay_version(const std::shared_ptr<ArrivingVersion>& arriving, grpc::ServerContext* context,
                     PushSink& sink, bool* upload_failed);
  // Waits for an arriving version's upload to complete: the stored version, or nullptr when the
  // upload failed, the stream was cancelled or shutdown began.
  StoredVersionPtr wait_arrived(const std::shared_ptr<ArrivingVersion>& arriving,
                                grpc::ServerContext* context);
  // Streams `payload` (kept alive by `owner`) as chunks of `version`; false as above.
  bool send_chunks(int64_t version, std::string_view payload, std::shared_ptr<const void> owner,
                   grpc::ServerContext* context, PushSink& sink);
  // The delta of `target` against `base` when it is at most delta_max_fraction of the full
  // version (nullptr otherwise, or when encoding failed). Encoded once per pair and shared by every
  // stream.
  std::shared_ptr<const EncodedDelta> delta_for(const StoredVersion& base,
                                                const StoredVersion& target);
  void record_push_latency(std::optional<double> seconds);
  // The version `worker` last acknowledged with ok (0 when none) and when (Unix ms).
  int64_t acked_version(const std::string& worker) const;
  std::pair<int64_t, int64_t> acked(const std::string& worker) const;

  const WeightSyncOptions options_;
  WeightSyncMetrics* metrics_;
  RelayTopology topology_;
  SendPacer pacer_;
  // Before store_: evicted versions hand their buffers back to it (shared by their deleters, so
  // a version outliving the service is still safe to free).
  std::shared_ptr<PayloadPool> pool_;
  VersionStore store_;
  WorkerTable workers_;
  std::atomic<uint64_t> rejected_{0};
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> zero_copy_send_{true};
  std::atomic<bool> zero_copy_receive_{true};
  std::atomic<bool> cut_through_{true};
  std::atomic<bool> same_host_{false};
  const std::string host_id_;  // local_host_id(), compared with SubscribeRequest.local_host
  SameHostFiles same_host_files_;
  std::shared_ptr<const service::TokenSet> auth_;  // null: open

  // Guards parts_.
  std::mutex parts_mu_;
  // Guarded by parts_mu_: parallel uploads by version, from their first part until stored or
  // failed.
  std::map<int64_t, std::shared_ptr<PartAssembly>> parts_;
  // Guarded by parts_mu_: parallel uploads that failed, by version: a late part of the same
  // attempt (upload_id) is refused with the failure instead of starting a new attempt. Only
  // versions newer than the latest stored, at most kMaxFailedAttempts.
  struct FailedAttempt {
    uint64_t upload_id = 0;
    absl::Status failure;
  };
  static constexpr size_t kMaxFailedAttempts = 16;
  std::map<int64_t, FailedAttempt> failed_parts_;

  // One encoding of (base, target): the first stream to ask encodes, the others wait on `once`.
  struct DeltaEntry {
    std::once_flag once;
    std::shared_ptr<const EncodedDelta> delta;  // set inside `once`; nullptr: send full
  };
  // Guards deltas_.
  std::mutex delta_mu_;
  // Guarded by delta_mu_: entries by (base version, target version); only those for the newest
  // target asked for are kept.
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<DeltaEntry>> deltas_;
};

}  // namespace fp8rl::weight_sync
