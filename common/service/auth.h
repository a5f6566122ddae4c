// Bearer-token authentication shared by every service: a reloadable set of accepted tokens read
// from a file, the gRPC check a handler runs first (UNAUTHENTICATED otherwise) and the REST guard
// for routes under a prefix (401 {"error": ...} otherwise). Tokens are kept only as SHA-256
// digests and compared in constant time; no function here logs or returns a token.
#pragma once

#include <grpcpp/grpcpp.h>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/service/http_server.h"

namespace fp8rl::service {

// Tokens shorter than this are refused when a token file is read (a guessable token is no lock).
inline constexpr size_t kMinTokenChars = 16;

// The tokens a service accepts. File format: one token per line; blank lines and lines starting
// with '#' are ignored; surrounding whitespace is trimmed. At least one token; each at least
// kMinTokenChars printable ASCII characters without spaces.
class TokenSet {
 public:
  // Reads `path`; errors name the flag and the line, never the token ("--auth-token-file: line 3:
  // token shorter than 16 characters").
  static absl::StatusOr<std::shared_ptr<TokenSet>> load(const std::string& path,
                                                        std::string_view flag);
  // From tokens in memory (tests, the CLI); the same rules as a file.
  static absl::StatusOr<std::shared_ptr<TokenSet>> from_tokens(
      const std::vector<std::string>& tokens, std::string_view flag);

  // Reads the file again; on error the tokens in force stay. Returns the number now accepted.
  absl::StatusOr<size_t> reload();

  // Whether `token` is one of the accepted tokens. Every accepted token is compared, each in
  // constant time over its digest, so the answer's timing does not depend on where they differ.
  bool accepts(std::string_view token) const;

  size_t size() const;
  const std::string& path() const { return path_; }

 private:
  using Digest = std::array<uint8_t, 32>;
  TokenSet(std::string path, std::string flag) : path_(std::move(path)), flag_(std::move(flag)) {}
  static absl::StatusOr<std::vector<Digest>> parse(std::string_view text, std::string_view flag);

  const std::string path_;  // "" when built from memory
  const std::string flag_;
  mutable std::mutex mu_;
  std::vector<Digest> digests_;  // guarded by mu_
};

// The token of an "Authorization: Bearer <token>" value; nullopt for any other form.
std::optional<std::string_view> bearer_token(std::string_view authorization);

// A token read from a file for a client: the first token line (same format as TokenSet files).
absl::StatusOr<std::string> read_token_file(const std::string& path, std::string_view flag);

// A fresh random token: 32 bytes from OpenSSL's CSPRNG as 64 hex digits.
absl::StatusOr<std::string> generate_token();
// Writes `token` to `path` readable by the owner only (mode 0600), replacing the file atomically
// (a reader sees the old file or the new one, never a part).
absl::Status write_token_file(const std::string& path, const std::string& token);

// The check each gRPC handler of a protected service runs first: OK when `tokens` is null (no
// token configured) or the call's "authorization" metadata carries an accepted bearer token;
// UNAUTHENTICATED otherwise.
grpc::Status authorize(const TokenSet* tokens, const grpc::ServerContext* context);

// A REST guard (HttpServer::set_guard) that answers 401 {"error": ...} with
// "WWW-Authenticate: Bearer" for a request whose path starts with `prefix` and carries no
// accepted token; other paths pass. Null `tokens`: every request passes.
HttpGuard bearer_guard(std::shared_ptr<const TokenSet> tokens, std::string prefix);

// Reloads token sets on SIGHUP: install_reload_handler() once, then a TokenReloader thread
// re-reads each set when the signal arrives and logs the outcome (counts, never tokens).
absl::Status install_reload_handler();
// How many SIGHUPs arrived so far (async-signal-safe counter read).
uint64_t reload_signals();

class TokenReloader {
 public:
  explicit TokenReloader(std::vector<std::shared_ptr<TokenSet>> sets);
  ~TokenReloader();
  TokenReloader(const TokenReloader&) = delete;
  TokenReloader& operator=(const TokenReloader&) = delete;

 private:
  void run();
  const std::vector<std::shared_ptr<TokenSet>> sets_;
  std::mutex mu_;
  std::condition_variable cv_;  // wakes run() for stop
  bool stopping_ = false;       // guarded by mu_
  std::thread thread_;
};

}  // namespace fp8rl::service
