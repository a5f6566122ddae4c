// The chat-template lexer (rl/chat_template_lexer.h): jinja2's lexing rules with HF's
// trim_blocks/lstrip_blocks, and Python's escapes in string literals.
#include "rl/chat_template_lexer.h"

#include <algorithm>
#include <cctype>
#include <cstddef>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "rl/chat_template_pystr.h"

namespace fp8rl::rl::chat_template_internal {

absl::Status template_error(Pos pos, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("chat_template ", pos.line, ":", pos.col, ": ", what));
}

namespace {

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // jinja2: \r\n and \r become \n, and one trailing newline is dropped.
    for (size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_.push_back('\n');
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_.push_back(source[k]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t k = 0; k < src_.size(); ++k) {
      if (src_[k] == '\n') line_starts_.push_back(k + 1);
    }
  }

  absl::StatusOr<std::vector<Piece>> run() {
    std::vector<Piece> pieces;
    size_t pos = 0;
    bool line_starting = true;
    const std::string_view s = src_;
    while (pos < s.size()) {
      size_t start = std::string_view::npos;
      for (size_t k = s.find('{', pos); k != std::string_view::npos; k = s.find('{', k + 1)) {
        if (k + 1 < s.size() && (s[k + 1] == '{' || s[k + 1] == '%' || s[k + 1] == '#')) {
          start = k;
          break;
        }
      }
      if (start == std::string_view::npos) {
        pieces.push_back({Piece::kText, std::string(s.substr(pos)), {}, position(pos)});
        break;
      }
      const char kind = s[start + 1];
      const char sign = start + 2 < s.size() && (s[start + 2] == '-' || s[start + 2] == '+')
                            ? s[start + 2]
                            : '\0';
      std::string_view text = s.substr(pos, start - pos);
      if (sign == '-') {
        FP8RL_ASSIGN_OR_RETURN(text, rstrip_space(text));
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop the indentation before a block or comment tag on its own line.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
          FP8RL_ASSIGN_OR_RETURN(const std::string_view rest, rstrip_space(text.substr(l_pos)));
          if (rest.empty()) text = text.substr(0, l_pos);
        }
      }
      if (!text.empty()) pieces.push_back({Piece::kText, std::string(text), {}, position(pos)});
      const Pos tag_pos = position(start);
      pos = start + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        const size_t end = s.find("#}", pos);
        if (end == std::string_view::npos) {
          return template_error(tag_pos, "missing end of comment tag '#}'");
        }
        const char end_sign = end > pos ? s[end - 1] : '\0';
        pos = end + 2;
        FP8RL_ASSIGN_OR_RETURN(line_starting,
                               consume_after_tag(end_sign, /*trim_newline=*/true, pos));
        continue;
      }
      Piece piece{kind == '{' ? Piece::kVar : Piece::kBlock, "", {}, tag_pos};
      const std::string_view close = kind == '{' ? "}}" : "%}";
      Pos close_pos;
      while (true) {
        FP8RL_RETURN_IF_ERROR(skip_space(pos));
        if (pos >= s.size()) {
          return template_error(tag_pos,
                                absl::StrCat("missing end of tag '", std::string(close), "'"));
        }
        close_pos = position(pos);
        if (s.substr(pos, 2) == close) {
          pos += 2;
          FP8RL_ASSIGN_OR_RETURN(line_starting, consume_after_tag('\0', kind == '%', pos));
          break;
        }
        if ((s[pos] == '-' || (s[pos] == '+' && kind == '%')) && s.substr(pos + 1, 2) == close) {
          const char end_sign = s[pos];
          pos += 3;
          FP8RL_ASSIGN_OR_RETURN(line_starting, consume_after_tag(end_sign, kind == '%', pos));
          break;
        }
        FP8RL_ASSIGN_OR_RETURN(Token token, next_token(pos));
        piece.tokens.push_back(std::move(token));
      }
      piece.tokens.push_back({TokenType::kEnd, std::string(close), close_pos});
      pieces.push_back(std::move(piece));
    }
    return pieces;
  }

 private:
  // Advances `pos` over Python whitespace.
  absl::Status skip_space(size_t& pos) const {
    const std::string_view s = src_;
    while (pos < s.size()) {
      FP8RL_ASSIGN_OR_RETURN(const size_t n, space_at(s, pos));
      if (n == 0) break;
      pos += n;
    }
    return absl::OkStatus();
  }

  // Consumes what follows a tag end (`-`: all whitespace; none: one newline when trimming) and
  // returns jinja2's line_starting: whether the consumed match ended with a newline.
  absl::StatusOr<bool> consume_after_tag(char end_sign, bool trim_newline, size_t& pos) const {
    const std::string_view s = src_;
    if (end_sign == '-') {
      bool nl = false;
      while (pos < s.size()) {
        FP8RL_ASSIGN_OR_RETURN(const size_t n, space_at(s, pos));
        if (n == 0) break;
        nl = s[pos] == '\n';
        pos += n;
      }
      return nl;
    }
    if (end_sign != '+' && trim_newline && pos < s.size() && s[pos] == '\n') {
      ++pos;
      return true;
    }
    return false;
  }

  // Line and column (in code points) of src_[offset]. Offsets mostly come in increasing order,
  // so the column count continues from the previous answer on the same line: lexing a long
  // one-line template stays linear.
  Pos position(size_t offset) {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    size_t k = line_starts_[line - 1];
    int col = 1;
    if (last_line_ == line && last_offset_ <= offset) {
      k = last_offset_;
      col = last_col_;
    }
    for (; k < offset; ++k) {
      if ((static_cast<unsigned char>(src_[k]) & 0xc0) != 0x80) ++col;
    }
    last_line_ = line;
    last_offset_ = offset;
    last_col_ = col;
    return {static_cast<int>(line), col};
  }

  absl::StatusOr<Token> next_token(size_t& pos) {
    const std::string_view s = src_;
    const Pos at = position(pos);
    const char c = s[pos];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = pos;
      while (end < s.size() &&
             (std::isalnum(static_cast<unsigned char>(s[end])) || s[end] == '_')) {
        ++end;
      }
      Token t{TokenType::kName, std::string(s.substr(pos, end - pos)), at};
      pos = end;
      return t;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return number_token(pos, at);
    if (c == '\'' || c == '"') return string_token(pos, at);
    static constexpr std::string_view kTwoCharOps[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwoCharOps) {
      if (s.substr(pos, 2) == op) {
        pos += 2;
        return Token{TokenType::kOp, std::string(op), at};
      }
    }
    if (std::string_view("+-/*%~[](){}<>=.:|,").find(c) != std::string_view::npos) {
      ++pos;
      return Token{TokenType::kOp, std::string(1, c), at};
    }
    return template_error(at, absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  // An integer or float literal; '_' between digits is dropped as Python does.
  Token number_token(size_t& pos, Pos at) const {
    const std::string_view s = src_;
    size_t end = pos;
    auto digits = [&] {
      while (end < s.size() && (std::isdigit(static_cast<unsigned char>(s[end])) ||
                                (s[end] == '_' && end + 1 < s.size() &&
                                 std::isdigit(static_cast<unsigned char>(s[end + 1]))))) {
        ++end;
      }
    };
    digits();
    bool is_float = false;
    if (end + 1 < s.size() && s[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(s[end + 1]))) {
      ++end;
      digits();
      is_float = true;
    }
    if (end < s.size() && (s[end] == 'e' || s[end] == 'E')) {
      size_t e = end + 1;
      if (e < s.size() && (s[e] == '+' || s[e] == '-')) ++e;
      if (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) {
        end = e;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (char d : s.substr(pos, end - pos)) {
      if (d != '_') text.push_back(d);
    }
    pos = end;
    return {is_float ? TokenType::kFloat : TokenType::kInt, text, at};
  }

  // A quoted literal with Python's escapes (jinja2 decodes them with unicode-escape).
  absl::StatusOr<Token> string_token(size_t& pos, Pos at) const {
    const std::string_view s = src_;
    const char quote = s[pos];
    std::string out;
    size_t k = pos + 1;
    while (true) {
      if (k >= s.size()) return template_error(at, "unterminated string literal");
      const char c = s[k];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        ++k;
        continue;
      }
      if (k + 1 >= s.size()) return template_error(at, "unterminated string literal");
      const char e = s[k + 1];
      k += 2;
      // \xNN, \uNNNN, \UNNNNNNNN: `n` hex digits at s[k].
      auto hex = [&](int n) -> absl::Status {
        if (k + n > s.size()) return template_error(at, "truncated escape in string literal");
        char32_t v = 0;
        for (int d = 0; d < n; ++d) {
          const char h = s[k + d];
          if (!std::isxdigit(static_cast<unsigned char>(h))) {
            return template_error(at, "bad hex escape in string literal");
          }
          v = v * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                 ? h - '0'
                                                 : std::tolower(h) - 'a' + 10);
        }
        k += n;
        append_utf8(out, v);
        return absl::OkStatus();
      };
      switch (e) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case '\\':
        case '\'':
        case '"':
          out.push_back(e);
          break;
        case '\n':
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
          FP8RL_RETURN_IF_ERROR(hex(2));
          break;
        case 'u':
          FP8RL_RETURN_IF_ERROR(hex(4));
          break;
        case 'U':
          FP8RL_RETURN_IF_ERROR(hex(8));
          break;
        default:
          if (e >= '0' && e <= '7') {
            return template_error(at, "octal escapes in string literals are unsupported");
          }
          out.push_back('\\');  // Python keeps unknown escapes verbatim.
          out.push_back(e);
      }
    }
    pos = k + 1;
    return Token{TokenType::kString, out, at};
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  // The last position() answer, where the next one on the same line may continue counting.
  size_t last_line_ = 0;
  size_t last_offset_ = 0;
  int last_col_ = 1;
};

}  // namespace

absl::StatusOr<std::vector<Piece>> lex_template(std::string_view source) {
  return Lexer(source).run();
}

}  // namespace fp8rl::rl::chat_template_internal
