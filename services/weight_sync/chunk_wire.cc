// Chunk messages on the wire without a message object (see chunk_wire.h).
#include "services/weight_sync/chunk_wire.h"

#include <cstring>

namespace fp8rl::weight_sync {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

bool read_chunk_header(CodedInputStream* in, ChunkHeader* h) {
  if (in->ReadTag() != kMessageChunkTag) return false;
  uint32_t length = 0;
  if (!in->ReadVarint32(&length)) return false;
  in->PushLimit(static_cast<int>(length));
  uint32_t tag = in->ReadTag();
  uint64_t value = 0;
  if (tag == kChunkVersionTag) {
    if (!in->ReadVarint64(&value)) return false;
    h->version = static_cast<int64_t>(value);
    tag = in->ReadTag();
  }
  if (tag == kChunkOffsetTag) {
    if (!in->ReadVarint64(&h->offset)) return false;
    tag = in->ReadTag();
  }
  if (tag != kChunkDataTag || !in->ReadVarint32(&h->size)) return false;
  // The data must be the chunk's last field and fill it exactly.
  return in->BytesUntilLimit() == static_cast<int>(h->size);
}

size_t write_chunk_header(const ChunkHeader& h, uint8_t* out) {
  // WeightChunk's fields up to the data's bytes, then the message's chunk tag and the length of
  // the whole WeightChunk in front of them.
  uint8_t fields[36];
  uint8_t* f = fields;
  f = CodedOutputStream::WriteTagToArray(kChunkVersionTag, f);
  f = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(h.version), f);
  f = CodedOutputStream::WriteTagToArray(kChunkOffsetTag, f);
  f = CodedOutputStream::WriteVarint64ToArray(h.offset, f);
  f = CodedOutputStream::WriteTagToArray(kChunkDataTag, f);
  f = CodedOutputStream::WriteVarint32ToArray(h.size, f);
  const size_t fields_size = static_cast<size_t>(f - fields);
  uint8_t* o = out;
  o = CodedOutputStream::WriteTagToArray(kMessageChunkTag, o);
  o = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(fields_size + h.size), o);
  std::memcpy(o, fields, fields_size);
  return static_cast<size_t>(o - out) + fields_size;
}

}  // namespace fp8rl::weight_sync
