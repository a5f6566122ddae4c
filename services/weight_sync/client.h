// The client side of weight sync. The trainer calls upload() to publish a version (manifest with
// a CRC-32C per tensor, then <= 4 MiB chunks). A generation worker runs a WeightSubscriber: it
// keeps a Subscribe stream open (reconnecting with backoff when it breaks), reassembles and
// verifies every pushed version, hands it to the worker as a model::WeightSet, and acknowledges
// the version (ok, or the reason it was rejected).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fp8rl/v1/weight_sync.grpc.pb.h"
#include "model/weight_set.h"
#include "services/weight_sync/delta.h"
#include "services/weight_sync/payload.h"

namespace fp8rl::weight_sync {

struct UploadOptions {
  uint64_t chunk_bytes = kDefaultChunkBytes;                    // in [1, kMaxChunkBytes]
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};  // whole upload deadline
  // The overloads that take a channel write each chunk as gRPC slices over the tensors' own bytes
  // (no copy into a message, no serialization); false: as a WeightChunk message, as the stub
  // overloads always do (benchmarks compare the two). The bytes on the wire are the same.
  bool zero_copy = true;
};

// Publishes `set` (its version and config_json) as `format`. Errors: InvalidArgument for a bad
// set or options (before anything is sent); otherwise the service's status (INVALID_ARGUMENT,
// DATA_LOSS, UNAVAILABLE, ...).
absl::StatusOr<v1::UploadVersionResponse> upload(v1::WeightSyncService::StubInterface* stub,
                                                 const model::WeightSet& set,
                                                 v1::WeightFormat format,
                                                 const UploadOptions& options = {});
absl::StatusOr<v1::UploadVersionResponse> upload(
    const std::shared_ptr<grpc::ChannelInterface>& channel, const model::WeightSet& set,
    v1::WeightFormat format, const UploadOptions& options = {});

// Parallel upload (docs/design/weight-sync-fanout.md "Parallel upload from N trainer ranks").
// One part of a version, what each of N trainer ranks calls with its own range: `manifest` is the
// whole version's manifest (every tensor of every rank, with its CRC-32C) with the part fields set
// (plan_parts) and part_index naming this part; `tensors` are exactly the manifest's tensors of
// that part's range, in order. Returns when every part has ended and weight sync stored the
// version, or with the error that failed it (this part's own, or ABORTED naming the part that
// failed). InvalidArgument before anything is sent for bad options, a manifest that fails
// validate_manifest / part_range, or tensors that are not the part's (naming the first mismatch).
absl::StatusOr<v1::UploadVersionResponse> upload_part(v1::WeightSyncService::StubInterface* stub,
                                                      const v1::VersionManifest& manifest,
                                                      std::span<const model::NamedTensor> tensors,
                                                      const UploadOptions& options = {});
absl::StatusOr<v1::UploadVersionResponse> upload_part(
    const std::shared_ptr<grpc::ChannelInterface>& channel, const v1::VersionManifest& manifest,
    std::span<const model::NamedTensor> tensors, const UploadOptions& options = {});

// Uploads `set` as `parts` parts (plan_parts: about equal bytes, cut at tensor boundaries) on
// `parts` concurrent streams, part i on channels[i % channels.size()]; parts == 1 is upload().
// Streams on one channel share its connection: give each part its own channel, made with
// GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL set, for parts that travel on their own TCP connections.
// bytes_received is the sum over the parts. The first error of any part otherwise (a part that
// fails makes weight sync fail the others: nothing is stored).
absl::StatusOr<v1::UploadVersionResponse> upload_parallel(
    std::span<const std::shared_ptr<grpc::ChannelInterface>> channels, const model::WeightSet& set,
    v1::WeightFormat format, uint32_t parts, const UploadOptions& options = {});

// Same-host upload (docs/design/weight-sync.md "Same-host upload"), for an uploader on weight
// sync's own host: writes `set`'s payload into a new file under `dir` (weight sync's
// WeightSyncStatus.same_host_dir), sends one MappedUpload naming it, and removes the file when
// weight sync did not take it over. FailedPrecondition when weight sync does not take same-host
// uploads (--same-host off, another host, a file it cannot read): upload over the stream instead.
// Unavailable naming the path when the file cannot be written; InvalidArgument for a bad set or
// options; otherwise the service's status.
absl::StatusOr<v1::UploadVersionResponse> upload_same_host(
    const std::shared_ptr<grpc::ChannelInterface>& channel, const model::WeightSet& set,
    v1::WeightFormat format, const std::string& dir, const UploadOptions& options = {});

// Sees each version a WeightSubscriber receives while it lands, so a relay (relay.h) can pass it on
// before the worker installs it. Called on the subscriber's thread only, in this order per
// version: begin, bytes (in order from offset 0; every tensor ending in them passed its CRC-32C),
// then end(true) once all bytes were given, or end(false) when the version was dropped (a bad
// chunk, a broken stream, a new manifest first). A version rebuilt from a delta is given whole.
class VersionTap {
 public:
  virtual ~VersionTap() = default;
  virtual void begin(const v1::VersionManifest& manifest) = 0;
  virtual void bytes(uint64_t offset, std::span<const char> data) = 0;
  virtual void end(bool complete) = 0;
};

struct SubscriberOptions {
  std::string worker_id;                           // registry id of this worker (required)
  int64_t held_version = 0;                        // version already loaded (0: none)
  std::chrono::milliseconds initial_backoff{100};  // first reconnect delay
  std::chrono::milliseconds max_backoff{5000};     // reconnect delay cap (doubles up to it)
  std::chrono::milliseconds ack_timeout{5000};     // deadline of each Ack call
  uint64_t max_version_bytes = kDefaultMaxVersionBytes;
  // Keep the bytes of the version last accepted and take new versions as deltas against it
  // (services/weight_sync/delta.h); costs one extra copy of a version in memory.
  bool accept_delta = true;
  // Fan-out through relays (docs/design/weight-sync-fanout.md): the address where this worker
  // serves its relay (empty: it does not relay). Weight sync may then redirect the subscription
  // to an upstream relay; acks still go to weight sync.
  std::string relay_address;
  // An upstream relay that holds or receives a version newer than any this worker received, and
  // sends nothing for this long, is left as stalled (and reported to weight sync). A stream to
  // weight sync itself is cancelled and opened again when weight sync has stored such a version
  // and sent nothing for this long (a stream left dead by a network partition).
  std::chrono::milliseconds relay_stall_timeout{10000};
  // Sees every version as it lands (the worker's relay); not owned, must outlive the subscriber.
  VersionTap* tap = nullptr;
  // Same-host shortcut (same_host.h): ask weight sync for a version as a file on its host when
  // this worker runs there (only with an InPlaceReceiver; not on streams to a relay). A file this
  // worker cannot open is said once in the log, and every later version comes over the stream; a
  // file that fails a CRC-32C is rejected (acked with the error) and the stream that follows
  // carries the versions instead.
  bool same_host = false;
  // Opens a channel to an upstream relay's address (empty: insecure, data-path message sizes).
  std::function<std::shared_ptr<grpc::ChannelInterface>(const std::string& address)> connect;
};

// Receives a verified version and swaps it in. OK: the worker now serves it (acked ok).
// An error: the version is acknowledged as rejected with the error's message.
using WeightSetHandler = std::function<absl::Status(model::WeightSet set)>;

// The in-place receive of a generation worker (docs/design/weight-sync.md "Installing a weight
// version in place"): `target(manifest)` returns the buffer a version's chunks are written into as
// they land (the inactive half of the worker's double buffer; an error rejects the version),
// checked per tensor (CRC-32C) as with a WeightSetHandler; `install(manifest, payload)` gets the
// verified bytes, payload = target[0, total_bytes), and returns as a WeightSetHandler does.
// Optional `base(version)`: the verified bytes of `version` when the receiver still holds them
// (empty otherwise), which a delta (delta.h) is applied to; `target` must never hand out the buffer
// holding them. Without `base` the subscriber takes full versions only.
struct InPlaceReceiver {
  std::function<absl::StatusOr<std::span<char>>(const v1::VersionManifest& manifest)> target;
  std::function<absl::Status(const v1::VersionManifest& manifest, std::span<const char> payload)>
      install;
  std::function<std::span<const char>(int64_t version)> base;
};

class WeightSubscriber {
 public:
  WeightSubscriber(std::shared_ptr<grpc::ChannelInterface> channel, SubscriberOptions options,
                   WeightSetHandler handler);
  WeightSubscriber(std::shared_ptr<grpc::ChannelInterface> channel, SubscriberOptions options,
                   InPlaceReceiver receiver);
  ~WeightSubscriber();  // stop()
  WeightSubscriber(const WeightSubscriber&) = delete;
  WeightSubscriber& operator=(const WeightSubscriber&) = delete;

  // Starts the background stream. InvalidArgument naming the option for an empty worker_id, a
  // negative held_version, bad backoffs or an empty handler (or receiver function);
  // FailedPrecondition when already
  // started.
  absl::Status start();
  // Cancels the stream and joins the thread (bounded: the stream is cancelled, not drained; a
  // handler call in progress finishes first). Idempotent.
  void stop();

  // The version the handler last accepted (or options.held_version).
  int64_t held_version() const;
  // Waits until held_version() >= version; false when `timeout` passes first.
  bool wait_for_version(int64_t version, std::chrono::milliseconds timeout) const;

  struct Stats {
    int64_t versions_loaded = 0;        // accepted by the handler and acked ok
    int64_t versions_rejected = 0;      // failed verification or the handler, acked with an error
    int64_t streams_opened = 0;         // Subscribe calls made (1 + reconnects)
    std::string last_error;             // last rejection or stream error
    int64_t versions_from_delta = 0;    // of versions_loaded, rebuilt from a delta
    int64_t delta_fallbacks = 0;        // deltas that failed (no base, bad CRC): full refetched
    uint64_t delta_bytes_received = 0;  // delta payload bytes
    double delta_decode_seconds = 0;    // the last delta's apply_delta time
    int64_t relay_redirects = 0;        // streams weight sync sent to an upstream relay
    int64_t upstream_failures = 0;      // upstream relays left because they broke or stalled
    // The last version received whole (not from a delta): seconds from its manifest to its last
    // byte verified, i.e. the transfer and the CRC-32C, not the install.
    double last_receive_seconds = 0;
    int64_t versions_same_host = 0;   // of versions_loaded, read from weight sync's same-host file
    int64_t same_host_fallbacks = 0;  // same-host files that could not be read or verified
  };
  Stats stats() const;

  // With an InPlaceReceiver: copy each chunk of a full version straight from gRPC's receive
  // buffers into the target (on, the default), or parse it into a message first and copy from
  // there (the previous path; benchmarks compare the two). Takes effect from the next message.
  void set_zero_copy_receive(bool on) { zero_copy_.store(on); }

 private:
  void run();
  // One Subscribe call until it ends, to weight sync (upstream == nullptr) or to an upstream relay;
  // true when it delivered at least one message.
  bool stream_once(const std::shared_ptr<grpc::ChannelInterface>& channel,
                   v1::WeightSyncService::Stub* upstream);
  // While a stream to an upstream relay is open: cancels it once the relay has owed this worker a
  // version (its GetStatus shows one, stored or arriving, newer than any received whole here;
  // when it does not answer, weight sync's does) for relay_stall_timeout of waiting in Read
  // (*read_since_ns: when the current Read began, 0 while not reading). `direct`: the stream goes
  // to weight sync itself (`upstream` is its stub), which owes only stored versions.
  void watch_upstream(grpc::ClientContext* context, v1::WeightSyncService::Stub* upstream,
                      bool direct, const std::atomic<int64_t>* read_since_ns,
                      const std::atomic<bool>* done, std::atomic<bool>* stalled);
  void deliver(AssembledVersion version);
  // deliver() of a version received in place into `payload`.
  void deliver_in_place(const v1::VersionManifest& manifest, std::span<const char> payload);
  // The version was served: held_version_, stats, log, ack.
  void accepted(int64_t version);
  // A delta could not be applied: counts it and makes the next stream ask for full versions.
  void delta_failed(int64_t version, const absl::Status& error);
  // The version whose bytes a delta can be applied to (0: none), and those bytes (empty when
  // `version` is not held). Subscriber thread only.
  int64_t delta_base_version() const;
  std::span<const char> delta_base(int64_t version) const;
  void reject(int64_t version, const absl::Status& error);
  void send_ack(int64_t version, bool ok, const std::string& error);

  std::shared_ptr<grpc::ChannelInterface> channel_;
  std::unique_ptr<v1::WeightSyncService::Stub> stub_;
  const SubscriberOptions options_;
  WeightSetHandler handler_;  // one of handler_ and receiver_ is set
  InPlaceReceiver receiver_;

  // Guards the members marked below.
  mutable std::mutex mu_;
  // Waits for: held_version_ rising (wait_for_version()) or stopping_ (the reconnect backoff in
  // run()). Notified by deliver() and stop().
  mutable std::condition_variable cv_;
  bool started_ = false;   // guarded by mu_
  bool stopping_ = false;  // guarded by mu_
  // Guarded by mu_: the open stream's context, for stop() to cancel.
  grpc::ClientContext* active_context_ = nullptr;
  int64_t held_version_ = 0;  // guarded by mu_
  Stats stats_;               // guarded by mu_
  std::thread thread_;        // started by start(), joined by stop()
  // Subscriber thread only: the last version accepted (the base of the next delta; empty when
  // none or !accept_delta), and whether the next stream must ask for full versions.
  AssembledVersion base_;
  bool want_full_ = false;
  // Subscriber thread only: where weight sync redirected this worker (empty: weight sync itself),
  // the stub acks also go to while attached there, and an upstream to report as failed on the
  // next Subscribe to weight sync.
  v1::RelayRedirect upstream_;
  std::unique_ptr<v1::WeightSyncService::Stub> upstream_stub_;
  std::string failed_upstream_;
  // The newest version received whole on any stream, accepted or not (a rejected version is not
  // a stalled upstream's fault). Written by the subscriber thread, read by the stall watch.
  std::atomic<int64_t> seen_version_{0};
  std::atomic<bool> zero_copy_{true};
  // Subscriber thread only: local_host_id() when options_.same_host (empty otherwise or once a
  // same-host file could not be opened), and whether the next stream must not ask for one.
  std::string same_host_id_;
  bool want_stream_ = false;
};

}  // namespace fp8rl::weight_sync
