// CRC-32C (Castagnoli) checksums of weight payload tensors: the weight-sync manifest carries one
// per tensor (proto/fp8rl/v1/common.proto TensorManifestEntry.crc32c), so the trainer, the
// weight-sync service and generation workers must compute the same function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fp8rl::service {

// CRC-32C of `size` bytes. Chain calls by passing the previous result as `crc`:
// crc32c(b, nb, crc32c(a, na)) == crc32c(a+b). crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view bytes, uint32_t crc = 0) {
  return crc32c(bytes.data(), bytes.size(), crc);
}

}  // namespace fp8rl::service
