// Byte-level tokenizer: ids 0..255 are bytes, 256..258 are BOS/EOS/PAD (see tokenizer.h).
#include "rl/tokenizer.h"

#include "absl/strings/str_cat.h"

namespace fp8rl::rl {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, bool add_bos,
                                           bool add_eos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 2);
  if (add_bos) ids.push_back(kBosId);
  for (char c : text) ids.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
  if (add_eos) ids.push_back(kEosId);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id == kEosId) break;
    if (id == kBosId || id == kPadId) continue;
    if (id >= 0 && id < kNumByteTokens) {
      text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else {
      text.append(kUnknownTokenText);
    }
  }
  return text;
}

absl::Status ByteTokenizer::validate(std::span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= kTokenizerVocabSize) {
      return absl::InvalidArgumentError(absl::StrCat("token ", i, ": id ", ids[i],
                                                     " is outside the vocabulary [0, ",
                                                     kTokenizerVocabSize, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace fp8rl::rl
