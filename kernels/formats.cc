// E4M3 decoding of the FP8 recipe: the 256-entry table built at compile time from the bit
// fields. (The encoders are inline in formats.h: they are the inner loop of quantization.)
#include "kernels/formats.h"

#include <array>
#include <bit>

namespace fp8rl::kernels {
namespace {

// E4M3 bits -> IEEE fp32 bits, from the fields: S.EEEE.MMM, bias 7, subnormal value M * 2^-9.
constexpr uint32_t e4m3_to_f32_bits(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t exp = (code >> 3) & 0xF;
  uint32_t man = code & 0x7;
  if (exp == 0xF && man == 0x7) return sign | 0x7FC00000u;  // NaN
  if (exp == 0) {
    if (man == 0) return sign;  // +-0
    // Subnormal M * 2^-9: shift M up until its leading 1 is bit 3 (the implicit bit), then
    // M * 2^-9 = ((M << shift) / 8) * 2^(3 - 9 - shift).
    int shift = 0;
    while ((man & 0x8) == 0) {
      man <<= 1;
      ++shift;
    }
    const int e = 3 - 9 - shift;
    return sign | (static_cast<uint32_t>(e + 127) << 23) | ((man & 0x7) << 20);
  }
  return sign | ((exp - 7 + 127) << 23) | (man << 20);
}

constexpr std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> table{};
  for (int c = 0; c < 256; ++c) {
    table[c] = std::bit_cast<float>(e4m3_to_f32_bits(static_cast<uint8_t>(c)));
  }
  return table;
}

constexpr std::array<float, 256> kE4M3Table = make_e4m3_table();

}  // namespace

float e4m3_to_float(uint8_t code) { return kE4M3Table[code]; }

const float* e4m3_decode_table() { return kE4M3Table.data(); }

}  // namespace fp8rl::kernels
