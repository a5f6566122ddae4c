// Graceful shutdown for service binaries: SIGTERM/SIGINT only write a byte to a self-pipe (all a
// signal handler may safely do); the main thread waits on the pipe, then drains and stops the
// servers within a deadline.
#pragma once

#include <chrono>

#include "absl/status/status.h"

namespace fp8rl::service {

// Installs the SIGTERM and SIGINT handlers (idempotent). Also ignores SIGPIPE, so a peer that
// hangs up never kills the process.
absl::Status install_shutdown_handlers();

// Blocks until a signal arrives or request_shutdown() is called; returns true then. Returns
// false when `timeout` passes first (a negative timeout waits forever).
bool wait_for_shutdown(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));

// Whether shutdown was requested (non-blocking).
bool shutdown_requested();

// Requests shutdown from normal code (tests, an admin endpoint). Async-signal-safe.
void request_shutdown();

}  // namespace fp8rl::service
