// Token files, constant-time checks and SIGHUP reloads (see auth.h).
#include "common/service/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/service/log.h"

namespace fp8rl::service {
namespace {

std::atomic<uint64_t> g_reload_signals{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the SIGHUP handler needs a lock-free counter");

void on_sighup(int) { g_reload_signals.fetch_add(1); }

absl::StatusOr<std::string> read_file(const std::string& path, std::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(std::string(flag), ": cannot read '", path, "'"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The token lines of a token file, each checked; errors name the line, never its text.
absl::StatusOr<std::vector<std::string>> token_lines(std::string_view text,
                                                     std::string_view flag_view) {
  const std::string flag(flag_view);
  std::vector<std::string> out;
  int line_number = 0;
  for (const absl::string_view raw :
       absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_number;
    const absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line.front() == '#') continue;
    if (line.size() < kMinTokenChars) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": line ", line_number, ": token shorter than ", kMinTokenChars, " characters"));
    }
    for (char c : line) {
      if (c <= ' ' || c > '~') {
        return absl::InvalidArgumentError(absl::StrCat(
            flag, ": line ", line_number, ": a token is printable ASCII without spaces"));
      }
    }
    out.emplace_back(line.data(), line.size());
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": no token in the file"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<TokenSet::Digest>> TokenSet::parse(std::string_view text,
                                                              std::string_view flag) {
  absl::StatusOr<std::vector<std::string>> lines = token_lines(text, flag);
  if (!lines.ok()) return lines.status();
  std::vector<Digest> out;
  for (const std::string& token : *lines) {
    Digest d;
    SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d.data());
    out.push_back(d);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<TokenSet>> TokenSet::load(const std::string& path,
                                                         std::string_view flag) {
  std::shared_ptr<TokenSet> set(new TokenSet(path, std::string(flag)));
  absl::StatusOr<size_t> n = set->reload();
  if (!n.ok()) return n.status();
  return set;
}

absl::StatusOr<std::shared_ptr<TokenSet>> TokenSet::from_tokens(
    const std::vector<std::string>& tokens, std::string_view flag) {
  std::string text;
  for (const std::string& t : tokens) absl::StrAppend(&text, t, "\n");
  absl::StatusOr<std::vector<Digest>> digests = parse(text, flag);
  if (!digests.ok()) return digests.status();
  std::shared_ptr<TokenSet> set(new TokenSet("", std::string(flag)));
  set->digests_ = std::move(*digests);
  return set;
}

absl::StatusOr<size_t> TokenSet::reload() {
  if (path_.empty()) return size();
  absl::StatusOr<std::string> text = read_file(path_, flag_);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<Digest>> digests = parse(*text, flag_);
  if (!digests.ok()) return digests.status();
  std::lock_guard<std::mutex> lock(mu_);
  digests_ = std::move(*digests);
  return digests_.size();
}

bool TokenSet::accepts(std::string_view token) const {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d.data());
  std::lock_guard<std::mutex> lock(mu_);
  bool found = false;
  for (const Digest& accepted : digests_) {
    // No early exit: every accepted token costs the same whether or not an earlier one matched.
    found |= CRYPTO_memcmp(accepted.data(), d.data(), d.size()) == 0;
  }
  return found;
}

size_t TokenSet::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return digests_.size();
}

std::optional<std::string_view> bearer_token(std::string_view authorization) {
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size()) return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (absl::ascii_tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) {
      return std::nullopt;
    }
  }
  std::string_view token = authorization.substr(kScheme.size());
  while (!token.empty() && absl::ascii_isspace(static_cast<unsigned char>(token.front()))) {
    token.remove_prefix(1);
  }
  while (!token.empty() && absl::ascii_isspace(static_cast<unsigned char>(token.back()))) {
    token.remove_suffix(1);
  }
  if (token.empty()) return std::nullopt;
  return token;
}

absl::StatusOr<std::string> read_token_file(const std::string& path, std::string_view flag) {
  absl::StatusOr<std::string> text = read_file(path, flag);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<std::string>> lines = token_lines(*text, flag);
  if (!lines.ok()) return lines.status();
  return lines->front();
}

absl::StatusOr<std::string> generate_token() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("token: the random generator failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

absl::Status write_token_file(const std::string& path, const std::string& token) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create '", tmp, "': ", std::strerror(errno)));
  }
  const std::string text = absl::StrCat(token, "\n");
  const bool ok = fchmod(fd, 0600) == 0 &&
                  write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  fsync(fd) == 0;
  const int saved = errno;
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = ok ? errno : saved;
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write '", path, "': ", std::strerror(err)));
  }
  return absl::OkStatus();
}

grpc::Status authorize(const TokenSet* tokens, const grpc::ServerContext* context) {
  if (tokens == nullptr) return grpc::Status::OK;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing credentials: send metadata 'authorization: Bearer <token>'");
  }
  std::optional<std::string_view> token =
      bearer_token(std::string_view(it->second.data(), it->second.size()));
  if (!token || !tokens->accepts(*token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
  }
  return grpc::Status::OK;
}

HttpGuard bearer_guard(std::shared_ptr<const TokenSet> tokens, std::string prefix) {
  return [tokens = std::move(tokens),
          prefix = std::move(prefix)](const HttpRequest& request) -> std::optional<HttpResponse> {
    if (tokens == nullptr || !request.path.starts_with(prefix)) return std::nullopt;
    std::optional<std::string_view> token = bearer_token(request.authorization);
    if (token && tokens->accepts(*token)) return std::nullopt;
    HttpResponse refused =
        json_error(401, request.authorization.empty()
                            ? "missing credentials: send 'Authorization: Bearer <token>'"
                            : "invalid bearer token");
    refused.headers["WWW-Authenticate"] = "Bearer";
    return refused;
  };
}

absl::Status install_reload_handler() {
  struct sigaction action {};
  action.sa_handler = on_sighup;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (sigaction(SIGHUP, &action, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("sigaction(SIGHUP): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

uint64_t reload_signals() { return g_reload_signals.load(); }

TokenReloader::TokenReloader(std::vector<std::shared_ptr<TokenSet>> sets)
    : sets_(std::move(sets)), thread_([this] { run(); }) {}

TokenReloader::~TokenReloader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void TokenReloader::run() {
  uint64_t seen = reload_signals();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // A signal handler cannot notify a condition variable: the counter is polled.
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    const uint64_t now = reload_signals();
    if (now == seen || stopping_) continue;
    seen = now;
    for (const std::shared_ptr<TokenSet>& set : sets_) {
      if (set == nullptr) continue;
      absl::StatusOr<size_t> n = set->reload();
      if (n.ok()) {
        log_info("auth", "token file reloaded",
                 {{"file", set->path()}, {"tokens", absl::StrCat(*n)}});
      } else {
        log_warn("auth", "token file reload failed; the previous tokens stay",
                 {{"error", std::string(n.status().message())}});
      }
    }
  }
}

}  // namespace fp8rl::service
