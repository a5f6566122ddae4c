// Self-pipe signal handling (see shutdown.h).
#include "common/service/shutdown.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace fp8rl::service {
namespace {

int g_pipe[2] = {-1, -1};
std::atomic<bool> g_requested{false};
std::once_flag g_pipe_once;
absl::Status g_pipe_status;

void make_pipe() {
  if (pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    g_pipe_status = absl::InternalError(absl::StrCat("shutdown pipe: ", std::strerror(errno)));
  }
}

void on_signal(int) {
  g_requested.store(true);
  if (g_pipe[1] >= 0) {
    const char byte = 1;
    [[maybe_unused]] ssize_t n = write(g_pipe[1], &byte, 1);
  }
}

}  // namespace

absl::Status install_shutdown_handlers() {
  std::call_once(g_pipe_once, make_pipe);
  if (!g_pipe_status.ok()) return g_pipe_status;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (sigaction(SIGTERM, &action, nullptr) != 0 || sigaction(SIGINT, &action, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("sigaction: ", std::strerror(errno)));
  }
  signal(SIGPIPE, SIG_IGN);
  return absl::OkStatus();
}

bool wait_for_shutdown(std::chrono::milliseconds timeout) {
  std::call_once(g_pipe_once, make_pipe);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!g_requested.load()) {
    if (g_pipe[0] < 0) return g_requested.load();
    int wait_ms = -1;
    if (timeout.count() >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      wait_ms = static_cast<int>(std::min<int64_t>(left.count(), 1000));
    } else {
      wait_ms = 1000;
    }
    pollfd fd{g_pipe[0], POLLIN, 0};
    if (poll(&fd, 1, wait_ms) > 0) {
      char buffer[16];
      while (read(g_pipe[0], buffer, sizeof(buffer)) > 0) {
      }
    }
  }
  return true;
}

bool shutdown_requested() { return g_requested.load(); }

void request_shutdown() {
  std::call_once(g_pipe_once, make_pipe);
  on_signal(0);
}

}  // namespace fp8rl::service
