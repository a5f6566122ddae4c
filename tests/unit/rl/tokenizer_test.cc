// Tests of rl/tokenizer.h: byte round trips, special tokens, unknown ids.
#include "rl/tokenizer.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace fp8rl::rl {
namespace {

TEST(ByteTokenizer, RoundTripsRandomBytesAndUtf8) {
  const ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 259);
  std::mt19937 rng(9);
  std::string bytes;
  for (int i = 0; i < 1000; ++i) bytes.push_back(static_cast<char>(rng() % 256));
  bytes += std::string("\0\xff", 2);
  const std::vector<int32_t> ids = tok.encode(bytes);
  ASSERT_EQ(ids.size(), bytes.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(ids[i], static_cast<unsigned char>(bytes[i]));
  }
  EXPECT_EQ(tok.decode(ids), bytes);
  const std::string text = "12+34=46 \xc3\xa9\xe2\x82\xac";  // é €
  EXPECT_EQ(tok.decode(tok.encode(text, true, true)), text);
}

TEST(ByteTokenizer, SpecialTokens) {
  const ByteTokenizer tok;
  const std::vector<int32_t> ids = tok.encode("7+8=", /*add_bos=*/true, /*add_eos=*/true);
  EXPECT_EQ(ids, (std::vector<int32_t>{kBosId, '7', '+', '8', '=', kEosId}));
  EXPECT_TRUE(ByteTokenizer::is_special(kBosId));
  EXPECT_TRUE(ByteTokenizer::is_special(kPadId));
  EXPECT_FALSE(ByteTokenizer::is_special('a'));
  // Decoding drops BOS/PAD and stops at the first EOS.
  const std::vector<int32_t> completion = {kPadId, '1', '5', kEosId, '9', '9'};
  EXPECT_EQ(tok.decode(completion), "15");
}

TEST(ByteTokenizer, UnknownIdsDecodeToReplacementAndFailValidation) {
  const ByteTokenizer tok;
  const std::vector<int32_t> ids = {'4', 300, '2', -1};
  EXPECT_EQ(tok.decode(ids),
            "4\xEF\xBF\xBD"
            "2\xEF\xBF\xBD");
  EXPECT_EQ(tok.validate(ids).message(), "token 1: id 300 is outside the vocabulary [0, 259)");
  EXPECT_TRUE(tok.validate(tok.encode("ok", true, true)).ok());
}

}  // namespace
}  // namespace fp8rl::rl
