// Weight upload and the reconnecting, verifying subscriber (see client.h).
#include "services/weight_sync/client.h"

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"
#include "common/service/log.h"
#include "services/weight_sync/chunk_wire.h"
#include "services/weight_sync/same_host.h"

namespace fp8rl::weight_sync {
namespace {

constexpr std::string_view kComponent = "weight-sync-client";

// The Subscribe method, called with raw ByteBuffer responses (see read_message).
constexpr char kSubscribeMethod[] = "/fp8rl.v1.WeightSyncService/Subscribe";

// SubscriberOptions::connect's default.
std::shared_ptr<grpc::Channel> insecure_data_channel(const std::string& address) {
  grpc::ChannelArguments args;
  service::set_data_path_message_limits(&args);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

}  // namespace

namespace {

absl::Status check_upload_options(const UploadOptions& options) {
  if (options.chunk_bytes == 0 || options.chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_bytes: must be in [1, ", kMaxChunkBytes,
                                                   "], got ", options.chunk_bytes));
  }
  if (options.timeout.count() <= 0) return absl::InvalidArgumentError("timeout: must be > 0");
  return absl::OkStatus();
}

// One UploadVersion call: `manifest`, then `tensors`' bytes (consecutive in the payload from
// `first_offset`) in chunks of options.chunk_bytes.
absl::StatusOr<v1::UploadVersionResponse> stream_upload(v1::WeightSyncService::StubInterface* stub,
                                                        const v1::VersionManifest& manifest,
                                                        std::span<const model::NamedTensor> tensors,
                                                        uint64_t first_offset,
                                                        const UploadOptions& options) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::UploadVersionResponse response;
  std::unique_ptr<grpc::ClientWriterInterface<v1::UploadVersionRequest>> writer =
      stub->UploadVersion(&context, &response);
  v1::UploadVersionRequest request;
  *request.mutable_manifest() = manifest;
  bool stream_ok = writer->Write(request);
  if (stream_ok) {
    // Chunks are filled straight from the tensors into one reused chunk message (its data buffer
    // keeps its capacity across chunks): one copy into the message, one serialization by gRPC.
    // A failed Write means the service ended the call (it rejected the upload or went away);
    // Finish() below reports why.
    v1::WeightChunk* chunk = request.mutable_chunk();
    chunk->set_version(manifest.version());
    std::string* data = chunk->mutable_data();
    data->reserve(options.chunk_bytes);
    uint64_t offset = first_offset;  // payload offset of (*data)[0]
    auto send = [&]() {
      chunk->set_offset(offset);
      offset += data->size();
      const bool ok = writer->Write(request);
      data->clear();
      return ok;
    };
    for (const model::NamedTensor& t : tensors) {
      const char* p = reinterpret_cast<const char*>(t.bytes.data());
      uint64_t left = t.bytes.size();
      while (left > 0 && stream_ok) {
        const uint64_t n = std::min<uint64_t>(left, options.chunk_bytes - data->size());
        data->append(p, n);
        p += n;
        left -= n;
        if (data->size() == options.chunk_bytes) stream_ok = send();
      }
      if (!stream_ok) break;
    }
    if (stream_ok && !data->empty()) stream_ok = send();
  }
  if (stream_ok) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return service::from_grpc_status(status);
  if (!stream_ok) return absl::UnavailableError("upload stream closed before the payload was sent");
  return response;
}

// The UploadVersion method, called with raw ByteBuffer requests (stream_upload_zero_copy).
constexpr char kUploadMethod[] = "/fp8rl.v1.WeightSyncService/UploadVersion";

// stream_upload on a channel without copying the payload: each chunk is written as a raw byte
// buffer of its header bytes (chunk_wire.h, the same bytes the message would have) and slices over
// the tensors' own bytes, so the data is neither copied into a message nor serialized by gRPC.
// The slices do not own their bytes: `tensors` outlive the call, which ends with Finish().
absl::StatusOr<v1::UploadVersionResponse> stream_upload_zero_copy(
    const std::shared_ptr<grpc::ChannelInterface>& channel, const v1::VersionManifest& manifest,
    std::span<const model::NamedTensor> tensors, uint64_t first_offset,
    const UploadOptions& options) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  const grpc::internal::RpcMethod method(kUploadMethod,
                                         grpc::internal::RpcMethod::CLIENT_STREAMING);
  grpc::ByteBuffer response_buffer;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel.get(), method, &context,
                                                                    &response_buffer));
  bool stream_ok = false;
  {
    v1::UploadVersionRequest request;
    *request.mutable_manifest() = manifest;
    grpc::ByteBuffer buffer;
    bool own = false;
    stream_ok =
        grpc::SerializationTraits<v1::UploadVersionRequest>::Serialize(request, &buffer, &own)
            .ok() &&
        writer->Write(buffer);
  }
  std::vector<grpc::Slice> slices;
  size_t tensor = 0;               // tensors[tensor] is the next to send from
  uint64_t within = 0;             // bytes of it already sent
  uint64_t offset = first_offset;  // payload offset of the next chunk
  while (stream_ok) {
    slices.clear();
    slices.emplace_back();  // the header, once the chunk's size is known
    uint64_t size = 0;
    while (size < options.chunk_bytes && tensor < tensors.size()) {
      const model::NamedTensor& t = tensors[tensor];
      const uint64_t n = std::min<uint64_t>(t.bytes.size() - within, options.chunk_bytes - size);
      if (n > 0) {
        slices.emplace_back(t.bytes.data() + within, n, grpc::Slice::STATIC_SLICE);
        size += n;
        within += n;
      }
      if (within == t.bytes.size()) {
        ++tensor;
        within = 0;
      }
    }
    if (size == 0) break;
    uint8_t header[kMaxChunkHeaderBytes];
    const size_t header_size = write_chunk_header(
        {.version = manifest.version(), .offset = offset, .size = static_cast<uint32_t>(size)},
        header);
    slices[0] = grpc::Slice(header, header_size);
    const grpc::ByteBuffer buffer(slices.data(), slices.size());
    stream_ok = writer->Write(buffer);
    offset += size;
  }
  if (stream_ok) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return service::from_grpc_status(status);
  if (!stream_ok) return absl::UnavailableError("upload stream closed before the payload was sent");
  v1::UploadVersionResponse response;
  grpc::ProtoBufferReader reader(&response_buffer);
  if (!response.ParseFromZeroCopyStream(&reader)) {
    return absl::InternalError("weight sync's upload response does not parse");
  }
  return response;
}

// The checks of upload_part before anything is sent; the part's range.
absl::StatusOr<PartRange> check_part(const v1::VersionManifest& manifest,
                                     std::span<const model::NamedTensor> tensors,
                                     const UploadOptions& options) {
  if (absl::Status s = check_upload_options(options); !s.ok()) return s;
  if (absl::Status s = validate_manifest(manifest); !s.ok()) return s;
  absl::StatusOr<PartRange> range = part_range(manifest);
  if (!range.ok()) return range.status();
  const int want = range->end_tensor - range->first_tensor;
  if (static_cast<int>(tensors.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat("tensors: ", tensors.size(), " given but part ",
                                                   manifest.part_index(), " holds ", want));
  }
  for (int i = 0; i < want; ++i) {
    const v1::TensorManifestEntry& e = manifest.tensors(range->first_tensor + i);
    const model::NamedTensor& t = tensors[static_cast<size_t>(i)];
    if (t.name != e.name() || t.bytes.size() != e.byte_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensors[", i, "]: '", t.name, "' (", t.bytes.size(),
                       " bytes) but the manifest's tensor ", range->first_tensor + i,
                       " of this part is '", e.name(), "' (", e.byte_size(), " bytes)"));
    }
  }
  return range;
}

}  // namespace

absl::StatusOr<v1::UploadVersionResponse> upload(v1::WeightSyncService::StubInterface* stub,
                                                 const model::WeightSet& set,
                                                 v1::WeightFormat format,
                                                 const UploadOptions& options) {
  if (absl::Status s = check_upload_options(options); !s.ok()) return s;
  absl::StatusOr<v1::VersionManifest> manifest = build_manifest(set, format);
  if (!manifest.ok()) return manifest.status();
  return stream_upload(stub, *manifest, set.tensors, 0, options);
}

absl::StatusOr<v1::UploadVersionResponse> upload_part(v1::WeightSyncService::StubInterface* stub,
                                                      const v1::VersionManifest& manifest,
                                                      std::span<const model::NamedTensor> tensors,
                                                      const UploadOptions& options) {
  absl::StatusOr<PartRange> range = check_part(manifest, tensors, options);
  if (!range.ok()) return range.status();
  return stream_upload(stub, manifest, tensors, range->begin, options);
}

absl::StatusOr<v1::UploadVersionResponse> upload_part(
    const std::shared_ptr<grpc::ChannelInterface>& channel, const v1::VersionManifest& manifest,
    std::span<const model::NamedTensor> tensors, const UploadOptions& options) {
  absl::StatusOr<PartRange> range = check_part(manifest, tensors, options);
  if (!range.ok()) return range.status();
  if (!options.zero_copy) {
    auto stub = v1::WeightSyncService::NewStub(channel);
    return stream_upload(stub.get(), manifest, tensors, range->begin, options);
  }
  return stream_upload_zero_copy(channel, manifest, tensors, range->begin, options);
}

absl::StatusOr<v1::UploadVersionResponse> upload_parallel(
    std::span<const std::shared_ptr<grpc::ChannelInterface>> channels, const model::WeightSet& set,
    v1::WeightFormat format, uint32_t parts, const UploadOptions& options) {
  if (channels.empty()) return absl::InvalidArgumentError("channels: empty");
  if (absl::Status s = check_upload_options(options); !s.ok()) return s;
  absl::StatusOr<v1::VersionManifest> manifest = build_manifest(set, format);
  if (!manifest.ok()) return manifest.status();
  if (absl::Status s = plan_parts(&*manifest, parts); !s.ok()) return s;
  if (parts == 1) {
    if (!options.zero_copy) {
      auto stub = v1::WeightSyncService::NewStub(channels[0]);
      return stream_upload(stub.get(), *manifest, set.tensors, 0, options);
    }
    return stream_upload_zero_copy(channels[0], *manifest, set.tensors, 0, options);
  }
  std::vector<absl::StatusOr<v1::UploadVersionResponse>> results(
      parts, absl::UnknownError("part not run"));
  std::vector<std::thread> threads;
  threads.reserve(parts);
  for (uint32_t p = 0; p < parts; ++p) {
    threads.emplace_back([&, p] {
      v1::VersionManifest mine = *manifest;
      mine.set_part_index(p);
      absl::StatusOr<PartRange> range = part_range(mine);
      if (!range.ok()) {
        results[p] = range.status();
        return;
      }
      const std::span<const model::NamedTensor> all(set.tensors);
      results[p] =
          upload_part(channels[p % channels.size()], mine,
                      all.subspan(static_cast<size_t>(range->first_tensor),
                                  static_cast<size_t>(range->end_tensor - range->first_tensor)),
                      options);
    });
  }
  for (std::thread& t : threads) t.join();
  v1::UploadVersionResponse out;
  out.set_version(set.version);
  // The part that failed the version says why; the others say ABORTED pointing at it.
  for (const auto& r : results) {
    if (!r.ok() && r.status().code() != absl::StatusCode::kAborted) return r.status();
  }
  for (const auto& r : results) {
    if (!r.ok()) return r.status();
    out.set_bytes_received(out.bytes_received() + r->bytes_received());
  }
  return out;
}

absl::StatusOr<v1::UploadVersionResponse> upload(
    const std::shared_ptr<grpc::ChannelInterface>& channel, const model::WeightSet& set,
    v1::WeightFormat format, const UploadOptions& options) {
  if (!options.zero_copy) {
    std::unique_ptr<v1::WeightSyncService::Stub> stub = v1::WeightSyncService::NewStub(channel);
    return upload(stub.get(), set, format, options);
  }
  if (absl::Status s = check_upload_options(options); !s.ok()) return s;
  absl::StatusOr<v1::VersionManifest> manifest = build_manifest(set, format);
  if (!manifest.ok()) return manifest.status();
  return stream_upload_zero_copy(channel, *manifest, set.tensors, 0, options);
}

absl::StatusOr<v1::UploadVersionResponse> upload_same_host(
    const std::shared_ptr<grpc::ChannelInterface>& channel, const model::WeightSet& set,
    v1::WeightFormat format, const std::string& dir, const UploadOptions& options) {
  if (absl::Status s = check_upload_options(options); !s.ok()) return s;
  if (dir.empty()) return absl::InvalidArgumentError("dir: empty");
  absl::StatusOr<v1::VersionManifest> manifest = build_manifest(set, format);
  if (!manifest.ok()) return manifest.status();
  std::vector<std::span<const char>> pieces;
  pieces.reserve(set.tensors.size());
  for (const model::NamedTensor& t : set.tensors)
    pieces.emplace_back(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  absl::StatusOr<std::string> path = write_upload_file(dir, set.version, pieces);
  if (!path.ok()) return path.status();
  v1::UploadVersionRequest request;
  v1::MappedUpload* mapped = request.mutable_mapped();
  *mapped->mutable_manifest() = std::move(*manifest);
  mapped->set_path(*path);
  mapped->set_local_host(local_host_id());
  std::unique_ptr<v1::WeightSyncService::Stub> stub = v1::WeightSyncService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::UploadVersionResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::UploadVersionRequest>> writer =
      stub->UploadVersion(&context, &response);
  if (writer->Write(request)) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  // Weight sync renamed the file when it took it over; otherwise it is still ours to remove.
  ::unlink(path->c_str());
  if (!status.ok()) return service::from_grpc_status(status);
  return response;
}

WeightSubscriber::WeightSubscriber(std::shared_ptr<grpc::ChannelInterface> channel,
                                   SubscriberOptions options, WeightSetHandler handler)
    : channel_(std::move(channel)),
      stub_(v1::WeightSyncService::NewStub(channel_)),
      options_(std::move(options)),
      handler_(std::move(handler)),
      held_version_(options_.held_version) {}

WeightSubscriber::WeightSubscriber(std::shared_ptr<grpc::ChannelInterface> channel,
                                   SubscriberOptions options, InPlaceReceiver receiver)
    : channel_(std::move(channel)),
      stub_(v1::WeightSyncService::NewStub(channel_)),
      options_(std::move(options)),
      receiver_(std::move(receiver)),
      held_version_(options_.held_version) {}

WeightSubscriber::~WeightSubscriber() { stop(); }

absl::Status WeightSubscriber::start() {
  if (options_.worker_id.empty()) return absl::InvalidArgumentError("worker_id: empty");
  if (options_.held_version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("held_version: must be >= 0, got ", options_.held_version));
  }
  if (options_.initial_backoff.count() <= 0 || options_.max_backoff < options_.initial_backoff) {
    return absl::InvalidArgumentError(
        "initial_backoff/max_backoff: need 0 < initial_backoff <= max_backoff");
  }
  if (options_.ack_timeout.count() <= 0) {
    return absl::InvalidArgumentError("ack_timeout: must be > 0");
  }
  if (!handler_ && !receiver_.target && !receiver_.install) {
    return absl::InvalidArgumentError("handler: empty");
  }
  if (!handler_ && !receiver_.target) return absl::InvalidArgumentError("receiver.target: empty");
  if (!handler_ && !receiver_.install) {
    return absl::InvalidArgumentError("receiver.install: empty");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return absl::FailedPreconditionError("subscriber already started");
  started_ = true;
  if (options_.same_host && !handler_) same_host_id_ = local_host_id();
  thread_ = std::thread([this] { run(); });
  return absl::OkStatus();
}

void WeightSubscriber::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (active_context_ != nullptr) active_context_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t WeightSubscriber::held_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_version_;
}

bool WeightSubscriber::wait_for_version(int64_t version, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return held_version_ >= version; });
}

WeightSubscriber::Stats WeightSubscriber::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void WeightSubscriber::run() {
  std::minstd_rand rng(static_cast<uint32_t>(std::hash<std::string>{}(options_.worker_id)));
  std::chrono::milliseconds backoff = options_.initial_backoff;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    if (!upstream_.upstream_worker_id().empty()) {
      // Weight sync redirected this worker to an upstream relay. However that stream ends (the
      // relay died, stalled or stopped), go back to weight sync at once and report it there: the
      // relay order then skips it and the version is taken from its predecessor.
      std::shared_ptr<grpc::ChannelInterface> channel =
          options_.connect ? options_.connect(upstream_.upstream_address())
                           : insecure_data_channel(upstream_.upstream_address());
      upstream_stub_ = v1::WeightSyncService::NewStub(channel);
      stream_once(channel, upstream_stub_.get());
      upstream_stub_.reset();
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      ++stats_.upstream_failures;
      failed_upstream_ = upstream_.upstream_worker_id();
      upstream_.Clear();
      continue;
    }
    if (stream_once(channel_, nullptr)) backoff = options_.initial_backoff;
    if (!upstream_.upstream_worker_id().empty()) continue;  // redirected: connect there now
    // Up to 25% jitter, so many workers do not reconnect in lockstep.
    const auto delay = backoff + std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(
                                     0, backoff.count() / 4)(rng));
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, delay, [&] { return stopping_; })) return;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

void WeightSubscriber::watch_upstream(grpc::ClientContext* context,
                                      v1::WeightSyncService::Stub* upstream, bool direct,
                                      const std::atomic<int64_t>* read_since_ns,
                                      const std::atomic<bool>* done, std::atomic<bool>* stalled) {
  using std::chrono::steady_clock;
  const auto step = std::max(std::chrono::milliseconds(10), options_.relay_stall_timeout / 4);
  const int64_t limit_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(options_.relay_stall_timeout).count();
  // The newest version `stub` knows of, stored or arriving (nullopt: no answer in time). Weight
  // sync itself owes a direct subscriber only a stored version.
  auto newest = [&](v1::WeightSyncService::Stub* stub) -> std::optional<int64_t> {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() +
                   std::min(options_.ack_timeout, options_.relay_stall_timeout));
    v1::WeightSyncStatus status;
    if (!stub->GetStatus(&c, v1::GetWeightSyncStatusRequest(), &status).ok()) return std::nullopt;
    if (direct) return status.latest_version();
    return std::max(status.latest_version(), status.arriving_version());
  };
  int64_t owed_since_ns = 0;  // since when the upstream has owed this worker a version
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, step, [&] { return stopping_ || done->load(); })) return;
    }
    const int64_t since = read_since_ns->load();
    if (since == 0) {  // this worker is busy with a message, not waiting for the upstream
      owed_since_ns = 0;
      continue;
    }
    // Owed: the relay holds (or receives) a version newer than any this worker received whole.
    // A relay that does not answer owes one if weight sync has one.
    const int64_t have = std::max(held_version(), seen_version_.load());
    std::optional<int64_t> relay = newest(upstream);
    if (!relay && !direct) relay = newest(stub_.get());
    if (!relay || *relay <= have) {
      owed_since_ns = 0;
      continue;
    }
    const int64_t now = steady_clock::now().time_since_epoch().count();
    if (owed_since_ns == 0) owed_since_ns = now;
    if (now - std::max(since, owed_since_ns) >= limit_ns && read_since_ns->load() == since) {
      stalled->store(true);
      context->TryCancel();
      return;
    }
  }
}

bool WeightSubscriber::stream_once(const std::shared_ptr<grpc::ChannelInterface>& channel,
                                   v1::WeightSyncService::Stub* upstream) {
  grpc::ClientContext context;
  v1::SubscribeRequest request;
  request.set_worker_id(options_.worker_id);
  if (upstream == nullptr) {
    request.set_relay_address(options_.relay_address);
    request.set_failed_upstream(failed_upstream_);
    failed_upstream_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    active_context_ = &context;
    request.set_held_version(held_version_);
    ++stats_.streams_opened;
  }
  request.set_accept_delta(options_.accept_delta);
  if (upstream == nullptr && !handler_ && !want_stream_) request.set_local_host(same_host_id_);
  want_stream_ = false;
  if (options_.accept_delta && !want_full_) {
    request.set_delta_base_version(delta_base_version());
  }
  want_full_ = false;
  DeltaReceiver delta(options_.max_version_bytes);
  bool abandoned = false;  // a delta failed: the stream is cancelled, remaining messages dropped
  // Responses arrive as raw gRPC byte buffers: a chunk of a version received in place is copied
  // from them straight into the receive buffer (zero-copy receive); every other message is
  // parsed as a SubscribeResponse.
  const grpc::internal::RpcMethod method(kSubscribeMethod,
                                         grpc::internal::RpcMethod::SERVER_STREAMING, channel);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), method, &context,
                                                                    request));
  // Stall watch of an upstream relay (a thread that cancels `context`): when the current Read
  // began (steady clock ns; 0 while not reading).
  std::atomic<int64_t> read_since_ns{0};
  std::atomic<bool> watch_done{false}, stalled{false};
  // A stream straight to weight sync is watched the same way: after a network partition the
  // stream can be dead without this end knowing (the server gave the connection up while no
  // packet got through, and a subscriber only reads), and nothing else would ever end it.
  const bool direct = upstream == nullptr;
  std::thread watcher([&] {
    watch_upstream(&context, direct ? stub_.get() : upstream, direct, &read_since_ns, &watch_done,
                   &stalled);
  });
  VersionTap* const tap = options_.tap;
  bool tapping = false;  // the tap has a version begun and not ended
  auto tap_end = [&](bool complete) {
    if (tapping) tap->end(complete);
    tapping = false;
  };
  PayloadAssembler assembler(options_.max_version_bytes);
  int64_t skipping = 0;      // a rejected version whose remaining chunks are dropped
  std::span<char> in_place;  // receiver_.target of the version being received
  std::chrono::steady_clock::time_point manifest_at;  // when its manifest arrived
  bool received = false;
  v1::SubscribeResponse message;
  grpc::ByteBuffer buffer;
  // A complete version goes to the receiver (or is rejected).
  auto finish_if_complete = [&] {
    if (!assembler.complete()) return;
    const int64_t number = assembler.version();
    absl::StatusOr<AssembledVersion> version = assembler.finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.last_receive_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - manifest_at).count();
    }
    tap_end(version.ok());
    seen_version_.store(std::max(seen_version_.load(), number));
    if (version.ok() && !handler_) {
      deliver_in_place(version->manifest, in_place.first(version->manifest.total_bytes()));
    } else if (version.ok()) {
      deliver(std::move(*version));
    } else {
      reject(number, version.status());
    }
  };
  while (true) {
    // The stall watch counts only time spent waiting here, not this worker's own receive or
    // install work.
    read_since_ns.store(std::chrono::steady_clock::now().time_since_epoch().count());
    const bool got = reader->Read(&buffer);
    read_since_ns.store(0);
    if (!got) break;
    received = true;
    if (abandoned) continue;
    // Zero-copy receive: a chunk of the version being received in place lands in its buffer
    // straight from gRPC's slices (one copy, verified as add() does).
    if (zero_copy_.load() && !handler_ && assembler.active() && !delta.active()) {
      grpc::ProtoBufferReader stream(&buffer);
      google::protobuf::io::CodedInputStream in(&stream);
      ChunkHeader h;
      if (read_chunk_header(&in, &h)) {
        if (skipping != 0 && h.version == skipping) continue;
        const int64_t version = assembler.version();
        absl::StatusOr<char*> at = assembler.chunk_target(h.version, h.offset, h.size);
        absl::Status s = at.status();
        if (s.ok() && !in.ReadRaw(*at, static_cast<int>(h.size))) {
          assembler.reset();
          s = absl::DataLossError(absl::StrCat("chunk at offset ", h.offset, " of version ",
                                               h.version, ": message shorter than its data"));
        }
        if (s.ok()) s = assembler.commit_chunk();
        if (!s.ok()) {
          tap_end(false);
          reject(version, s);
          skipping = version;
          continue;
        }
        if (tapping) tap->bytes(h.offset, std::span<const char>(*at, h.size));
        finish_if_complete();
        continue;
      }
    }
    {
      grpc::ProtoBufferReader stream(&buffer);
      if (!message.ParseFromZeroCopyStream(&stream)) {
        service::log_warn(kComponent, "unparseable subscribe message dropped",
                          {{"worker", options_.worker_id}});
        continue;
      }
    }
    if (message.has_redirect()) {
      // Weight sync places this worker behind a relay (it ends the stream after this message).
      if (upstream == nullptr && !message.redirect().upstream_address().empty()) {
        upstream_ = message.redirect();
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.relay_redirects;
      }
      continue;
    }
    if (message.has_delta()) {
      skipping = 0;
      tap_end(false);
      assembler.reset();
      const int64_t version = message.delta().target().version();
      absl::Status s = absl::FailedPreconditionError(
          absl::StrCat("delta against version ", message.delta().base_version(),
                       " but this worker holds the bytes of version ", delta_base_version()));
      if (message.delta().base_version() > 0 &&
          message.delta().base_version() == delta_base_version()) {
        s = delta.begin(std::move(*message.mutable_delta()));
      }
      if (s.ok() && !delta.complete()) continue;
      if (!s.ok()) {
        delta_failed(version, s);
        abandoned = true;
        context.TryCancel();
        continue;
      }
    } else if (message.has_chunk() && delta.active() &&
               message.chunk().version() == delta.version()) {
      const int64_t version = delta.version();
      if (absl::Status s = delta.add(message.chunk()); !s.ok()) {
        delta_failed(version, s);
        abandoned = true;
        context.TryCancel();
        continue;
      }
      if (!delta.complete()) continue;
    }
    if (delta.active() && delta.complete()) {
      // A complete delta: rebuild the full version from the base and verify every tensor.
      const auto start = std::chrono::steady_clock::now();
      AssembledVersion full;
      full.manifest = delta.delta().target();
      const std::span<const char> base = delta_base(delta.delta().base_version());
      std::span<char> out;
      absl::Status s;
      if (handler_) {
        full.payload.resize(full.manifest.total_bytes());
        out = std::span<char>(full.payload.data(), full.payload.size());
      } else {
        // In place: rebuild straight into the receive buffer the receiver hands out (never the
        // buffer that holds the base).
        absl::StatusOr<std::span<char>> target = receiver_.target(full.manifest);
        if (target.ok()) {
          out = target->first(full.manifest.total_bytes());
        } else {
          s = target.status();
        }
      }
      if (s.ok()) {
        s = apply_delta(
            delta.delta(), std::span(reinterpret_cast<const uint8_t*>(base.data()), base.size()),
            delta.payload(), std::span(reinterpret_cast<uint8_t*>(out.data()), out.size()));
      }
      const uint64_t delta_bytes = delta.payload().size();
      delta.reset();
      if (!s.ok()) {
        delta_failed(full.manifest.version(), s);
        abandoned = true;
        context.TryCancel();
        continue;
      }
      seen_version_.store(std::max(seen_version_.load(), full.manifest.version()));
      // Rebuilt and verified against the full manifest's CRC-32Cs: a relay passes it on whole.
      if (tap != nullptr) {
        tap->begin(full.manifest);
        tap->bytes(0, out);
        tap->end(true);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.versions_from_delta;
        stats_.delta_bytes_received += delta_bytes;
        stats_.delta_decode_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      if (handler_) {
        deliver(std::move(full));
      } else {
        deliver_in_place(full.manifest, out);
      }
      continue;
    }
    if (message.has_mapped() && !handler_) {
      // Same-host shortcut: the payload lies in a file weight sync wrote on this host; it is read
      // into the receive buffer through the same assembler checks as chunks.
      v1::MappedVersion& mapped = *message.mutable_mapped();
      const int64_t version = mapped.manifest().version();
      const uint64_t total = mapped.manifest().total_bytes();
      manifest_at = std::chrono::steady_clock::now();
      skipping = 0;
      delta.reset();
      tap_end(false);
      if (tap != nullptr) {
        tap->begin(mapped.manifest());
        tapping = true;
      }
      absl::StatusOr<std::span<char>> target = receiver_.target(mapped.manifest());
      absl::Status s = target.ok()
                           ? assembler.begin_into(std::move(*mapped.mutable_manifest()), *target)
                           : target.status();
      if (!s.ok()) {
        tap_end(false);
        reject(version, s);
        skipping = version;
        continue;
      }
      in_place = *target;
      s = read_same_host_file(mapped.path(), &assembler, total, kDefaultChunkBytes,
                              [&](uint64_t offset, std::span<const char> bytes) {
                                if (tapping) tap->bytes(offset, bytes);
                              });
      if (!s.ok()) {
        // Nothing of it reaches the model. Take it (and what follows) over a new stream.
        tap_end(false);
        assembler.reset();
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.same_host_fallbacks;
        }
        if (absl::IsUnavailable(s)) {
          same_host_id_.clear();
          service::log_warn(kComponent,
                            "cannot read weight sync's same-host file; taking versions over TCP",
                            {{"worker", options_.worker_id},
                             {"version", absl::StrCat(version)},
                             {"error", std::string(s.message())}});
        } else {
          reject(version, s);
          want_stream_ = true;
          service::log_warn(kComponent, "same-host file failed verification; taking it over TCP",
                            {{"worker", options_.worker_id},
                             {"version", absl::StrCat(version)},
                             {"error", std::string(s.message())}});
        }
        abandoned = true;
        context.TryCancel();
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.versions_same_host;
      }
      finish_if_complete();
      continue;
    }
    if (message.has_manifest()) {
      const int64_t version = message.manifest().version();
      manifest_at = std::chrono::steady_clock::now();
      skipping = 0;
      delta.reset();
      tap_end(false);
      if (tap != nullptr) {
        tap->begin(message.manifest());
        tapping = true;
      }
      absl::Status s;
      if (handler_) {
        s = assembler.begin(std::move(*message.mutable_manifest()));
      } else {
        absl::StatusOr<std::span<char>> target = receiver_.target(message.manifest());
        s = target.ok() ? assembler.begin_into(std::move(*message.mutable_manifest()), *target)
                        : target.status();
        if (s.ok()) in_place = *target;
      }
      if (!s.ok()) {
        tap_end(false);
        reject(version, s);
        skipping = version;
        continue;
      }
    } else if (message.has_chunk()) {
      if (skipping != 0 && message.chunk().version() == skipping) continue;
      const int64_t version = assembler.active() ? assembler.version() : message.chunk().version();
      if (absl::Status s = assembler.add(message.chunk()); !s.ok()) {
        tap_end(false);
        reject(version, s);
        skipping = version;
        continue;
      }
      if (tapping) tap->bytes(message.chunk().offset(), message.chunk().data());
    } else {
      continue;  // an empty message carries nothing
    }
    finish_if_complete();
  }
  const grpc::Status status = reader->Finish();
  tap_end(false);  // a version cut off by the end of the stream
  watch_done.store(true);
  cv_.notify_all();
  watcher.join();
  if (stalled.load() && direct) {
    service::log_warn(kComponent,
                      "subscribe stream stalled: weight sync holds a newer version and sent "
                      "nothing; reconnecting",
                      {{"worker", options_.worker_id}});
  } else if (stalled.load()) {
    service::log_warn(
        kComponent, "upstream relay stalled, leaving it",
        {{"worker", options_.worker_id}, {"upstream", upstream_.upstream_worker_id()}});
  }
  bool stopping = false;
  // Weight sync ended the stream after a redirect: the next stream goes to the relay.
  const bool redirected = upstream == nullptr && !upstream_.upstream_worker_id().empty();
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_context_ = nullptr;
    stopping = stopping_;
    // A stream this worker cancelled after a failed delta keeps the delta's error.
    if (!stopping && !abandoned && !redirected) {
      stats_.last_error =
          absl::StrCat("subscribe stream ended: ", status.ok() ? "OK" : status.error_message());
    }
  }
  if (redirected && !stopping) {
    service::log_info(kComponent, "taking versions from an upstream relay",
                      {{"worker", options_.worker_id},
                       {"upstream", upstream_.upstream_worker_id()},
                       {"address", upstream_.upstream_address()}});
  } else if (!stopping) {
    service::log_warn(kComponent, "subscribe stream ended, reconnecting",
                      {{"worker", options_.worker_id},
                       {"code", absl::StrCat(static_cast<int>(status.error_code()))},
                       {"error", status.error_message()}});
  }
  return received;
}

void WeightSubscriber::deliver(AssembledVersion version) {
  const int64_t number = version.manifest.version();
  if (number <= held_version()) return;  // already serving it (or newer)
  absl::StatusOr<model::WeightSet> set = to_weight_set(version.manifest, version.payload);
  // The tensors hold their own copy now; without deltas drop the assembled bytes before the swap.
  if (!options_.accept_delta) version.payload = std::string();
  if (!set.ok()) {
    reject(number, set.status());
    return;
  }
  if (absl::Status s = handler_(std::move(*set)); !s.ok()) {
    reject(number, s);
    return;
  }
  if (options_.accept_delta) base_ = std::move(version);
  accepted(number);
}

void WeightSubscriber::deliver_in_place(const v1::VersionManifest& manifest,
                                        std::span<const char> payload) {
  const int64_t number = manifest.version();
  if (number <= held_version()) return;  // already serving it (or newer)
  if (absl::Status s = receiver_.install(manifest, payload); !s.ok()) {
    reject(number, s);
    return;
  }
  accepted(number);
}

void WeightSubscriber::accepted(int64_t number) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_version_ = number;
    ++stats_.versions_loaded;
  }
  cv_.notify_all();
  service::log_info(kComponent, "version loaded",
                    {{"worker", options_.worker_id}, {"version", absl::StrCat(number)}});
  send_ack(number, true, "");
}

int64_t WeightSubscriber::delta_base_version() const {
  if (handler_) return base_.payload.empty() ? 0 : base_.manifest.version();
  if (!receiver_.base) return 0;
  const int64_t held = held_version();
  return held > 0 && !receiver_.base(held).empty() ? held : 0;
}

std::span<const char> WeightSubscriber::delta_base(int64_t version) const {
  if (handler_) {
    if (version <= 0 || version != base_.manifest.version()) return {};
    return std::span<const char>(base_.payload.data(), base_.payload.size());
  }
  return receiver_.base ? receiver_.base(version) : std::span<const char>();
}

void WeightSubscriber::delta_failed(int64_t version, const absl::Status& error) {
  want_full_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.delta_fallbacks;
    stats_.last_error = std::string(error.message());
  }
  service::log_warn(kComponent, "delta not applied, fetching the full version",
                    {{"worker", options_.worker_id},
                     {"version", absl::StrCat(version)},
                     {"error", std::string(error.message())}});
}

void WeightSubscriber::reject(int64_t version, const absl::Status& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.versions_rejected;
    stats_.last_error = std::string(error.message());
  }
  service::log_warn(kComponent, "version rejected",
                    {{"worker", options_.worker_id},
                     {"version", absl::StrCat(version)},
                     {"error", std::string(error.message())}});
  if (version > 0) send_ack(version, false, std::string(error.message()));
}

void WeightSubscriber::send_ack(int64_t version, bool ok, const std::string& error) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.ack_timeout);
  v1::AckRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_version(version);
  request.set_ok(ok);
  request.set_error(error);
  v1::AckResponse response;
  const grpc::Status status = stub_->Ack(&context, request, &response);
  if (!status.ok()) {
    service::log_warn(kComponent, "ack failed",
                      {{"worker", options_.worker_id},
                       {"version", absl::StrCat(version)},
                       {"error", status.error_message()}});
  }
}

}  // namespace fp8rl::weight_sync
