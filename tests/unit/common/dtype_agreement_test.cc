// The checkpoint readers' decoders (common/dtype.h) and the FP8 module's (kernels/formats.h) are
// two implementations of the same formats; they must agree on every code.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "common/dtype.h"
#include "kernels/formats.h"

namespace fp8rl {
namespace {

TEST(DtypeAgreement, E4M3AllCodesMatchKernels) {
  for (int code = 0; code < 256; ++code) {
    const float a = e4m3_to_f32(static_cast<uint8_t>(code));
    const float b = kernels::e4m3_to_float(static_cast<uint8_t>(code));
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << code;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(b)) << code;
    }
  }
}

TEST(DtypeAgreement, E4M3EncodeDecodeRoundTrips) {
  // Decoding a code and encoding it again with the kernels' encoder gives the code back.
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(kernels::float_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(code))), code);
  }
}

TEST(DtypeAgreement, Bf16AllCodesMatchKernels) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float a = bf16_to_f32(static_cast<uint16_t>(bits));
    const float b = kernels::bf16_to_float(static_cast<uint16_t>(bits));
    EXPECT_EQ(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(b)) << bits;
  }
}

}  // namespace
}  // namespace fp8rl
