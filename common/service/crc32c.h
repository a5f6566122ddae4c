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

// The two implementations crc32c() picks from, for tests and benchmarks: the portable
// slicing-by-8 tables, and the SSE4.2 crc32 instruction (crc32c_hardware falls back to the tables
// when crc32c_hardware_available() is false, so it is always safe to call).
uint32_t crc32c_software(const void* data, size_t size, uint32_t crc = 0);
uint32_t crc32c_hardware(const void* data, size_t size, uint32_t crc = 0);
bool crc32c_hardware_available();
// crc32c() uses the instruction when available and `on` (the default), else the tables; for
// benchmarks that compare the two in one run.
void crc32c_use_hardware(bool on);

}  // namespace fp8rl::service
