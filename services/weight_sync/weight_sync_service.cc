// Upload validation, version push and ack bookkeeping of the weight-sync service (see
// weight_sync_service.h).
#include "services/weight_sync/weight_sync_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/impl/codegen/method_handler.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"
#include "common/service/log.h"
#include "services/weight_sync/chunk_wire.h"

namespace fp8rl::weight_sync {

// Where a Subscribe stream's messages go.
class PushSink {
 public:
  virtual ~PushSink() = default;
  // False when the stream broke.
  virtual bool write(const v1::SubscribeResponse& message) = 0;
  // A WeightChunk of `version` at `offset` holding `data`, which `owner` keeps alive.
  virtual bool write_chunk(int64_t version, uint64_t offset, std::string_view data,
                           const std::shared_ptr<const void>& owner) = 0;
};

namespace {

// The index of `method` among WeightSyncService's methods: the generated service registers its
// handlers in the order of proto/fp8rl/v1/weight_sync.proto, which the descriptor gives, so a
// reordered proto moves the raw handlers with it.
int method_index(const char* method) {
  const google::protobuf::ServiceDescriptor* service =
      v1::SubscribeRequest::descriptor()->file()->FindServiceByName("WeightSyncService");
  const google::protobuf::MethodDescriptor* m =
      service == nullptr ? nullptr : service->FindMethodByName(method);
  // Both are compiled into this binary from the same proto: absence is a build error, not input.
  if (m == nullptr) std::abort();
  return m->index();
}

// A chunk copied into a reused SubscribeResponse, as the service always sent them before.
bool write_copied_chunk(int64_t version, uint64_t offset, std::string_view data,
                        v1::SubscribeResponse* message,
                        const std::function<bool(const v1::SubscribeResponse&)>& write) {
  v1::WeightChunk* chunk = message->mutable_chunk();
  chunk->set_version(version);
  chunk->set_offset(offset);
  chunk->set_data(data.data(), data.size());
  return write(*message);
}

// The generated Subscribe's writer (reached only when the method is called in process).
class MessageSink final : public PushSink {
 public:
  explicit MessageSink(grpc::ServerWriter<v1::SubscribeResponse>* writer) : writer_(writer) {}
  bool write(const v1::SubscribeResponse& message) override { return writer_->Write(message); }
  bool write_chunk(int64_t version, uint64_t offset, std::string_view data,
                   const std::shared_ptr<const void>& /*owner*/) override {
    return write_copied_chunk(version, offset, data, &chunk_,
                              [this](const v1::SubscribeResponse& m) { return write(m); });
  }

 private:
  grpc::ServerWriter<v1::SubscribeResponse>* writer_;
  v1::SubscribeResponse chunk_;
};

// The registered handler's stream of raw ByteBuffers. With *zero_copy a chunk is two slices: its
// encoded header (tags, version, offset, data length; a few bytes) and a slice over the stored
// bytes that holds a reference to their owner until gRPC has written them, so the payload is
// neither copied into a message nor serialized again.
class ByteBufferSink final : public PushSink {
 public:
  ByteBufferSink(grpc::ServerSplitStreamer<v1::SubscribeRequest, grpc::ByteBuffer>* stream,
                 const std::atomic<bool>* zero_copy)
      : stream_(stream), zero_copy_(zero_copy) {}

  bool write(const v1::SubscribeResponse& message) override {
    grpc::ByteBuffer buffer;
    bool own = false;
    if (!grpc::SerializationTraits<v1::SubscribeResponse>::Serialize(message, &buffer, &own).ok()) {
      return false;
    }
    return stream_->Write(buffer);
  }

  bool write_chunk(int64_t version, uint64_t offset, std::string_view data,
                   const std::shared_ptr<const void>& owner) override {
    if (!zero_copy_->load()) {
      return write_copied_chunk(version, offset, data, &chunk_,
                                [this](const v1::SubscribeResponse& m) { return write(m); });
    }
    uint8_t header[kMaxChunkHeaderBytes];
    const size_t header_size = write_chunk_header(
        {.version = version, .offset = offset, .size = static_cast<uint32_t>(data.size())}, header);
    grpc::Slice slices[2] = {
        grpc::Slice(header, header_size),
        // gRPC only reads a slice it sends; the owner reference is dropped when it is done.
        grpc::Slice(const_cast<char*>(data.data()), data.size(), &release_owner,
                    new std::shared_ptr<const void>(owner))};
    const grpc::ByteBuffer buffer(slices, 2);
    return stream_->Write(buffer);
  }

 private:
  static void release_owner(void* owner) {
    delete static_cast<std::shared_ptr<const void>*>(owner);
  }

  grpc::ServerSplitStreamer<v1::SubscribeRequest, grpc::ByteBuffer>* stream_;
  const std::atomic<bool>* zero_copy_;  // read per chunk, so a switch reaches open streams
  v1::SubscribeResponse chunk_;
};

constexpr std::string_view kComponent = "weight-sync";

int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One upload message read as a chunk straight into the assembler's target (zero copy from gRPC's
// slices): true when it was a chunk (landed and verified), false when it is some other message
// (the caller parses it as a request). DataLoss when the message is shorter than its header says.
absl::StatusOr<bool> receive_chunk_in_place(grpc::ByteBuffer* buffer, PayloadAssembler* assembler,
                                            WeightSyncMetrics* metrics, ChunkHeader* h) {
  grpc::ProtoBufferReader stream(buffer);
  google::protobuf::io::CodedInputStream in(&stream);
  if (!read_chunk_header(&in, h)) return false;
  metrics->received_bytes->get().inc(static_cast<double>(h->size));
  absl::StatusOr<char*> at = assembler->chunk_target(h->version, h->offset, h->size);
  if (!at.ok()) return at.status();
  if (!in.ReadRaw(*at, static_cast<int>(h->size))) {
    return absl::DataLossError(absl::StrCat("chunk at offset ", h->offset, " of version ",
                                            h->version, ": message shorter than its data"));
  }
  if (absl::Status s = assembler->commit_chunk(); !s.ok()) return s;
  return true;
}

}  // namespace

absl::Status validate_options(const WeightSyncOptions& options) {
  if (options.keep_versions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_versions: must be >= 1, got ", options.keep_versions));
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_bytes: must be in [1, ", kMaxChunkBytes,
                                                   "], got ", options.chunk_bytes));
  }
  if (options.max_version_bytes == 0) {
    return absl::InvalidArgumentError("max_version_bytes: must be > 0");
  }
  if (options.poll_interval.count() <= 0) {
    return absl::InvalidArgumentError("poll_interval: must be > 0");
  }
  if (options.part_timeout.count() <= 0) {
    return absl::InvalidArgumentError("part_timeout: must be > 0");
  }
  if (!(options.delta_max_fraction > 0 && options.delta_max_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta_max_fraction: must be in (0, 1], got ", options.delta_max_fraction));
  }
  if (options.delta_zstd_level < 1 || options.delta_zstd_level > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta_zstd_level: must be in [1, 19], got ", options.delta_zstd_level));
  }
  if (options.fanout.k < 1 || options.fanout.k > kMaxTreeFanout) {
    return absl::InvalidArgumentError(
        absl::StrCat("fanout.k: must be in [1, ", kMaxTreeFanout, "], got ", options.fanout.k));
  }
  if (options.same_host == SameHostMode::kAuto && options.same_host_dir.empty()) {
    return absl::InvalidArgumentError("same_host_dir: must not be empty with same_host auto");
  }
  return absl::OkStatus();
}

WeightSyncServiceImpl::WeightSyncServiceImpl(WeightSyncOptions options, WeightSyncMetrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      topology_(options_.fanout),
      pacer_(options_.emulated_link_bytes_per_second),
      pool_(std::make_shared<PayloadPool>(options_.reuse_payload_buffers ? 1 : 0)),
      store_(options_.keep_versions),
      host_id_(local_host_id()),
      same_host_files_(options_.same_host_dir) {
  cut_through_.store(options_.cut_through);
  same_host_.store(options_.same_host == SameHostMode::kAuto);
  // Subscribe is served by a handler that writes raw ByteBuffers (the bytes on the wire are the
  // same SubscribeResponse messages), so chunks can be sent as slices over the stored version.
  MarkMethodStreamed(
      method_index("Subscribe"),
      new grpc::internal::SplitServerStreamingHandler<v1::SubscribeRequest, grpc::ByteBuffer>(
          [this](grpc::ServerContext* context,
                 grpc::ServerSplitStreamer<v1::SubscribeRequest, grpc::ByteBuffer>* stream) {
            v1::SubscribeRequest request;
            if (!stream->Read(&request)) {
              return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no SubscribeRequest");
            }
            ByteBufferSink sink(stream, &zero_copy_send_);
            return subscribe(context, request, sink);
          }));
  // UploadVersion likewise reads raw ByteBuffers, so a chunk's data is copied once, from gRPC's
  // slices into the payload buffer, instead of into a parsed message and then again into the
  // payload. Served as a bidirectional stream that writes its one response at the end (the same
  // messages on the wire as the client-streaming call the client makes).
  MarkMethodStreamed(
      method_index("UploadVersion"),
      new grpc::internal::BidiStreamingHandler<WeightSyncServiceImpl, grpc::ByteBuffer,
                                               v1::UploadVersionResponse>(
          [](WeightSyncServiceImpl* service, grpc::ServerContext* context,
             grpc::ServerReaderWriter<v1::UploadVersionResponse, grpc::ByteBuffer>* stream) {
            v1::UploadVersionResponse response;
            grpc::Status status = service->receive_upload(
                context, [stream](grpc::ByteBuffer* b) { return stream->Read(b); }, &response);
            if (status.ok()) stream->Write(response);
            return status;
          },
          this));
}

grpc::Status WeightSyncServiceImpl::reject_upload(const absl::Status& status, int64_t version) {
  rejected_.fetch_add(1);
  metrics_->uploads->with({"rejected"}).inc();
  service::log_warn(kComponent, "upload rejected",
                    {{"version", absl::StrCat(version)}, {"error", std::string(status.message())}});
  return service::to_grpc_status(status);
}

grpc::Status WeightSyncServiceImpl::UploadVersion(
    grpc::ServerContext* context, grpc::ServerReader<v1::UploadVersionRequest>* reader,
    v1::UploadVersionResponse* response) {
  // Reached only when called in process (gRPC calls the raw handler registered in the
  // constructor): each message is serialized again and received as the raw handler does.
  v1::UploadVersionRequest request;
  return receive_upload(
      context,
      [&](grpc::ByteBuffer* buffer) {
        if (!reader->Read(&request)) return false;
        bool own = false;
        return grpc::SerializationTraits<v1::UploadVersionRequest>::Serialize(request, buffer, &own)
            .ok();
      },
      response);
}

grpc::Status WeightSyncServiceImpl::receive_upload(
    grpc::ServerContext* context, const std::function<bool(grpc::ByteBuffer*)>& read,
    v1::UploadVersionResponse* response) {
  // Only holders of the cluster token publish weights to every generation worker.
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) {
    return reject_upload(service::from_grpc_status(auth), 0);
  }
  if (shutting_down_.load()) {
    return reject_upload(absl::UnavailableError("weight sync is shutting down"), 0);
  }
  if (!options_.accept_uploads) {
    return reject_upload(absl::FailedPreconditionError(
                             "this is a generation worker's relay: upload to weight sync instead"),
                         0);
  }
  PayloadAssembler assembler(options_.max_version_bytes);
  v1::UploadVersionRequest request;
  grpc::ByteBuffer buffer;
  bool have_manifest = false;
  int64_t version = 0;
  // With zero-copy receive, the payload buffer the chunks are copied into straight from gRPC's
  // slices (PayloadAssembler::begin_into); empty otherwise (the assembler owns the payload).
  std::string in_place;
  // With cut-through, the version being received is announced to Subscribe streams as it arrives:
  // its StoredVersion owns the payload buffer from the start (in_place stays empty).
  std::shared_ptr<StoredVersion> arriving_version;
  std::shared_ptr<ArrivingVersion> arriving;
  // An upload that ends without being stored withdraws its arrival (streams relaying it stop).
  struct ArrivalEnd {
    VersionStore& store;
    std::shared_ptr<ArrivingVersion>& arriving;
    ~ArrivalEnd() {
      if (arriving == nullptr) return;
      arriving->finish(false);
      store.end_arrival(arriving.get());
    }
  } arrival_end{store_, arriving};
  while (read(&buffer)) {
    if (have_manifest && (!in_place.empty() || arriving != nullptr)) {
      ChunkHeader h;
      if (absl::StatusOr<bool> chunk = receive_chunk_in_place(&buffer, &assembler, metrics_, &h);
          !chunk.ok() || *chunk) {
        if (!chunk.ok()) return reject_upload(chunk.status(), version);
        // Chunks arrive in order (the assembler refuses gaps and overlaps) and every tensor that
        // ends in them has passed its CRC-32C: this prefix is final.
        if (arriving != nullptr) arriving->advance(h.offset + h.size);
        continue;
      }
    }
    {
      grpc::ProtoBufferReader stream(&buffer);
      if (!request.ParseFromZeroCopyStream(&stream)) {
        return reject_upload(absl::InvalidArgumentError("an upload message that does not parse"),
                             version);
      }
    }
    if (!have_manifest) {
      if (request.has_mapped()) {
        return receive_mapped_upload(read, std::move(*request.mutable_mapped()), response);
      }
      if (!request.has_manifest()) {
        return reject_upload(
            absl::InvalidArgumentError("the first upload message must be a manifest"), 0);
      }
      version = request.manifest().version();
      if (const int64_t latest = store_.latest_version(); version <= latest) {
        return reject_upload(absl::InvalidArgumentError(absl::StrCat(
                                 "manifest.version: ", version,
                                 " is not newer than the latest stored version ", latest)),
                             version);
      }
      if (is_multipart(request.manifest())) {
        return receive_part(context, read, std::move(*request.mutable_manifest()), response);
      }
      const uint64_t total = request.manifest().total_bytes();
      absl::Status s;
      // Sized only after the bound check (begin() reports a version that is too large).
      if (zero_copy_receive_.load() && cut_through_.load() && total > 0 &&
          total <= options_.max_version_bytes) {
        // Once the store evicted it and the last stream sending it let go, its buffer goes back
        // to the pool for a later upload.
        arriving_version.reset(new StoredVersion, [pool = pool_](StoredVersion* v) {
          pool->give(std::move(v->payload));
          delete v;
        });
        arriving_version->manifest = request.manifest();  // fixed from here on: streams read it
        arriving_version->payload = pool_->take(total);
        arriving_version->payload.resize(total);
        arriving_version->arrived = std::chrono::steady_clock::now();
        char* data = arriving_version->payload.data();
        s = assembler.begin_into(std::move(*request.mutable_manifest()),
                                 std::span<char>(data, total));
        if (s.ok()) {
          arriving = std::make_shared<ArrivingVersion>(arriving_version, data);
          store_.begin_arrival(arriving);
        }
      } else if (zero_copy_receive_.load() && total > 0 && total <= options_.max_version_bytes) {
        in_place = pool_->take(total);
        in_place.resize(total);
        s = assembler.begin_into(std::move(*request.mutable_manifest()),
                                 std::span<char>(in_place.data(), in_place.size()));
      } else {
        s = assembler.begin(std::move(*request.mutable_manifest()), pool_->take(total));
      }
      if (!s.ok()) return reject_upload(s, version);
      have_manifest = true;
      continue;
    }
    if (request.has_manifest()) {
      return reject_upload(absl::InvalidArgumentError("a second manifest in one upload"), version);
    }
    if (!request.has_chunk()) {
      return reject_upload(absl::InvalidArgumentError("a message with neither manifest nor chunk"),
                           version);
    }
    metrics_->received_bytes->get().inc(static_cast<double>(request.chunk().data().size()));
    if (absl::Status s = assembler.add(request.chunk()); !s.ok()) return reject_upload(s, version);
  }
  if (context->IsCancelled()) {
    return reject_upload(absl::CancelledError("upload cancelled by the client"), version);
  }
  if (!have_manifest) {
    return reject_upload(absl::InvalidArgumentError("empty upload: no manifest"), version);
  }
  absl::StatusOr<AssembledVersion> assembled = assembler.finish();
  if (!assembled.ok()) return reject_upload(assembled.status(), version);

  std::shared_ptr<StoredVersion> stored = arriving_version;
  if (stored == nullptr) {
    // Once the store evicted it and the last stream sending it let go, its buffer goes back to
    // the pool for a later upload.
    stored.reset(new StoredVersion, [pool = pool_](StoredVersion* v) {
      pool->give(std::move(v->payload));
      delete v;
    });
    stored->manifest = std::move(assembled->manifest);
    stored->payload = in_place.empty() ? std::move(assembled->payload) : std::move(in_place);
    stored->arrived = std::chrono::steady_clock::now();
  }
  // (An arriving version's manifest and payload were final from its first byte: streams relaying
  // it read them, so nothing of it is written here.)
  const uint64_t bytes = stored->payload.size();
  const v1::WeightFormat format = stored->manifest.format();
  const int num_tensors = stored->manifest.tensors_size();
  // Registered as pending before the store wakes the Subscribe streams, so no ack is missed (with
  // cut-through too: the last byte of an arriving version is released only once it is stored).
  workers_.published(version, std::chrono::steady_clock::now());
  if (absl::Status s = store_.add(stored); !s.ok()) return reject_upload(s, version);
  if (arriving != nullptr) {
    arriving->finish(true);
    arriving.reset();  // stored now: nothing to withdraw
  }

  record_stored(version, format, num_tensors, bytes, 1);
  response->set_version(version);
  response->set_bytes_received(bytes);
  return grpc::Status::OK;
}

grpc::Status WeightSyncServiceImpl::receive_mapped_upload(
    const std::function<bool(grpc::ByteBuffer*)>& read, v1::MappedUpload mapped,
    v1::UploadVersionResponse* response) {
  const int64_t version = mapped.manifest().version();
  if (!same_host_.load()) {
    return reject_upload(
        absl::FailedPreconditionError("same-host uploads need weight sync's --same-host auto"),
        version);
  }
  if (host_id_.empty() || mapped.local_host() != host_id_) {
    return reject_upload(absl::FailedPreconditionError(
                             "mapped.local_host: the uploader does not run on weight sync's host"),
                         version);
  }
  if (!is_upload_file_path(same_host_files_.dir(), mapped.path())) {
    return reject_upload(absl::InvalidArgumentError(absl::StrCat(
                             "mapped.path: must name an fp8rl-upload-* file directly under ",
                             same_host_files_.dir(), ", got '", mapped.path(), "'")),
                         version);
  }
  if (const int64_t latest = store_.latest_version(); version <= latest) {
    return reject_upload(absl::InvalidArgumentError(
                             absl::StrCat("mapped.manifest.version: ", version,
                                          " is not newer than the latest stored version ", latest)),
                         version);
  }
  if (is_multipart(mapped.manifest())) {
    return reject_upload(
        absl::InvalidArgumentError("mapped.manifest: a same-host upload is sent as one part"),
        version);
  }
  if (grpc::ByteBuffer extra; read(&extra)) {
    return reject_upload(
        absl::InvalidArgumentError("a same-host upload is one message; another followed it"),
        version);
  }
  const uint64_t total = mapped.manifest().total_bytes();
  PayloadAssembler assembler(options_.max_version_bytes);
  std::string payload;
  if (total > 0 && total <= options_.max_version_bytes) {
    payload = pool_->take(total);
    payload.resize(total);
  }
  // begin_into reports an empty or too large version before anything is read.
  if (absl::Status s = assembler.begin_into(std::move(*mapped.mutable_manifest()),
                                            std::span<char>(payload.data(), payload.size()));
      !s.ok()) {
    return reject_upload(s, version);
  }
  if (absl::Status s =
          read_same_host_file(mapped.path(), &assembler, total, kDefaultChunkBytes, nullptr);
      !s.ok()) {
    // A file that is not there or not whole: the uploader falls back to the stream. A CRC
    // mismatch stays DATA_LOSS.
    return reject_upload(
        s.code() == absl::StatusCode::kUnavailable ? absl::FailedPreconditionError(s.message()) : s,
        version);
  }
  metrics_->received_bytes->get().inc(static_cast<double>(total));
  absl::StatusOr<AssembledVersion> assembled = assembler.finish();
  if (!assembled.ok()) return reject_upload(assembled.status(), version);
  std::shared_ptr<StoredVersion> stored(new StoredVersion, [pool = pool_](StoredVersion* v) {
    pool->give(std::move(v->payload));
    delete v;
  });
  stored->manifest = std::move(assembled->manifest);
  stored->payload = std::move(payload);
  stored->arrived = std::chrono::steady_clock::now();
  const v1::WeightFormat format = stored->manifest.format();
  const int num_tensors = stored->manifest.tensors_size();
  // The uploader's file becomes this version's same-host file before the store wakes the
  // streams, so the workers on this host read it and nothing is written again (a failed rename
  // only costs that write; the uploader then removes its file).
  if (absl::StatusOr<std::shared_ptr<const SameHostFile>> adopted =
          same_host_files_.adopt(version, mapped.path(), total);
      !adopted.ok()) {
    service::log_warn(
        kComponent, "cannot keep a same-host upload's file",
        {{"version", absl::StrCat(version)}, {"error", std::string(adopted.status().message())}});
  }
  workers_.published(version, std::chrono::steady_clock::now());
  if (absl::Status s = store_.add(stored); !s.ok()) return reject_upload(s, version);
  record_stored(version, format, num_tensors, total, 1);
  response->set_version(version);
  response->set_bytes_received(total);
  response->set_same_host(true);
  return grpc::Status::OK;
}

void WeightSyncServiceImpl::record_stored(int64_t version, v1::WeightFormat format, int num_tensors,
                                          uint64_t bytes, uint32_t parts) {
  metrics_->uploads->with({"accepted"}).inc();
  metrics_->latest_version->get().set(static_cast<double>(version));
  for (v1::WeightFormat f : {v1::WEIGHT_FORMAT_FP8, v1::WEIGHT_FORMAT_BF16}) {
    metrics_->version_bytes->with({std::string(format_label(f))})
        .set(f == format ? static_cast<double>(bytes) : 0.0);
  }
  metrics_->version_wire_bytes->with({"full"}).set(static_cast<double>(bytes));
  service::log_info(kComponent, "version stored",
                    {{"version", absl::StrCat(version)},
                     {"format", std::string(format_label(format))},
                     {"tensors", absl::StrCat(num_tensors)},
                     {"bytes", absl::StrCat(bytes)},
                     {"parts", absl::StrCat(parts)}});
}

grpc::Status WeightSyncServiceImpl::receive_part(grpc::ServerContext* context,
                                                 const std::function<bool(grpc::ByteBuffer*)>& read,
                                                 v1::VersionManifest manifest,
                                                 v1::UploadVersionResponse* response) {
  const int64_t version = manifest.version();
  if (absl::Status s = validate_manifest(manifest, options_.max_version_bytes); !s.ok()) {
    return reject_upload(s, version);
  }
  absl::StatusOr<PartRange> range = part_range(manifest);
  if (!range.ok()) return reject_upload(range.status(), version);
  const uint32_t index = manifest.part_index();

  // The first part of a version sets up the shared payload buffer and its arrival; the others
  // join it.
  // Attempts are told apart by upload_id, a later attempt having a larger one: a part of an
  // earlier attempt than the one in progress, or of one that failed, is refused (ABORTED); a part
  // of a later one ends the attempt in progress (ABORTED for its parts) and starts anew.
  std::shared_ptr<PartAssembly> assembly;
  std::shared_ptr<PartAssembly> superseded;
  std::shared_ptr<ArrivingVersion> announce;  // a new attempt's arrival, for cut-through
  const uint64_t upload_id = manifest.upload_id();
  {
    std::lock_guard<std::mutex> lock(parts_mu_);
    auto it = parts_.find(version);
    const auto f = failed_parts_.find(version);
    if (it != parts_.end() && it->second->upload_id() == upload_id) {
      assembly = it->second;
    } else if ((it != parts_.end() && it->second->upload_id() > upload_id) ||
               (it == parts_.end() && f != failed_parts_.end() &&
                f->second.upload_id >= upload_id)) {
      return reject_upload(
          absl::AbortedError(absl::StrCat(
              "version ", version, ": upload_id ", upload_id, " is a stale attempt (",
              it != parts_.end()
                  ? absl::StrCat("upload_id ", it->second->upload_id(), " is in progress")
                  : absl::StrCat("upload_id ", f->second.upload_id, " failed in ",
                                 f->second.failure.message()),
              ")")),
          version);
    } else {
      if (it != parts_.end()) superseded = it->second;
      failed_parts_.erase(version);  // a new attempt
      const uint64_t total = manifest.total_bytes();
      // As a single-part upload with cut-through: fixed from the first byte, its buffer back to
      // the pool once evicted and no longer sent.
      std::shared_ptr<StoredVersion> stored(new StoredVersion, [pool = pool_](StoredVersion* v) {
        pool->give(std::move(v->payload));
        delete v;
      });
      stored->manifest = manifest;  // what Subscribe streams send: a single-part manifest
      stored->manifest.clear_part_index();
      stored->manifest.clear_part_count();
      stored->manifest.clear_part_offsets();
      stored->payload = pool_->take(total);
      stored->payload.resize(total);
      stored->arrived = std::chrono::steady_clock::now();
      auto arriving = std::make_shared<ArrivingVersion>(stored, stored->payload.data());
      assembly = std::make_shared<PartAssembly>(manifest, stored, arriving,
                                                stored->arrived + options_.part_timeout);
      parts_[version] = assembly;
      if (cut_through_.load()) announce = arriving;
    }
  }
  if (superseded != nullptr) {
    // Withdrawn first: the store announces one arrival per version.
    fail_parts(superseded, absl::AbortedError(absl::StrCat("superseded by upload_id ", upload_id)));
  }
  if (announce != nullptr) {
    store_.begin_arrival(announce);
    // A part that failed the attempt before it was announced found nothing to withdraw.
    if (assembly->failed()) store_.end_arrival(announce.get());
  }
  const std::string part = absl::StrCat("part ", index, " of ", assembly->part_count());
  // This part failed the version: every other part stops with it.
  auto fail = [&](const absl::Status& s) {
    fail_parts(assembly, absl::Status(s.code(), absl::StrCat(part, ": ", s.message())));
    return reject_upload(s, version);
  };
  // Another part failed the version (a missing part fails every waiting part alike).
  auto aborted = [&] {
    const absl::Status failure = assembly->failure();
    if (failure.code() == absl::StatusCode::kDeadlineExceeded) {
      return reject_upload(failure, version);
    }
    return reject_upload(
        absl::AbortedError(absl::StrCat("version ", version, " failed in ", failure.message())),
        version);
  };
  if (absl::Status s = assembly->begin_part(manifest); !s.ok()) {
    if (assembly->failed()) return aborted();
    return fail(s);
  }

  StoredVersion& stored = *assembly->stored();
  ArrivingVersion& arriving = *assembly->arriving();
  PayloadAssembler assembler(options_.max_version_bytes);
  if (absl::Status s = assembler.begin_part_into(
          std::move(manifest), std::span<char>(stored.payload.data(), stored.payload.size()),
          *range);
      !s.ok()) {
    return fail(s);
  }
  v1::UploadVersionRequest request;
  grpc::ByteBuffer buffer;
  while (read(&buffer)) {
    if (assembly->failed()) return aborted();
    if (zero_copy_receive_.load()) {
      ChunkHeader h;
      if (absl::StatusOr<bool> chunk = receive_chunk_in_place(&buffer, &assembler, metrics_, &h);
          !chunk.ok() || *chunk) {
        if (!chunk.ok()) return fail(chunk.status());
        // In order within the part, every tensor ending in it verified: this range is final.
        arriving.add_ready(h.offset, h.offset + h.size);
        continue;
      }
    }
    {
      grpc::ProtoBufferReader stream(&buffer);
      if (!request.ParseFromZeroCopyStream(&stream)) {
        return fail(absl::InvalidArgumentError("an upload message that does not parse"));
      }
    }
    if (request.has_manifest()) {
      return fail(absl::InvalidArgumentError("a second manifest in one upload"));
    }
    if (!request.has_chunk()) {
      return fail(absl::InvalidArgumentError("a message with neither manifest nor chunk"));
    }
    metrics_->received_bytes->get().inc(static_cast<double>(request.chunk().data().size()));
    if (absl::Status s = assembler.add(request.chunk()); !s.ok()) return fail(s);
    arriving.add_ready(request.chunk().offset(),
                       request.chunk().offset() + request.chunk().data().size());
  }
  if (assembly->failed()) return aborted();  // while this part's last messages came in
  if (context->IsCancelled()) return fail(absl::CancelledError("upload cancelled by the client"));
  if (absl::StatusOr<AssembledVersion> done = assembler.finish(); !done.ok()) {
    return fail(done.status());
  }
  if (assembly->end_part(index)) {
    // The last part to end stores the version for all of them.
    if (absl::Status s = store_parts(assembly); !s.ok()) return fail(s);
  } else {
    bool stored_now = false;
    while (!stored_now) {
      if (context->IsCancelled()) {
        return fail(absl::CancelledError("upload cancelled by the client"));
      }
      if (shutting_down_.load()) {
        return fail(absl::UnavailableError("weight sync is shutting down"));
      }
      switch (assembly->wait(options_.poll_interval)) {
        case PartAssembly::Wait::kStored:
          stored_now = true;
          break;
        case PartAssembly::Wait::kFailed:
          return aborted();
        case PartAssembly::Wait::kMissingParts: {
          const absl::Status missing = assembly->missing_parts_error();
          fail_parts(assembly, missing);
          return reject_upload(missing, version);
        }
        case PartAssembly::Wait::kPending:
          break;
      }
    }
  }
  response->set_version(version);
  response->set_bytes_received(range->end - range->begin);
  return grpc::Status::OK;
}

void WeightSyncServiceImpl::fail_parts(const std::shared_ptr<PartAssembly>& assembly,
                                       const absl::Status& status) {
  if (!assembly->fail(status)) return;
  assembly->arriving()->finish(false);
  store_.end_arrival(assembly->arriving().get());
  {
    std::lock_guard<std::mutex> lock(parts_mu_);
    if (auto it = parts_.find(assembly->version()); it != parts_.end() && it->second == assembly) {
      parts_.erase(it);
    }
    const int64_t latest = store_.latest_version();
    std::erase_if(failed_parts_, [&](const auto& f) { return f.first <= latest; });
    failed_parts_[assembly->version()] = {assembly->upload_id(), status};
    while (failed_parts_.size() > kMaxFailedAttempts) failed_parts_.erase(failed_parts_.begin());
  }
  service::log_warn(
      kComponent, "parallel upload failed; nothing stored",
      {{"version", absl::StrCat(assembly->version())}, {"error", std::string(status.message())}});
}

absl::Status WeightSyncServiceImpl::store_parts(const std::shared_ptr<PartAssembly>& assembly) {
  const StoredVersion& stored = *assembly->stored();
  // Registered as pending before the store wakes the Subscribe streams (as a single upload).
  workers_.published(stored.version(), std::chrono::steady_clock::now());
  if (absl::Status s = store_.add(assembly->stored()); !s.ok()) return s;
  assembly->arriving()->finish(true);
  assembly->complete(absl::OkStatus());
  {
    std::lock_guard<std::mutex> lock(parts_mu_);
    if (auto it = parts_.find(stored.version()); it != parts_.end() && it->second == assembly) {
      parts_.erase(it);
    }
  }
  record_stored(stored.version(), stored.manifest.format(), stored.manifest.tensors_size(),
                stored.payload.size(), assembly->part_count());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WeightSyncServiceImpl::LocalUpload>>
WeightSyncServiceImpl::begin_local_upload(const v1::VersionManifest& manifest) {
  if (shutting_down_.load()) return absl::UnavailableError("weight sync is shutting down");
  const int64_t version = manifest.version();
  if (const int64_t latest = store_.latest_version(); version <= latest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "manifest.version: ", version, " is not newer than the latest stored version ", latest));
  }
  const uint64_t total = manifest.total_bytes();
  if (total == 0 || total > options_.max_version_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("manifest.total_bytes: must be in [1, ",
                                                   options_.max_version_bytes, "], got ", total));
  }
  // As an upload with cut-through: fixed from the first byte, its buffer back to the pool once
  // evicted and no longer sent.
  std::shared_ptr<StoredVersion> stored(new StoredVersion, [pool = pool_](StoredVersion* v) {
    pool->give(std::move(v->payload));
    delete v;
  });
  stored->manifest = manifest;
  stored->payload = pool_->take(total);
  stored->payload.resize(total);
  stored->arrived = std::chrono::steady_clock::now();
  auto arriving = std::make_shared<ArrivingVersion>(stored, stored->payload.data());
  store_.begin_arrival(arriving);
  return std::unique_ptr<LocalUpload>(
      new LocalUpload(this, std::move(stored), std::move(arriving)));
}

absl::Status WeightSyncServiceImpl::LocalUpload::add(uint64_t offset, std::span<const char> bytes) {
  const uint64_t total = arriving_->total_bytes();
  if (offset != received_ || bytes.size() > total - received_) {
    return absl::InvalidArgumentError(absl::StrCat("local upload of version ", version(),
                                                   ": bytes at offset ", offset, " (", bytes.size(),
                                                   " long) after ", received_, " of ", total));
  }
  std::memcpy(arriving_->data() + offset, bytes.data(), bytes.size());
  received_ += bytes.size();
  service_->metrics_->received_bytes->get().inc(static_cast<double>(bytes.size()));
  arriving_->advance(received_);
  return absl::OkStatus();
}

absl::Status WeightSyncServiceImpl::LocalUpload::finish() {
  if (received_ != arriving_->total_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat("local upload of version ", version(), ": ",
                                                      received_, " of ", arriving_->total_bytes(),
                                                      " bytes given"));
  }
  service_->workers_.published(version(), std::chrono::steady_clock::now());
  if (absl::Status s = service_->store_.add(version_); !s.ok()) return s;
  arriving_->finish(true);
  stored_ = true;  // add() ended the arrival
  service_->metrics_->latest_version->get().set(static_cast<double>(version()));
  return absl::OkStatus();
}

WeightSyncServiceImpl::LocalUpload::~LocalUpload() {
  if (stored_) return;
  arriving_->finish(false);
  service_->store_.end_arrival(arriving_.get());
}

bool WeightSyncServiceImpl::send_chunks(int64_t version, std::string_view payload,
                                        std::shared_ptr<const void> owner,
                                        grpc::ServerContext* context, PushSink& sink) {
  for (uint64_t offset = 0; offset < payload.size(); offset += options_.chunk_bytes) {
    if (context->IsCancelled() || shutting_down_.load()) return false;
    const uint64_t n = std::min<uint64_t>(options_.chunk_bytes, payload.size() - offset);
    pacer_.take(n);
    if (!sink.write_chunk(version, offset, payload.substr(offset, n), owner)) return false;
    metrics_->sent_bytes->get().inc(static_cast<double>(n));
  }
  return true;
}

bool WeightSyncServiceImpl::send_version(const StoredVersionPtr& version,
                                         grpc::ServerContext* context, PushSink& sink) {
  v1::SubscribeResponse message;
  *message.mutable_manifest() = version->manifest;
  if (!sink.write(message)) return false;
  return send_chunks(version->version(), version->payload, version, context, sink);
}

bool WeightSyncServiceImpl::send_same_host(const StoredVersionPtr& version,
                                           const SameHostFile& file, PushSink& sink) {
  v1::SubscribeResponse message;
  *message.mutable_mapped()->mutable_manifest() = version->manifest;
  message.mutable_mapped()->set_path(file.path());
  return sink.write(message);
}

bool WeightSyncServiceImpl::relay_version(const std::shared_ptr<ArrivingVersion>& arriving,
                                          grpc::ServerContext* context, PushSink& sink,
                                          bool* upload_failed) {
  const StoredVersionPtr& version = arriving->stored();
  v1::SubscribeResponse message;
  *message.mutable_manifest() = version->manifest;
  if (!sink.write(message)) return false;
  const uint64_t total = arriving->total_bytes();
  const char* data = arriving->data();
  for (uint64_t offset = 0; offset < total; offset += options_.chunk_bytes) {
    const uint64_t n = std::min<uint64_t>(options_.chunk_bytes, total - offset);
    uint64_t ready = 0;
    while (true) {
      if (context->IsCancelled() || shutting_down_.load()) return false;
      if (arriving->wait(offset + n, options_.poll_interval, &ready) ==
          ArrivingVersion::State::kFailed) {
        *upload_failed = true;
        return false;
      }
      if (ready >= offset + n) break;
    }
    // Bytes below `ready` are final; the stored version keeps them alive while gRPC sends them.
    pacer_.take(n);
    if (!sink.write_chunk(version->version(), offset, std::string_view(data + offset, n),
                          version)) {
      return false;
    }
    metrics_->sent_bytes->get().inc(static_cast<double>(n));
  }
  return true;
}

StoredVersionPtr WeightSyncServiceImpl::wait_arrived(
    const std::shared_ptr<ArrivingVersion>& arriving, grpc::ServerContext* context) {
  uint64_t ready = 0;
  while (!context->IsCancelled() && !shutting_down_.load()) {
    const ArrivingVersion::State state =
        arriving->wait(arriving->total_bytes(), options_.poll_interval, &ready);
    if (state == ArrivingVersion::State::kFailed) return nullptr;
    if (ready >= arriving->total_bytes()) return arriving->stored();
  }
  return nullptr;
}

bool WeightSyncServiceImpl::send_delta(const std::shared_ptr<const EncodedDelta>& delta,
                                       grpc::ServerContext* context, PushSink& sink) {
  v1::SubscribeResponse message;
  *message.mutable_delta() = delta->manifest;
  if (!sink.write(message)) return false;
  return send_chunks(delta->manifest.target().version(), delta->payload, delta, context, sink);
}

std::shared_ptr<const EncodedDelta> WeightSyncServiceImpl::delta_for(const StoredVersion& base,
                                                                     const StoredVersion& target) {
  std::shared_ptr<DeltaEntry> entry;
  {
    std::lock_guard<std::mutex> lock(delta_mu_);
    const std::pair<int64_t, int64_t> key(base.version(), target.version());
    auto it = deltas_.find(key);
    if (it == deltas_.end()) {
      // Deltas towards older targets are never asked for again.
      std::erase_if(deltas_, [&](const auto& e) { return e.first.second < target.version(); });
      it = deltas_.emplace(key, std::make_shared<DeltaEntry>()).first;
    }
    entry = it->second;
  }
  std::call_once(entry->once, [&] {
    absl::StatusOr<EncodedDelta> encoded = encode_delta(
        base.manifest, base.payload, target.manifest, target.payload, options_.delta_zstd_level);
    if (!encoded.ok()) {
      service::log_warn(kComponent, "delta encoding failed, sending full versions",
                        {{"base", absl::StrCat(base.version())},
                         {"version", absl::StrCat(target.version())},
                         {"error", std::string(encoded.status().message())}});
      return;
    }
    metrics_->delta_encode_seconds->get().observe(encoded->encode_seconds);
    const double full = static_cast<double>(target.payload.size());
    const double wire = static_cast<double>(encoded->payload.size());
    if (target.version() == store_.latest_version()) {
      metrics_->version_wire_bytes->with({"delta"}).set(wire);
      metrics_->delta_compression_ratio->get().set(wire > 0 ? full / wire : 0.0);
    }
    service::log_info(kComponent, "delta encoded",
                      {{"base", absl::StrCat(base.version())},
                       {"version", absl::StrCat(target.version())},
                       {"full_bytes", absl::StrCat(target.payload.size())},
                       {"delta_bytes", absl::StrCat(encoded->payload.size())},
                       {"encode_seconds", absl::StrCat(encoded->encode_seconds)}});
    if (wire <= options_.delta_max_fraction * full) {
      entry->delta = std::make_shared<const EncodedDelta>(std::move(*encoded));
    }
  });
  return entry->delta;
}

int64_t WeightSyncServiceImpl::acked_version(const std::string& worker) const {
  return acked(worker).first;
}

std::pair<int64_t, int64_t> WeightSyncServiceImpl::acked(const std::string& worker) const {
  for (const WorkerState& w : workers_.snapshot()) {
    if (w.worker_id == worker) return {w.version, w.acked_unix_ms};
  }
  return {0, 0};
}

void WeightSyncServiceImpl::record_push_latency(std::optional<double> seconds) {
  if (seconds) metrics_->push_seconds->get().observe(*seconds);
}

grpc::Status WeightSyncServiceImpl::Subscribe(grpc::ServerContext* context,
                                              const v1::SubscribeRequest* request,
                                              grpc::ServerWriter<v1::SubscribeResponse>* writer) {
  MessageSink sink(writer);
  return subscribe(context, *request, sink);
}

grpc::Status WeightSyncServiceImpl::subscribe(grpc::ServerContext* context,
                                              const v1::SubscribeRequest& request_ref,
                                              PushSink& sink) {
  const v1::SubscribeRequest* request = &request_ref;
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  const std::string& worker = request->worker_id();
  if (worker.empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "worker_id: empty");
  }
  if (request->held_version() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("held_version: must be >= 0, got ", request->held_version()));
  }
  if (shutting_down_.load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "weight sync is shutting down");
  }
  if (options_.fanout.relays() && !request->relay_address().empty()) {
    // Fan-out through relays: a worker whose upstream died or stalled leaves the order (its
    // successors move up to its predecessor), and a worker placed behind another relay is told
    // where to take versions from.
    if (!request->failed_upstream().empty() && topology_.remove(request->failed_upstream())) {
      service::log_warn(kComponent, "relay dropped from the fan-out order",
                        {{"relay", request->failed_upstream()}, {"reported_by", worker}});
    }
    if (std::optional<RelayTopology::Upstream> up =
            topology_.join(worker, request->relay_address())) {
      v1::SubscribeResponse message;
      message.mutable_redirect()->set_upstream_worker_id(up->worker_id);
      message.mutable_redirect()->set_upstream_address(up->address);
      service::log_info(kComponent, "subscriber redirected to its upstream relay",
                        {{"worker", worker}, {"upstream", up->worker_id}});
      if (!sink.write(message)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "subscriber stream closed");
      }
      return grpc::Status::OK;
    }
  }
  workers_.stream_opened(worker);
  metrics_->subscribers->get().set(workers_.subscribed_workers());
  service::log_info(kComponent, "subscriber connected",
                    {{"worker", worker}, {"held_version", absl::StrCat(request->held_version())}});

  grpc::Status status = grpc::Status::OK;
  int64_t held = request->held_version();
  // The version this worker keeps the bytes of, pinned here so a delta against it stays possible
  // after the store evicts it (nullptr: send full versions).
  StoredVersionPtr base;
  if (request->accept_delta() && request->delta_base_version() > 0) {
    base = store_.get(request->delta_base_version());
  }
  // The last push, timed until this worker's ack (version 0: none pending). The first
  // kUntimedPushes pushes of a stream are not timed: a freshly started worker builds its two
  // weight slots while installing them, which would bias the first estimates.
  constexpr int kUntimedPushes = 2;
  int pushes = 0;
  struct Pending {
    int64_t version = 0;
    PushKind kind = PushKind::kFull;
    int64_t start_unix_ms = 0;
    uint64_t full_bytes = 0;
  } pending;
  PushChooser chooser;
  // Same-host shortcut: this worker runs on this host (the same local_host_id) and asked for it.
  const bool same_host_stream = !request->local_host().empty() && request->local_host() == host_id_;
  // The file last offered to this worker, held until the next push so it outlives its read.
  std::shared_ptr<const SameHostFile> offered;
  bool same_host_warned = false;
  while (!context->IsCancelled()) {
    // A stored version newer than the worker's, or one still arriving (pushed as it arrives).
    VersionStore::Newer newer = store_.wait_newer_or_arriving(held, options_.poll_interval);
    if (shutting_down_.load()) {
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "weight sync is shutting down");
      break;
    }
    if (newer.stored == nullptr && newer.arriving == nullptr) continue;
    // `next` is the version's StoredVersion either way; while it arrives only its manifest and
    // the received prefix of its payload may be read.
    StoredVersionPtr next = newer.stored != nullptr ? newer.stored : newer.arriving->stored();
    const auto [acked_number, acked_ms] = acked(worker);
    if (pending.version != 0 && acked_number == pending.version) {
      chooser.observed(pending.kind, 1e-3 * static_cast<double>(acked_ms - pending.start_unix_ms),
                       pending.full_bytes);
    }
    pending = {};
    const int64_t start_ms = unix_ms_now();
    std::shared_ptr<const EncodedDelta> delta;
    std::shared_ptr<const SameHostFile> file;
    if (same_host_stream && same_host_.load()) {
      // The file is written from the whole version: wait for an arriving one to be stored.
      if (newer.arriving != nullptr) {
        next = wait_arrived(newer.arriving, context);
        if (next == nullptr) continue;  // failed or cancelled
        newer.arriving.reset();
      }
      absl::StatusOr<std::shared_ptr<const SameHostFile>> f =
          same_host_files_.file_for(next->version(), next->payload);
      if (f.ok()) {
        file = std::move(*f);
      } else if (!same_host_warned) {
        same_host_warned = true;
        service::log_warn(kComponent, "same-host file not written; sending over the stream",
                          {{"worker", worker}, {"error", std::string(f.status().message())}});
      }
    }
    if (file == nullptr && options_.deltas && base != nullptr &&
        base->manifest.format() == next->manifest.format() && acked_number == base->version()) {
      PushChooser::Choice choice{PushKind::kDelta, false};
      if (options_.delta_choice == WeightSyncOptions::DeltaChoice::kMeasured) {
        choice = chooser.choose();
      }
      if (choice.kind == PushKind::kDelta) {
        // A delta needs the whole target: wait for an arriving version's upload to end.
        if (newer.arriving != nullptr) {
          if (wait_arrived(newer.arriving, context) == nullptr) continue;  // failed or cancelled
          newer.arriving.reset();
        }
        delta = delta_for(*base, *next);
      }
      if (choice.probe) {
        metrics_->push_probes->with({choice.kind == PushKind::kDelta ? "delta" : "full"}).inc();
      }
      // Scaled to this version's size, the cost each kind would have now.
      const double full_bytes = static_cast<double>(next->manifest.total_bytes());
      for (PushKind k : {PushKind::kFull, PushKind::kDelta}) {
        if (std::optional<double> e = chooser.seconds_per_byte(k)) {
          metrics_->push_cost_seconds->with({k == PushKind::kDelta ? "delta" : "full"})
              .set(*e * full_bytes);
        }
      }
    }
    bool upload_failed = false;
    const bool sent = file != nullptr    ? send_same_host(next, *file, sink)
                      : delta != nullptr ? send_delta(delta, context, sink)
                      : newer.arriving != nullptr
                          ? relay_version(newer.arriving, context, sink, &upload_failed)
                          : send_version(next, context, sink);
    if (upload_failed) {
      // The worker holds an incomplete version it drops at the next manifest; nothing changed
      // for this stream: wait for the next version (the trainer retries or publishes a newer one).
      service::log_warn(kComponent, "upload failed while being pushed; the worker drops it",
                        {{"worker", worker}, {"version", absl::StrCat(next->version())}});
      continue;
    }
    if (sent) {
      const std::string_view kind = file != nullptr    ? "same_host"
                                    : delta != nullptr ? "delta"
                                                       : "full";
      metrics_->pushes->with({std::string(kind)}).inc();
      metrics_->pushed_bytes->with({std::string(kind)})
          .inc(
              static_cast<double>(delta != nullptr ? delta->payload.size() : next->payload.size()));
    }
    offered = file;
    if (!sent) {
      status = shutting_down_.load()
                   ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "weight sync is shutting down")
                   : grpc::Status(grpc::StatusCode::CANCELLED, "subscriber stream closed");
      break;
    }
    // A same-host push is not timed: the chooser compares the two kinds that cross the network.
    if (++pushes > kUntimedPushes && file == nullptr) {
      pending = {next->version(), delta != nullptr ? PushKind::kDelta : PushKind::kFull, start_ms,
                 next->payload.size()};
    }
    held = next->version();
    // The next delta's base is this version once the worker acknowledged it (a worker serves
    // only what it acknowledged); otherwise the next version goes out in full.
    base = request->accept_delta() ? std::move(next) : nullptr;
  }
  record_push_latency(workers_.stream_closed(worker));
  metrics_->subscribers->get().set(workers_.subscribed_workers());
  service::log_info(kComponent, "subscriber disconnected",
                    {{"worker", worker}, {"sent_version", absl::StrCat(held)}});
  return status;
}

grpc::Status WeightSyncServiceImpl::Ack(grpc::ServerContext* context, const v1::AckRequest* request,
                                        v1::AckResponse* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  if (const int64_t latest = store_.latest_version(); request->version() > latest) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("version: ", request->version(),
                                     " was never published (latest is ", latest, ")"));
  }
  absl::StatusOr<std::optional<double>> latency =
      workers_.ack(request->worker_id(), request->version(), request->ok(), request->error(),
                   unix_ms_now(), std::chrono::steady_clock::now());
  if (!latency.ok()) return service::to_grpc_status(latency.status());
  record_push_latency(*latency);
  if (request->ok()) {
    service::Gauge gauge = metrics_->worker_version->with({request->worker_id()});
    gauge.set(std::max(gauge.value(), static_cast<double>(request->version())));
    service::log_info(
        kComponent, "version acknowledged",
        {{"worker", request->worker_id()}, {"version", absl::StrCat(request->version())}});
  } else {
    service::log_warn(kComponent, "version rejected by worker",
                      {{"worker", request->worker_id()},
                       {"version", absl::StrCat(request->version())},
                       {"error", request->error()}});
  }
  return grpc::Status::OK;
}

grpc::Status WeightSyncServiceImpl::GetStatus(grpc::ServerContext* context,
                                              const v1::GetWeightSyncStatusRequest* request,
                                              v1::WeightSyncStatus* response) {
  if (grpc::Status auth = service::authorize(auth_.get(), context); !auth.ok()) return auth;
  response->set_latest_version(store_.latest_version());
  for (int64_t v : store_.versions()) response->add_stored_versions(v);
  for (const WorkerState& w : workers_.snapshot()) {
    v1::WorkerVersion* out = response->add_workers();
    out->set_worker_id(w.worker_id);
    out->set_version(w.version);
    out->set_acked_unix_ms(w.acked_unix_ms);
    out->set_subscribed(w.open_streams > 0);
  }
  response->set_rejected_uploads(rejected_.load());
  response->set_arriving_version(store_.arriving_version());
  if (same_host_.load() && !host_id_.empty()) {
    response->set_same_host_id(host_id_);
    response->set_same_host_dir(same_host_files_.dir());
  }
  return grpc::Status::OK;
}

void WeightSyncServiceImpl::begin_shutdown() {
  if (shutting_down_.exchange(true)) return;
  store_.close();
}

}  // namespace fp8rl::weight_sync
