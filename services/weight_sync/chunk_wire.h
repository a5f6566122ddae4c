// The wire bytes of a chunk message, read and written without a protobuf message in between, so
// a chunk's data moves between gRPC's slices and a payload buffer with one copy (receive) or none
// (send). SubscribeResponse.chunk and UploadVersionRequest.chunk are both field 2 of their
// message, so one layout serves both: tag 0x12, length, then WeightChunk's version (1), offset (2)
// and data (3) in field order (proto/fp8rl/v1/weight_sync.proto).
#pragma once

#include <google/protobuf/io/coded_stream.h>

#include <cstddef>
#include <cstdint>

namespace fp8rl::weight_sync {

// Wire tags (field number << 3 | wire type).
inline constexpr uint32_t kMessageChunkTag = (2 << 3) | 2;  // <message>.chunk, length-delimited
inline constexpr uint32_t kChunkVersionTag = (1 << 3) | 0;  // WeightChunk.version, varint
inline constexpr uint32_t kChunkOffsetTag = (2 << 3) | 0;   // WeightChunk.offset, varint
inline constexpr uint32_t kChunkDataTag = (3 << 3) | 2;     // WeightChunk.data, length-delimited

// A chunk message's fields up to its data.
struct ChunkHeader {
  int64_t version = 0;
  uint64_t offset = 0;
  uint32_t size = 0;
};

// Reads a chunk message from `in` up to its data field, which `in` is left at. False when the
// message is anything else (another field, an unexpected order, a malformed varint, data that is
// not the chunk's last field): the caller then parses it as a message.
bool read_chunk_header(google::protobuf::io::CodedInputStream* in, ChunkHeader* h);

// Writes the bytes of a chunk message that precede its data (at most kMaxChunkHeaderBytes) to
// `out`; returns how many.
inline constexpr size_t kMaxChunkHeaderBytes = 48;
size_t write_chunk_header(const ChunkHeader& h, uint8_t* out);

}  // namespace fp8rl::weight_sync
