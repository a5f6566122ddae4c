// Tests of the shared HTTP server over raw loopback sockets, so the exact bytes on the wire are
// under the test's control: a POST without Content-Length (plain `curl -X POST`) reaches its
// route with an empty body, and bodies with Content-Length or chunked encoding, the size limit,
// unknown routes and throwing handlers behave as documented in http_server.h.
#include "common/service/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/service/metrics.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fp8rl::service {
namespace {

constexpr int64_t kMaxBody = 4096;
// The server's own read timeout is 5 s; a reply that waited for a body would take that long.
constexpr auto kPromptReply = std::chrono::milliseconds(2000);

struct RawReply {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::chrono::milliseconds elapsed{0};
};

// One TCP connection to the server; requests are written verbatim.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }

  bool send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads one response (status line, headers, Content-Length body); nullopt on timeout, a closed
  // connection before the reply was complete, or a malformed reply.
  std::optional<RawReply> read_reply(std::chrono::milliseconds timeout = std::chrono::seconds(8)) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout;
    size_t header_end;
    while ((header_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill(deadline)) return std::nullopt;
    }
    RawReply reply;
    const std::vector<std::string> lines =
        absl::StrSplit(buffer_.substr(0, header_end), "\r\n", absl::SkipEmpty());
    const std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
    if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &reply.status)) {
      return std::nullopt;
    }
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == std::string::npos) return std::nullopt;
      reply.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
    size_t length = 0;
    if (!absl::SimpleAtoi(reply.headers["content-length"], &length)) return std::nullopt;
    const size_t body_start = header_end + 4;
    while (buffer_.size() < body_start + length) {
      if (!fill(deadline)) return std::nullopt;
    }
    reply.body = buffer_.substr(body_start, length);
    buffer_.erase(0, body_start + length);
    reply.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    return reply;
  }

 private:
  bool fill(std::chrono::steady_clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char chunk[4096];
    const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  std::string buffer_;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions options;
    options.host = "127.0.0.1";
    options.max_body_bytes = kMaxBody;
    options.threads = 2;
    server_ = std::make_unique<HttpServer>(options, &registry_);
    // Echoes what the route saw: captures, query and body.
    server_->post("/v1/items/([^/:]+):cancel", [](const HttpRequest& r) {
      nlohmann::json reply = {{"id", r.params.at(0)}, {"body", r.body}};
      if (r.query.contains("reason")) reply["reason"] = r.query.at("reason");
      return HttpResponse{200, reply.dump()};
    });
    // Needs a body, like POST /v1/jobs.
    server_->post("/v1/items", [](const HttpRequest& r) {
      if (r.body.empty()) return json_error(400, "body: a JSON item is required");
      return HttpResponse{201, nlohmann::json{{"body", r.body}}.dump()};
    });
    server_->post("/v1/explode",
                  [](const HttpRequest&) -> HttpResponse { throw std::runtime_error("kaboom"); });
    server_->get("/v1/items/([^/:]+)", [](const HttpRequest& r) {
      return HttpResponse{200, nlohmann::json{{"id", r.params.at(0)}}.dump()};
    });
    auto port = server_->start();
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
  }

  void TearDown() override { server_->stop(); }

  // A fresh connection, one request, one reply.
  std::optional<RawReply> exchange(const std::string& request) {
    RawConnection c(port_);
    if (!c.connected() || !c.send(request)) return std::nullopt;
    return c.read_reply();
  }

  std::string random_text(size_t n) {
    std::uniform_int_distribution<int> letter('!', '~');
    std::string s(n, ' ');
    for (char& ch : s) ch = static_cast<char>(letter(rng_));
    return s;
  }

  MetricsRegistry registry_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::mt19937 rng_{20240611};
};

TEST_F(HttpServerTest, PostWithoutContentLengthIsRoutedWithAnEmptyBody) {
  RawConnection c(port_);
  ASSERT_TRUE(c.connected());
  const std::string id = absl::StrCat("item-", rng_() % 100000 + 1);
  // Exactly what `curl -X POST URL` sends: no Content-Length, no Transfer-Encoding.
  ASSERT_TRUE(c.send(absl::StrCat("POST /v1/items/", id,
                                  ":cancel?reason=user HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  "User-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n")));
  auto reply = c.read_reply();
  ASSERT_TRUE(reply.has_value()) << "no reply to a body-less POST";
  EXPECT_EQ(reply->status, 200) << reply->body;
  EXPECT_LT(reply->elapsed, kPromptReply) << "the server waited for a body";
  const auto json = nlohmann::json::parse(reply->body);
  EXPECT_EQ(json["id"], id);
  EXPECT_EQ(json["body"], "");
  EXPECT_EQ(json["reason"], "user");

  // The connection stays usable: nothing after the headers was taken as a body.
  ASSERT_TRUE(c.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  reply = c.read_reply();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->body, R"({"status":"ok"})");

  const std::string metrics = registry_.render();
  EXPECT_NE(metrics.find("fp8rl_http_requests_total{code=\"200\"} 2"), std::string::npos)
      << metrics;
}

TEST_F(HttpServerTest, PostWithoutBodyToARouteThatNeedsOneGetsTheRoutesError) {
  auto reply = exchange("POST /v1/items HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status, 400);
  EXPECT_EQ(nlohmann::json::parse(reply->body)["error"], "body: a JSON item is required");
}

TEST_F(HttpServerTest, PostWithoutBodyToAnUnknownRouteIs404) {
  auto reply = exchange("POST /v1/nowhere:cancel HTTP/1.1\r\nHost: h\r\n\r\n");
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status, 404);
  EXPECT_EQ(nlohmann::json::parse(reply->body)["error"], "no route for POST /v1/nowhere:cancel");
  EXPECT_LT(reply->elapsed, kPromptReply);
}

TEST_F(HttpServerTest, PostWithoutBodyWhoseHandlerThrowsIs500AndServingContinues) {
  auto reply = exchange("POST /v1/explode HTTP/1.1\r\nHost: h\r\n\r\n");
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status, 500);
  EXPECT_EQ(nlohmann::json::parse(reply->body)["error"], "internal error: kaboom");
  reply = exchange("GET /v1/items/abc HTTP/1.1\r\nHost: h\r\n\r\n");
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(nlohmann::json::parse(reply->body)["id"], "abc");
}

TEST_F(HttpServerTest, PostWithContentLengthDeliversTheBody) {
  for (size_t size : {size_t{1}, size_t{137}, static_cast<size_t>(kMaxBody)}) {
    const std::string body = random_text(size);
    auto reply = exchange(absl::StrCat(
        "POST /v1/items HTTP/1.1\r\nHost: h\r\nContent-Length: ", body.size(), "\r\n\r\n", body));
    ASSERT_TRUE(reply.has_value()) << size;
    EXPECT_EQ(reply->status, 201) << size;
    EXPECT_EQ(nlohmann::json::parse(reply->body)["body"], body) << size;
  }
  // An explicit empty body reaches the route as well.
  auto reply =
      exchange("POST /v1/items/x7:cancel HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n");
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(nlohmann::json::parse(reply->body)["id"], "x7");
}

TEST_F(HttpServerTest, ChunkedPostDeliversTheBody) {
  const std::string a = random_text(300);
  const std::string b = random_text(45);
  auto reply = exchange(
      absl::StrCat("POST /v1/items HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
                   absl::StrFormat("%x", a.size()), "\r\n", a, "\r\n",
                   absl::StrFormat("%x", b.size()), "\r\n", b, "\r\n0\r\n\r\n"));
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status, 201) << reply->body;
  EXPECT_EQ(nlohmann::json::parse(reply->body)["body"], a + b);
}

TEST_F(HttpServerTest, OversizedBodyIs400NamingTheLimit) {
  const std::string body = random_text(kMaxBody + 1);
  auto reply = exchange(absl::StrCat(
      "POST /v1/items HTTP/1.1\r\nHost: h\r\nContent-Length: ", body.size(), "\r\n\r\n", body));
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status, 400);
  EXPECT_EQ(nlohmann::json::parse(reply->body)["error"],
            absl::StrCat("body: request body exceeds the limit of ", kMaxBody, " bytes"));
  // Still serving.
  reply = exchange("GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n");
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status, 200);
}

TEST_F(HttpServerTest, UnknownRouteIs404) {
  auto reply = exchange("GET /v1/nothing/here HTTP/1.1\r\nHost: h\r\n\r\n");
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status, 404);
  EXPECT_EQ(nlohmann::json::parse(reply->body)["error"], "no route for GET /v1/nothing/here");
  const std::string body = random_text(20);
  reply = exchange(absl::StrCat(
      "POST /v1/nothing HTTP/1.1\r\nHost: h\r\nContent-Length: ", body.size(), "\r\n\r\n", body));
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status, 404);
  EXPECT_EQ(nlohmann::json::parse(reply->body)["error"], "no route for POST /v1/nothing");
}

}  // namespace
}  // namespace fp8rl::service
