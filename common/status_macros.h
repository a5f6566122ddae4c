// Status propagation for functions that return absl::Status or absl::StatusOr<T>: the one
// definition of FP8RL_RETURN_IF_ERROR and FP8RL_ASSIGN_OR_RETURN for the whole project.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates expr (an absl::Status) and returns it from the enclosing function when it is not OK.
//   FP8RL_RETURN_IF_ERROR(file.write(bytes));
#define FP8RL_RETURN_IF_ERROR(expr)                                   \
  do {                                                                \
    if (::absl::Status fp8rl_status_ = (expr); !fp8rl_status_.ok()) { \
      return fp8rl_status_;                                           \
    }                                                                 \
  } while (false)

// Evaluates expr (an absl::StatusOr<T>); returns its status from the enclosing function when it is
// not OK, else moves the value into lhs, which may declare a new variable:
//   FP8RL_ASSIGN_OR_RETURN(const Header header, read_header(path));
//   FP8RL_ASSIGN_OR_RETURN(options.port, parse_port(text));
#define FP8RL_ASSIGN_OR_RETURN(lhs, expr) \
  FP8RL_ASSIGN_OR_RETURN_IMPL_(FP8RL_STATUS_MACROS_CONCAT_(fp8rl_statusor_, __LINE__), lhs, expr)

#define FP8RL_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)  \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#define FP8RL_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define FP8RL_STATUS_MACROS_CONCAT_(a, b) FP8RL_STATUS_MACROS_CONCAT_INNER_(a, b)
