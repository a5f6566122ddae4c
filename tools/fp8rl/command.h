// The `fp8rl` CLI is a set of subcommands; each cmd_*.cc registers one with FP8RL_COMMAND.
#pragma once

#include <string>
#include <vector>

namespace fp8rl::cli {

// A subcommand gets its own arguments (argv after the subcommand name) and returns the exit code.
using CommandFn = int (*)(const std::vector<std::string>& args);

struct Command {
  const char* name;
  const char* usage;  // one line: "quantize --model DIR --out DIR [...]"
  CommandFn run;
};

bool register_command(const Command& command);
const std::vector<Command>& commands();

// Prints "fp8rl <name>: <message>" on stderr (one line) and returns 2 (usage) or 1 (failure).
int usage_error(const char* name, const std::string& message);
int failure(const char* name, const std::string& message);

}  // namespace fp8rl::cli

#define FP8RL_CONCAT_INNER(a, b) a##b
#define FP8RL_CONCAT(a, b) FP8RL_CONCAT_INNER(a, b)
#define FP8RL_COMMAND(name, usage, fn)                                \
  [[maybe_unused]] static const bool FP8RL_CONCAT(kRegistered_, fn) = \
      ::fp8rl::cli::register_command({name, usage, fn})
