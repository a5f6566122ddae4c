// Restart at once: a listener of the shared HTTP and gRPC servers can be re-bound by a new server
// right after the old one stopped, even while the old one's connections sit in TIME_WAIT (the
// server closed a keep-alive connection first, as when a service is stopped under a scraper), and
// `fp8rl up`'s pre-flight bind (SO_REUSEADDR) agrees; a port with a live listener still refuses a
// second server (no SO_REUSEPORT sharing).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/service/grpc_server.h"
#include "common/service/http_server.h"
#include "common/service/metrics.h"
#include "gtest/gtest.h"

namespace fp8rl::service {
namespace {

sockaddr_in loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// What `fp8rl up` checks before it starts a service (tools/fp8rl/cluster.cc): bind() with
// SO_REUSEADDR succeeds.
bool preflight_bind_ok(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const sockaddr_in addr = loopback(port);
  const bool ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// TCP sockets in TIME_WAIT whose local port is `port` (IPv4, from /proc/net/tcp).
int time_wait_count(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  int count = 0;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 4) continue;
    const std::vector<std::string> local = absl::StrSplit(f[1], ':');
    unsigned local_port = 0;
    if (local.size() == 2 && absl::SimpleHexAtoi(local[1], &local_port) &&
        static_cast<int>(local_port) == port && f[3] == "06") {
      ++count;
    }
  }
  return count;
}

// A keep-alive HTTP/1.1 client on one connection: GET /healthz, read the whole reply.
class KeepAliveClient {
 public:
  explicit KeepAliveClient(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    const sockaddr_in addr = loopback(port);
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~KeepAliveClient() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  KeepAliveClient(const KeepAliveClient&) = delete;
  KeepAliveClient& operator=(const KeepAliveClient&) = delete;

  // True when the reply to GET /healthz is a 200 with {"status":"ok"}.
  bool healthz() {
    if (!connected_) return false;
    const std::string request =
        "GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: keep-alive\r\n\r\n";
    if (::send(fd_, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      return false;
    }
    std::string reply;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (reply.find(R"({"status":"ok"})") == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      char chunk[1024];
      const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) return false;
      reply.append(chunk, static_cast<size_t>(n));
    }
    return reply.starts_with("HTTP/1.1 200");
  }

 private:
  int fd_;
  bool connected_ = false;
};

std::unique_ptr<HttpServer> http_server(MetricsRegistry* registry, int port) {
  HttpServerOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.threads = 2;
  return std::make_unique<HttpServer>(options, registry);
}

TEST(Listener, HttpRebindsAtOnceAfterStopUnderKeepAlive) {
  MetricsRegistry registry;
  auto first = http_server(&registry, 0);
  const absl::StatusOr<int> port = first->start();
  ASSERT_TRUE(port.ok()) << port.status();
  // A scraper holds a keep-alive connection while the server stops: the server closes first, so
  // its end of the connection stays in TIME_WAIT.
  KeepAliveClient scraper(*port);
  ASSERT_TRUE(scraper.healthz());
  ASSERT_TRUE(scraper.healthz());  // same connection, second request
  const auto stop_start = std::chrono::steady_clock::now();
  first->stop();  // waits for the idle keep-alive connection's read timeout (5 s)
  EXPECT_LT(std::chrono::steady_clock::now() - stop_start, std::chrono::seconds(10));
  scraper.close();  // the scraper sees the server's FIN and closes: server end -> TIME_WAIT
  for (int i = 0; i < 100 && time_wait_count(*port) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(time_wait_count(*port), 1) << "the test did not produce the TIME_WAIT it is about";
  EXPECT_TRUE(preflight_bind_ok(*port)) << "port " << *port;

  MetricsRegistry registry2;
  auto second = http_server(&registry2, *port);
  const absl::StatusOr<int> again = second->start();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *port);
  KeepAliveClient client(*port);
  EXPECT_TRUE(client.healthz());
}

TEST(Listener, HttpPortWithLiveListenerRefusesSecondServer) {
  MetricsRegistry registry;
  auto first = http_server(&registry, 0);
  const absl::StatusOr<int> port = first->start();
  ASSERT_TRUE(port.ok()) << port.status();
  MetricsRegistry registry2;
  auto second = http_server(&registry2, *port);
  const absl::StatusOr<int> taken = second->start();
  ASSERT_FALSE(taken.ok()) << "a second server bound live port " << *port;
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(taken.status().message().find(absl::StrCat(":", *port)), std::string::npos);
  EXPECT_FALSE(preflight_bind_ok(*port));
}

TEST(Listener, GrpcRebindsAtOnceAndRefusesASecondServer) {
  auto first = GrpcServer::start({.address = "127.0.0.1:0"}, {});
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  EXPECT_FALSE(GrpcServer::start({.address = address}, {}).ok())
      << "a second gRPC server bound live port " << port;
  EXPECT_FALSE(preflight_bind_ok(port));

  // A connected client, then the server goes away first.
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  ASSERT_TRUE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5)));
  (*first)->shutdown(std::chrono::milliseconds(100));
  first->reset();
  EXPECT_TRUE(preflight_bind_ok(port)) << "port " << port;
  auto second = GrpcServer::start({.address = address}, {});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->port(), port);
  EXPECT_TRUE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5)));
}

}  // namespace
}  // namespace fp8rl::service
