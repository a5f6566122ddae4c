// HfTokenizer: loading tokenizer.json, added-token matching, PCRE2 pre-tokenization, ranked BPE
// merges with a word cache, and the ByteLevel decoder. The contract is in rl/hf_tokenizer.h.
#include "rl/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fs.h"

namespace fp8rl::rl {
namespace {

using Json = nlohmann::json;

// Debian's abseil has its own string_view type: convert at the boundary.
absl::string_view av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// ---- UTF-8 helpers -------------------------------------------------------------------------

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Length of the valid UTF-8 sequence at s[i], or 0 with *bad_len = the length of the maximal
// invalid subpart (at least 1) when it is not valid.
size_t utf8_sequence(std::string_view s, size_t i, size_t* bad_len, uint32_t* cp_out) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  *bad_len = 1;
  if (c < 0x80) {
    *cp_out = c;
    return 1;
  }
  size_t need = 0;
  uint32_t cp = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1, cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2, cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3, cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    const uint8_t t = b(i + k);
    if (k == 1 ? (t < lo || t > hi) : (t < 0x80 || t > 0xBF)) return 0;
    cp = (cp << 6) | (t & 0x3F);
    *bad_len = k + 1;
  }
  *cp_out = cp;
  return need + 1;
}

// Byte offset of the first invalid UTF-8 sequence, or npos.
size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t bad = 0;
    uint32_t cp = 0;
    const size_t n = utf8_sequence(s, i, &bad, &cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

bool is_unicode_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// The code point that ends at s[end) (end > 0, s valid UTF-8).
uint32_t last_code_point(std::string_view s, size_t end, size_t* start) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  size_t bad = 0;
  uint32_t cp = 0;
  utf8_sequence(s, i, &bad, &cp);
  *start = i;
  return cp;
}

bool is_word_char(uint32_t cp) {
  // single_word: ASCII alphanumerics and '_' plus every non-ASCII non-whitespace character
  // count as word characters (only used when a token sets single_word).
  if (cp < 0x80) return std::isalnum(static_cast<int>(cp)) || cp == '_';
  return !is_unicode_whitespace(cp);
}

// ---- GPT-2 byte-level alphabet ---------------------------------------------------------------

// bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100.. in byte order.
struct ByteLevelAlphabet {
  std::array<uint32_t, 256> byte_to_cp{};
  absl::flat_hash_map<uint32_t, uint8_t> cp_to_byte;
  ByteLevelAlphabet() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
  // The raw bytes a byte-level string stands for; nullopt if a character is outside the alphabet
  // or the string is not valid UTF-8.
  std::optional<std::string> to_bytes(std::string_view s) const {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
      size_t bad = 0;
      uint32_t cp = 0;
      const size_t n = utf8_sequence(s, i, &bad, &cp);
      if (n == 0) return std::nullopt;
      auto it = cp_to_byte.find(cp);
      if (it == cp_to_byte.end()) return std::nullopt;
      out.push_back(static_cast<char>(it->second));
      i += n;
    }
    return out;
  }
  std::string from_bytes(std::string_view bytes) const {
    std::string out;
    for (unsigned char c : bytes) append_utf8(&out, byte_to_cp[c]);
    return out;
  }
};

const ByteLevelAlphabet& alphabet() {
  static const ByteLevelAlphabet* a = new ByteLevelAlphabet();
  return *a;
}

// ---- JSON access with paths --------------------------------------------------------------------

struct JsonCtx {
  std::string source;  // file name for errors
  absl::Status error(const std::string& path, const std::string& message) const {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", path, ": ", message));
  }
  absl::Status unsupported(const std::string& path, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", path, ": ", what,
                     " is not supported by fp8rl's tokenizer (byte-level BPE only)"));
  }
};

absl::StatusOr<bool> get_bool(const JsonCtx& ctx, const Json& obj, const std::string& path,
                              const char* key, bool default_value) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return default_value;
  if (!it->is_boolean()) {
    return ctx.error(absl::StrCat(path, ".", key),
                     absl::StrCat("expected a boolean, got ", it->type_name()));
  }
  return it->get<bool>();
}

absl::StatusOr<std::string> get_type(const JsonCtx& ctx, const Json& obj, const std::string& path) {
  if (!obj.is_object()) {
    return ctx.error(path, absl::StrCat("expected an object, got ", obj.type_name()));
  }
  auto it = obj.find("type");
  if (it == obj.end() || !it->is_string()) {
    return ctx.error(absl::StrCat(path, ".type"), "missing or not a string");
  }
  return it->get<std::string>();
}

// ---- Pipeline pieces ---------------------------------------------------------------------------

struct Pcre2Deleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};

enum class SplitBehavior { kIsolated, kRemoved };

// One pre-tokenizer step that cuts pieces into smaller pieces.
struct SplitStep {
  std::unique_ptr<pcre2_code, Pcre2Deleter> code;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool add_prefix_space = false;  // ByteLevel's: prepend ' ' to a piece not starting with one
};

enum class NormalizerKind { kNfc };

struct TemplatePiece {
  bool is_sequence = false;  // "Sequence A"; otherwise the special token's ids
  std::vector<int32_t> ids;
};

absl::StatusOr<std::unique_ptr<pcre2_code, Pcre2Deleter>> compile_regex(
    const JsonCtx& ctx, const std::string& path, const std::string& pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return ctx.error(path, absl::StrFormat("regex does not compile at offset %d: %s",
                                           static_cast<int>(error_offset),
                                           reinterpret_cast<const char*>(message)));
  }
  // JIT is an optimisation: without it (unsupported CPU) pcre2_match interprets the pattern.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<pcre2_code, Pcre2Deleter>(code);
}

std::string escape_regex_literal(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::strchr("\\^$.|?*+()[]{}", c) != nullptr && c != '\0') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

// ---- Impl --------------------------------------------------------------------------------------

struct HfTokenizer::Impl {
  std::string source;

  // Model: vocabulary keyed by raw bytes (the byte-level strings decoded), merges keyed by the
  // pair of ids ((left << 32) | right) -> (rank, merged id).
  absl::flat_hash_map<std::string, int32_t> vocab_bytes;
  absl::flat_hash_map<std::string, int32_t> token_ids;  // tokenizer.json strings (all tokens)
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  std::array<int32_t, 256> byte_ids{};           // id of each single byte, -1 if missing
  std::array<int32_t, 256> byte_fallback_ids{};  // id of <0xXX>, -1 if missing
  bool ignore_merges = false;
  bool byte_fallback = false;
  std::optional<int32_t> unk_id;

  std::vector<NormalizerKind> normalizers;
  std::vector<SplitStep> splits;

  std::vector<HfAddedToken> added;
  // Indexes into `added` bucketed by the first byte of the content, longest content first:
  // raw_added for normalized == false, normalized_added for normalized == true (matched on the
  // normalized text with normalized content).
  using AddedBuckets = std::array<std::vector<int32_t>, 256>;
  AddedBuckets raw_added;
  AddedBuckets normalized_added;
  std::vector<std::string> normalized_content;  // parallel to `added`

  std::vector<TemplatePiece> single_template;  // empty: no post-processing ids

  std::vector<std::string> id_bytes;  // decoded bytes per id
  std::vector<uint8_t> id_known;
  std::vector<uint8_t> id_special;

  std::optional<int32_t> bos, pad, eos;
  std::vector<int32_t> eos_all;

  // Word cache: piece bytes -> ids. Guarded by cache_mu.
  mutable std::mutex cache_mu;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache;
  static constexpr size_t kMaxCacheEntries = 1 << 20;

  absl::Status normalize(std::string_view in, std::string* out) const;
  void split_added(std::string_view text, const AddedBuckets& buckets, bool normalized,
                   std::vector<std::pair<std::string_view, int32_t>>* out) const;
  absl::Status encode_plain(std::string_view text, std::vector<int32_t>* ids) const;
  absl::Status encode_word(std::string_view piece, std::vector<int32_t>* ids) const;
  absl::Status bpe(std::string_view piece, std::vector<int32_t>* ids) const;
};

absl::Status HfTokenizer::Impl::normalize(std::string_view in, std::string* out) const {
  out->assign(in);
  for (NormalizerKind kind : normalizers) {
    if (kind == NormalizerKind::kNfc) {
      bool ascii = true;
      for (char c : *out) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
      if (ascii) continue;  // ASCII is always NFC
      UErrorCode status = U_ZERO_ERROR;
      const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
      std::string result;
      icu::StringByteSink<std::string> sink(&result);
      if (U_SUCCESS(status)) {
        nfc->normalizeUTF8(0, icu::StringPiece(out->data(), static_cast<int32_t>(out->size())),
                           sink, nullptr, status);
      }
      if (U_FAILURE(status)) {
        return absl::InternalError(absl::StrCat("NFC normalization failed: ", u_errorName(status)));
      }
      *out = std::move(result);
    }
  }
  return absl::OkStatus();
}

// Cuts `text` at the leftmost-longest occurrences of the candidate added tokens: out gets
// (piece, -1) for text to encode and (content, index into added) for a token.
void HfTokenizer::Impl::split_added(std::string_view text, const AddedBuckets& buckets,
                                    bool normalized,
                                    std::vector<std::pair<std::string_view, int32_t>>* out) const {
  size_t piece_start = 0;
  size_t i = 0;
  while (i < text.size()) {
    // Candidates are sorted longest first, so the first match at i is the longest.
    int32_t match = -1;
    size_t match_len = 0;
    for (int32_t k : buckets[static_cast<uint8_t>(text[i])]) {
      const std::string& content = normalized ? normalized_content[k] : added[k].content;
      if (content.empty() || content.size() > text.size() - i) continue;
      if (text[i] != content[0] || text.compare(i, content.size(), content) != 0) continue;
      if (added[k].single_word) {
        size_t start = 0, bad = 0;
        uint32_t cp = 0;
        if (i > 0 && is_word_char(last_code_point(text, i, &start))) continue;
        const size_t end = i + content.size();
        if (end < text.size() && utf8_sequence(text, end, &bad, &cp) > 0 && is_word_char(cp)) {
          continue;
        }
      }
      match = k;
      match_len = content.size();
      break;
    }
    if (match < 0) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + match_len;
    if (added[match].lstrip) {
      while (begin > piece_start) {
        size_t start = 0;
        if (!is_unicode_whitespace(last_code_point(text, begin, &start))) break;
        begin = start;
      }
    }
    if (added[match].rstrip) {
      while (end < text.size()) {
        size_t bad = 0;
        uint32_t cp = 0;
        const size_t n = utf8_sequence(text, end, &bad, &cp);
        if (n == 0 || !is_unicode_whitespace(cp)) break;
        end += n;
      }
    }
    if (begin > piece_start) out->emplace_back(text.substr(piece_start, begin - piece_start), -1);
    out->emplace_back(text.substr(begin, end - begin), match);
    piece_start = end;
    i = end;
  }
  if (piece_start < text.size()) out->emplace_back(text.substr(piece_start), -1);
}

absl::Status HfTokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>* ids) const {
  // Symbols form a linked list over the piece; a min-heap of candidate pairs ordered by (rank,
  // position) applies merges lowest rank first, leftmost first, as the reference does.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    const uint8_t b = static_cast<uint8_t>(piece[i]);
    int32_t id = byte_ids[b];
    if (id < 0) {
      if (byte_fallback && byte_fallback_ids[b] >= 0) {
        id = byte_fallback_ids[b];
      } else if (unk_id) {
        id = *unk_id;
      } else {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: byte 0x%02X has no token (no byte_fallback <0x%02X> and no unk_token)", source, b,
            b));
      }
    }
    symbols.push_back({id, static_cast<int32_t>(i) - 1, static_cast<int32_t>(i) + 1});
  }
  symbols.back().next = -1;
  using Candidate = std::tuple<int32_t, int32_t, int32_t, int32_t>;  // rank, pos, left, right
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(symbols[pos].id)) << 32) |
                         static_cast<uint32_t>(symbols[next].id);
    auto it = merges.find(key);
    if (it != merges.end()) heap.emplace(it->second.first, pos, symbols[pos].id, symbols[next].id);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push(i);
  while (!heap.empty()) {
    const auto [rank, pos, left, right] = heap.top();
    heap.pop();
    Symbol& s = symbols[pos];
    if (s.id != left || s.next < 0 || symbols[s.next].id != right) continue;  // stale
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    s.id = merges.find(key)->second.second;
    const int32_t removed = s.next;
    s.next = symbols[removed].next;
    if (s.next >= 0) symbols[s.next].prev = pos;
    symbols[removed].id = -1;  // dead
    push(s.prev);
    push(pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
  return absl::OkStatus();
}

absl::Status HfTokenizer::Impl::encode_word(std::string_view piece,
                                            std::vector<int32_t>* ids) const {
  if (piece.empty()) return absl::OkStatus();
  if (ignore_merges) {
    auto it = vocab_bytes.find(av(piece));
    if (it != vocab_bytes.end()) {
      ids->push_back(it->second);
      return absl::OkStatus();
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(av(piece));
    if (it != cache.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> word;
  if (absl::Status s = bpe(piece, &word); !s.ok()) return s;
  ids->insert(ids->end(), word.begin(), word.end());
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() >= kMaxCacheEntries) cache.clear();
  cache.emplace(std::string(piece), std::move(word));
  return absl::OkStatus();
}

// Normalized text without added tokens -> pre-tokenizer pieces -> BPE ids.
absl::Status HfTokenizer::Impl::encode_plain(std::string_view text,
                                             std::vector<int32_t>* ids) const {
  std::deque<std::string> owned;  // pieces that got a prefix space (deque: views stay valid)
  std::vector<std::string_view> pieces = {text};
  std::vector<std::string_view> next;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(nullptr,
                                                                         &pcre2_match_data_free);
  for (const SplitStep& step : splits) {
    next.clear();
    if (step.add_prefix_space) {
      for (std::string_view& p : pieces) {
        if (!p.empty() && p[0] != ' ') {
          owned.push_back(absl::StrCat(" ", av(p)));
          p = owned.back();
        }
      }
    }
    if (!step.code) continue;
    if (md == nullptr) md.reset(pcre2_match_data_create(1, nullptr));
    for (std::string_view p : pieces) {
      size_t start = 0;    // search position
      size_t emitted = 0;  // end of the last emitted piece
      while (start <= p.size()) {
        const int rc = pcre2_match(step.code.get(), reinterpret_cast<PCRE2_SPTR>(p.data()),
                                   p.size(), start, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          return absl::InternalError(absl::StrCat(source, ": regex match failed (code ", rc, ")"));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const size_t m_begin = ov[0], m_end = ov[1];
        if (m_end == m_begin) {  // empty match: step one character forward
          if (m_end >= p.size()) break;
          size_t bad = 0;
          uint32_t cp = 0;
          start = m_end + std::max<size_t>(1, utf8_sequence(p, m_end, &bad, &cp));
          continue;
        }
        if (m_begin > emitted) next.push_back(p.substr(emitted, m_begin - emitted));
        if (step.behavior == SplitBehavior::kIsolated) {
          next.push_back(p.substr(m_begin, m_end - m_begin));
        }
        emitted = start = m_end;
      }
      if (emitted < p.size()) next.push_back(p.substr(emitted));
    }
    pieces.swap(next);
  }
  for (std::string_view p : pieces) {
    if (absl::Status s = encode_word(p, ids); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// ---- Loading -----------------------------------------------------------------------------------

namespace {

absl::Status load_normalizer(const JsonCtx& ctx, const Json& n, const std::string& path,
                             std::vector<NormalizerKind>* out) {
  if (n.is_null()) return absl::OkStatus();
  absl::StatusOr<std::string> type = get_type(ctx, n, path);
  if (!type.ok()) return type.status();
  if (*type == "NFC") {
    out->push_back(NormalizerKind::kNfc);
    return absl::OkStatus();
  }
  if (*type == "Sequence") {
    auto it = n.find("normalizers");
    if (it == n.end() || !it->is_array()) {
      return ctx.error(path + ".normalizers", "missing or not an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      if (absl::Status s =
              load_normalizer(ctx, (*it)[i], absl::StrCat(path, ".normalizers[", i, "]"), out);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  return ctx.unsupported(path + ".type", absl::StrCat("normalizer '", *type, "'"));
}

// Adds the steps of one pre-tokenizer; *byte_level is set when a ByteLevel step is seen.
absl::Status load_pre_tokenizer(const JsonCtx& ctx, const Json& p, const std::string& path,
                                std::vector<SplitStep>* out, bool* byte_level) {
  if (p.is_null()) return absl::OkStatus();
  absl::StatusOr<std::string> type = get_type(ctx, p, path);
  if (!type.ok()) return type.status();
  if (*byte_level) {
    return ctx.unsupported(path, "a pre-tokenizer after ByteLevel");
  }
  if (*type == "Sequence") {
    auto it = p.find("pretokenizers");
    if (it == p.end() || !it->is_array()) {
      return ctx.error(path + ".pretokenizers", "missing or not an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      if (absl::Status s = load_pre_tokenizer(
              ctx, (*it)[i], absl::StrCat(path, ".pretokenizers[", i, "]"), out, byte_level);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  if (*type == "Split") {
    SplitStep step;
    auto pattern = p.find("pattern");
    std::string regex;
    if (pattern != p.end() && pattern->is_object() && pattern->contains("Regex") &&
        (*pattern)["Regex"].is_string()) {
      regex = (*pattern)["Regex"].get<std::string>();
    } else if (pattern != p.end() && pattern->is_object() && pattern->contains("String") &&
               (*pattern)["String"].is_string()) {
      regex = escape_regex_literal((*pattern)["String"].get<std::string>());
    } else {
      return ctx.error(path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    absl::StatusOr<bool> invert = get_bool(ctx, p, path, "invert", false);
    if (!invert.ok()) return invert.status();
    if (*invert) return ctx.unsupported(path + ".invert", "invert: true");
    const std::string behavior = p.value("behavior", std::string("Isolated"));
    if (behavior == "Isolated") {
      step.behavior = SplitBehavior::kIsolated;
    } else if (behavior == "Removed") {
      step.behavior = SplitBehavior::kRemoved;
    } else {
      return ctx.unsupported(path + ".behavior", absl::StrCat("behavior '", behavior, "'"));
    }
    absl::StatusOr<std::unique_ptr<pcre2_code, Pcre2Deleter>> code =
        compile_regex(ctx, path + ".pattern", regex);
    if (!code.ok()) return code.status();
    step.code = std::move(*code);
    out->push_back(std::move(step));
    return absl::OkStatus();
  }
  if (*type == "Digits") {
    absl::StatusOr<bool> individual = get_bool(ctx, p, path, "individual_digits", false);
    if (!individual.ok()) return individual.status();
    absl::StatusOr<std::unique_ptr<pcre2_code, Pcre2Deleter>> code =
        compile_regex(ctx, path, *individual ? "\\p{N}" : "\\p{N}+");
    if (!code.ok()) return code.status();
    SplitStep step;
    step.code = std::move(*code);
    out->push_back(std::move(step));
    return absl::OkStatus();
  }
  if (*type == "ByteLevel") {
    absl::StatusOr<bool> prefix = get_bool(ctx, p, path, "add_prefix_space", true);
    if (!prefix.ok()) return prefix.status();
    absl::StatusOr<bool> use_regex = get_bool(ctx, p, path, "use_regex", true);
    if (!use_regex.ok()) return use_regex.status();
    SplitStep step;
    step.add_prefix_space = *prefix;
    if (*use_regex) {
      absl::StatusOr<std::unique_ptr<pcre2_code, Pcre2Deleter>> code =
          compile_regex(ctx, path, kGpt2Pattern);
      if (!code.ok()) return code.status();
      step.code = std::move(*code);
    }
    out->push_back(std::move(step));
    *byte_level = true;
    return absl::OkStatus();
  }
  return ctx.unsupported(path + ".type", absl::StrCat("pre-tokenizer '", *type, "'"));
}

absl::Status check_decoder(const JsonCtx& ctx, const Json& d, const std::string& path) {
  if (d.is_null()) return ctx.unsupported(path, "a null decoder (ByteLevel is required)");
  absl::StatusOr<std::string> type = get_type(ctx, d, path);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return absl::OkStatus();
  return ctx.unsupported(path + ".type", absl::StrCat("decoder '", *type, "'"));
}

absl::Status load_post_processor(const JsonCtx& ctx, const Json& p, const std::string& path,
                                 std::vector<TemplatePiece>* single) {
  if (p.is_null()) return absl::OkStatus();
  absl::StatusOr<std::string> type = get_type(ctx, p, path);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return absl::OkStatus();  // only adjusts offsets
  if (*type == "Sequence") {
    auto it = p.find("processors");
    if (it == p.end() || !it->is_array()) {
      return ctx.error(path + ".processors", "missing or not an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      if (absl::Status s = load_post_processor(ctx, (*it)[i],
                                               absl::StrCat(path, ".processors[", i, "]"), single);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  if (*type == "TemplateProcessing") {
    if (!single->empty()) return ctx.unsupported(path, "a second TemplateProcessing");
    auto tmpl = p.find("single");
    auto specials = p.find("special_tokens");
    if (tmpl == p.end() || !tmpl->is_array()) {
      return ctx.error(path + ".single", "missing or not an array");
    }
    if (specials == p.end() || !specials->is_object()) {
      return ctx.error(path + ".special_tokens", "missing or not an object");
    }
    for (size_t i = 0; i < tmpl->size(); ++i) {
      const Json& item = (*tmpl)[i];
      const std::string ipath = absl::StrCat(path, ".single[", i, "]");
      TemplatePiece piece;
      if (item.contains("Sequence")) {
        if (item["Sequence"].value("id", std::string()) != "A") {
          return ctx.unsupported(ipath, "a Sequence other than A in the single template");
        }
        piece.is_sequence = true;
      } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
        const std::string name = item["SpecialToken"]["id"].get<std::string>();
        auto sp = specials->find(name);
        if (sp == specials->end() || !sp->contains("ids") || !(*sp)["ids"].is_array()) {
          return ctx.error(ipath, absl::StrCat("special token '", name,
                                               "' is not in special_tokens with an ids list"));
        }
        for (const Json& id : (*sp)["ids"]) piece.ids.push_back(id.get<int32_t>());
      } else {
        return ctx.error(ipath, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
      single->push_back(std::move(piece));
    }
    return absl::OkStatus();
  }
  return ctx.unsupported(path + ".type", absl::StrCat("post-processor '", *type, "'"));
}

// A token named in tokenizer_config.json: a string, {"content": ...} or null.
std::optional<std::string> config_token(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

absl::StatusOr<Json> read_json_file(const std::string& path) {
  absl::StatusOr<std::string> text = read_text_file(path);
  if (!text.ok()) return text.status();
  try {
    return Json::parse(*text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON: ", e.what()));
  }
}

}  // namespace

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<HfTokenizer> HfTokenizer::from_json_text(const std::string& text,
                                                        const std::string& source) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": malformed JSON: ", e.what()));
  }
  const JsonCtx ctx{source};
  if (!root.is_object()) return ctx.error("$", "expected an object");
  auto impl = std::make_unique<Impl>();
  impl->source = source;

  for (const char* key : {"truncation", "padding"}) {
    if (root.contains(key) && !root[key].is_null()) {
      return ctx.unsupported(key, absl::StrCat("a non-null '", key, "'"));
    }
  }

  // Model.
  if (!root.contains("model")) return ctx.error("model", "missing");
  const Json& model = root["model"];
  absl::StatusOr<std::string> model_type =
      model.contains("type") ? get_type(ctx, model, "model") : std::string("BPE");
  if (!model_type.ok()) return model_type.status();
  if (*model_type != "BPE") {
    return ctx.unsupported("model.type", absl::StrCat("model '", *model_type, "'"));
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    return ctx.unsupported("model.dropout", "BPE dropout");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() &&
        !(model[key].is_string() && model[key].get<std::string>().empty())) {
      return ctx.unsupported(absl::StrCat("model.", key), absl::StrCat("a non-empty ", key));
    }
  }
  for (const auto& [key, field] :
       {std::pair<const char*, bool*>{"ignore_merges", &impl->ignore_merges},
        {"byte_fallback", &impl->byte_fallback}}) {
    absl::StatusOr<bool> v = get_bool(ctx, model, "model", key, false);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return ctx.error("model.vocab", "missing or not an object");
  }
  const auto& abc = alphabet();
  int32_t max_id = -1;
  impl->byte_ids.fill(-1);
  impl->byte_fallback_ids.fill(-1);
  impl->token_ids.reserve(model["vocab"].size());
  std::vector<std::pair<int32_t, std::string>> id_tokens;
  id_tokens.reserve(model["vocab"].size());
  for (const auto& [token, id_json] : model["vocab"].items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() > INT32_MAX) {
      return ctx.error(absl::StrCat("model.vocab[\"", token, "\"]"),
                       "expected a non-negative integer id");
    }
    const int32_t id = id_json.get<int32_t>();
    max_id = std::max(max_id, id);
    impl->token_ids[token] = id;
    id_tokens.emplace_back(id, token);
    if (std::optional<std::string> bytes = abc.to_bytes(token)) {
      if (bytes->size() == 1) impl->byte_ids[static_cast<uint8_t>((*bytes)[0])] = id;
      impl->vocab_bytes[*bytes] = id;
    }
    if (token.size() == 6 && token.starts_with("<0x") && token[5] == '>') {
      const int value = std::stoi(token.substr(3, 2), nullptr, 16);
      impl->byte_fallback_ids[value] = id;
    }
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const std::string unk = model["unk_token"].get<std::string>();
    auto it = impl->token_ids.find(unk);
    if (it == impl->token_ids.end()) {
      return ctx.error("model.unk_token", absl::StrCat("'", unk, "' is not in the vocabulary"));
    }
    impl->unk_id = it->second;
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return ctx.error("model.merges", "missing or not an array");
  }
  const Json& merges = model["merges"];
  impl->merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& m = merges[rank];
    std::string a, b;
    if (m.is_string()) {  // "a b"
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return ctx.error(absl::StrCat("model.merges[", rank, "]"),
                         absl::StrCat("expected \"left right\", got '", s, "'"));
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return ctx.error(absl::StrCat("model.merges[", rank, "]"),
                       "expected a string \"left right\" or an array [left, right]");
    }
    auto ia = impl->token_ids.find(a);
    auto ib = impl->token_ids.find(b);
    auto im = impl->token_ids.find(a + b);
    if (ia == impl->token_ids.end() || ib == impl->token_ids.end() || im == impl->token_ids.end()) {
      return ctx.error(
          absl::StrCat("model.merges[", rank, "]"),
          absl::StrCat("merge '", a, "' + '", b, "' uses a token not in the vocabulary"));
    }
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                         static_cast<uint32_t>(ib->second);
    // The first (lowest-rank) occurrence of a pair wins, as in the reference.
    impl->merges.try_emplace(key, static_cast<int32_t>(rank), im->second);
  }

  // Normalizer, pre-tokenizer, decoder, post-processor.
  if (absl::Status s =
          load_normalizer(ctx, root.value("normalizer", Json()), "normalizer", &impl->normalizers);
      !s.ok()) {
    return s;
  }
  bool byte_level = false;
  if (absl::Status s = load_pre_tokenizer(ctx, root.value("pre_tokenizer", Json()), "pre_tokenizer",
                                          &impl->splits, &byte_level);
      !s.ok()) {
    return s;
  }
  if (!byte_level) {
    return ctx.unsupported("pre_tokenizer", "a pre-tokenizer without a ByteLevel step");
  }
  if (absl::Status s = check_decoder(ctx, root.value("decoder", Json()), "decoder"); !s.ok()) {
    return s;
  }
  if (absl::Status s = load_post_processor(ctx, root.value("post_processor", Json()),
                                           "post_processor", &impl->single_template);
      !s.ok()) {
    return s;
  }

  // Added tokens.
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const Json& list = root["added_tokens"];
    if (!list.is_array()) return ctx.error("added_tokens", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const Json& t = list[i];
      const std::string path = absl::StrCat("added_tokens[", i, "]");
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          !t.contains("content") || !t["content"].is_string()) {
        return ctx.error(path, "expected an object with an integer id and a string content");
      }
      HfAddedToken token;
      token.id = t["id"].get<int32_t>();
      token.content = t["content"].get<std::string>();
      if (token.id < 0) return ctx.error(path + ".id", "negative id");
      if (token.content.empty()) return ctx.error(path + ".content", "empty");
      for (const auto& [key, field] : {std::pair<const char*, bool*>{"special", &token.special},
                                       {"lstrip", &token.lstrip},
                                       {"rstrip", &token.rstrip},
                                       {"normalized", &token.normalized},
                                       {"single_word", &token.single_word}}) {
        absl::StatusOr<bool> v = get_bool(ctx, t, path, key, false);
        if (!v.ok()) return v.status();
        *field = *v;
      }
      max_id = std::max(max_id, token.id);
      impl->token_ids[token.content] = token.id;
      impl->added.push_back(std::move(token));
    }
  }
  impl->normalized_content.resize(impl->added.size());
  for (size_t k = 0; k < impl->added.size(); ++k) {
    if (impl->added[k].normalized) {
      if (absl::Status s = impl->normalize(impl->added[k].content, &impl->normalized_content[k]);
          !s.ok()) {
        return s;
      }
      if (impl->normalized_content[k].empty()) continue;
      impl->normalized_added[static_cast<uint8_t>(impl->normalized_content[k][0])].push_back(
          static_cast<int32_t>(k));
    } else {
      impl->raw_added[static_cast<uint8_t>(impl->added[k].content[0])].push_back(
          static_cast<int32_t>(k));
    }
  }
  for (Impl::AddedBuckets* buckets : {&impl->raw_added, &impl->normalized_added}) {
    const bool normalized = buckets == &impl->normalized_added;
    for (std::vector<int32_t>& list : *buckets) {
      std::stable_sort(list.begin(), list.end(), [&](int32_t x, int32_t y) {
        const auto& cx = normalized ? impl->normalized_content[x] : impl->added[x].content;
        const auto& cy = normalized ? impl->normalized_content[y] : impl->added[y].content;
        return cx.size() > cy.size();
      });
    }
  }

  // Decoded bytes per id (the ByteLevel decoder: a token whose characters are all in the
  // byte-level alphabet becomes those bytes, any other token its UTF-8 text).
  impl->id_bytes.assign(max_id + 1, std::string());
  impl->id_known.assign(max_id + 1, 0);
  impl->id_special.assign(max_id + 1, 0);
  auto set_decoded = [&](int32_t id, const std::string& token) {
    std::optional<std::string> bytes = abc.to_bytes(token);
    impl->id_bytes[id] = bytes ? *bytes : token;
    impl->id_known[id] = 1;
  };
  for (const auto& [id, token] : id_tokens) set_decoded(id, token);
  for (const HfAddedToken& t : impl->added) {
    set_decoded(t.id, t.content);
    impl->id_special[t.id] = t.special ? 1 : 0;
  }
  return HfTokenizer(std::move(impl));
}

absl::StatusOr<HfTokenizer> HfTokenizer::load(const std::string& dir) {
  namespace stdfs = std::filesystem;
  const std::string path = (stdfs::path(dir) / "tokenizer.json").string();
  absl::StatusOr<std::string> text = read_text_file(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<HfTokenizer> tok = from_json_text(*text, path);
  if (!tok.ok()) return tok.status();
  Impl& impl = *tok->impl_;

  auto resolve = [&](const std::string& file, const std::string& key,
                     const std::string& token) -> absl::StatusOr<int32_t> {
    std::optional<int32_t> id = tok->token_to_id(token);
    if (!id) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", key, ": token '", token, "' is not in the tokenizer"));
    }
    return *id;
  };
  const std::string config_path = (stdfs::path(dir) / "tokenizer_config.json").string();
  if (stdfs::exists(config_path)) {
    absl::StatusOr<Json> config = read_json_file(config_path);
    if (!config.ok()) return config.status();
    for (const auto& [key, slot] :
         {std::pair<const char*, std::optional<int32_t>*>{"bos_token", &impl.bos},
          {"eos_token", &impl.eos},
          {"pad_token", &impl.pad}}) {
      if (std::optional<std::string> token = config_token(*config, key)) {
        absl::StatusOr<int32_t> id = resolve(config_path, key, *token);
        if (!id.ok()) return id.status();
        *slot = *id;
      }
    }
  }
  const std::string gen_path = (stdfs::path(dir) / "generation_config.json").string();
  if (stdfs::exists(gen_path)) {
    absl::StatusOr<Json> gen = read_json_file(gen_path);
    if (!gen.ok()) return gen.status();
    auto check_id = [&](const Json& v, const std::string& key) -> absl::StatusOr<int32_t> {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok->vocab_size()) {
        return absl::InvalidArgumentError(absl::StrCat(gen_path, ": ", key,
                                                       ": expected a token id below ",
                                                       tok->vocab_size(), ", got ", v.dump()));
      }
      return v.get<int32_t>();
    };
    if (gen->contains("eos_token_id") && !(*gen)["eos_token_id"].is_null()) {
      const Json& eos = (*gen)["eos_token_id"];
      const Json list = eos.is_array() ? eos : Json::array({eos});
      for (size_t i = 0; i < list.size(); ++i) {
        absl::StatusOr<int32_t> id = check_id(list[i], absl::StrCat("eos_token_id[", i, "]"));
        if (!id.ok()) return id.status();
        if (std::find(impl.eos_all.begin(), impl.eos_all.end(), *id) == impl.eos_all.end()) {
          impl.eos_all.push_back(*id);
        }
      }
    }
    for (const auto& [key, slot] :
         {std::pair<const char*, std::optional<int32_t>*>{"bos_token_id", &impl.bos},
          {"pad_token_id", &impl.pad}}) {
      if (gen->contains(key) && !(*gen)[key].is_null() && !slot->has_value()) {
        absl::StatusOr<int32_t> id = check_id((*gen)[key], key);
        if (!id.ok()) return id.status();
        *slot = *id;
      }
    }
  }
  if (impl.eos) {
    if (std::find(impl.eos_all.begin(), impl.eos_all.end(), *impl.eos) == impl.eos_all.end()) {
      impl.eos_all.push_back(*impl.eos);
    }
  } else if (!impl.eos_all.empty()) {
    impl.eos = impl.eos_all.front();
  }
  return tok;
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::encode(std::string_view text,
                                                         bool add_special_tokens) const {
  const Impl& im = *impl_;
  if (const size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("text is not valid UTF-8 (byte ", bad, ")"));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<std::pair<std::string_view, int32_t>> raw_pieces;
  im.split_added(text, im.raw_added, /*normalized=*/false, &raw_pieces);
  std::string normalized;
  std::vector<std::pair<std::string_view, int32_t>> pieces;
  for (const auto& [piece, token] : raw_pieces) {
    if (token >= 0) {
      ids.push_back(im.added[token].id);
      continue;
    }
    if (absl::Status s = im.normalize(piece, &normalized); !s.ok()) return s;
    pieces.clear();
    im.split_added(normalized, im.normalized_added, /*normalized=*/true, &pieces);
    for (const auto& [sub, sub_token] : pieces) {
      if (sub_token >= 0) {
        ids.push_back(im.added[sub_token].id);
      } else if (absl::Status s = im.encode_plain(sub, &ids); !s.ok()) {
        return s;
      }
    }
  }
  if (add_special_tokens && !im.single_template.empty()) {
    std::vector<int32_t> out;
    for (const TemplatePiece& p : im.single_template) {
      if (p.is_sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), p.ids.begin(), p.ids.end());
      }
    }
    return out;
  }
  return ids;
}

absl::StatusOr<std::string> HfTokenizer::decode(std::span<const int32_t> ids,
                                                bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= static_cast<int32_t>(im.id_known.size()) || !im.id_known[id]) {
      return absl::InvalidArgumentError(
          absl::StrCat("ids[", i, "]: ", id, " is not a token id of ", im.source));
    }
    if (skip_special_tokens && im.id_special[id]) continue;
    out += im.id_bytes[id];
  }
  return out;
}

std::string HfTokenizer::to_valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    size_t bad = 0;
    uint32_t cp = 0;
    const size_t n = utf8_sequence(bytes, i, &bad, &cp);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
    } else {
      out.append(bytes.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::optional<int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->token_ids.find(av(token));
  if (it == impl_->token_ids.end()) return std::nullopt;
  return it->second;
}

int32_t HfTokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_known.size()); }
const std::vector<HfAddedToken>& HfTokenizer::added_tokens() const { return impl_->added; }
std::optional<int32_t> HfTokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> HfTokenizer::pad_id() const { return impl_->pad; }
std::optional<int32_t> HfTokenizer::eos_id() const { return impl_->eos; }
const std::vector<int32_t>& HfTokenizer::eos_ids() const { return impl_->eos_all; }

}  // namespace fp8rl::rl
