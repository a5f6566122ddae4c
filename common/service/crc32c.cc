// CRC-32C: the SSE4.2 crc32 instruction where the CPU has it (checked once at run time), else
// slicing-by-8 tables (reflected polynomial 0x82F63B78). Both compute the same function; the
// instruction moves about 8 bytes per 3 cycles, several times the tables' rate, which matters
// because every weight version is checksummed on the trainer, the service and every worker.
#include "common/service/crc32c.h"

#include <array>
#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace fp8rl::service {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
  return t;
}

constexpr Tables kTables = make_tables();

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const void* data, size_t size,
                                                        uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // unaligned load
    c = _mm_crc32_u64(c, word);
    p += 8;
    size -= 8;
  }
  auto c32 = static_cast<uint32_t>(c);
  while (size-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}
#endif

bool detect_hardware() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

const bool kHardware = detect_hardware();
// crc32c() uses the instruction when this is set (it starts as kHardware).
std::atomic<bool> use_hardware{kHardware};

}  // namespace

uint32_t crc32c_software(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    const uint32_t lo =
        c ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
    c = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^ kTables[5][(lo >> 16) & 0xFF] ^
        kTables[4][lo >> 24] ^ kTables[3][p[4]] ^ kTables[2][p[5]] ^ kTables[1][p[6]] ^
        kTables[0][p[7]];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFF];
  return ~c;
}

bool crc32c_hardware_available() { return kHardware; }

uint32_t crc32c_hardware(const void* data, size_t size, uint32_t crc) {
#if defined(__x86_64__)
  if (kHardware) return crc32c_sse42(data, size, crc);
#endif
  return crc32c_software(data, size, crc);
}

void crc32c_use_hardware(bool on) { use_hardware.store(on && kHardware); }

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  return use_hardware.load(std::memory_order_relaxed) ? crc32c_hardware(data, size, crc)
                                                      : crc32c_software(data, size, crc);
}

}  // namespace fp8rl::service
