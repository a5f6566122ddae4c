// Splits one fuzzer input into the parts a target needs (a manifest and its chunks, a tokenizer
// and a text to encode), so a single byte string drives a multi-message parser. Parts are
// separated by kFuzzPartSeparator; the seed generator (make_seeds.py) writes inputs this way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace fp8rl::fuzz {

// Text-friendly, so seeds of text parsers stay readable; unlikely inside real documents.
inline constexpr std::string_view kFuzzPartSeparator = "\n=====fp8rl-fuzz-part=====\n";

// Parts in order; an input without the separator is one part. At most `max_parts` parts (the
// rest of the input stays in the last one).
inline std::vector<std::string_view> split_fuzz_input(const uint8_t* data, size_t size,
                                                      size_t max_parts = 64) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t at = rest.find(kFuzzPartSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kFuzzPartSeparator.size());
  }
  parts.push_back(rest);
  return parts;
}

}  // namespace fp8rl::fuzz
