// fp8rl: the command-line tool (user CLI and local launcher). Dispatches to registered commands.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/fp8rl/command.h"

namespace fp8rl::cli {

std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}

bool register_command(const Command& command) {
  registry().push_back(command);
  return true;
}

const std::vector<Command>& commands() { return registry(); }

int usage_error(const char* name, const std::string& message) {
  std::fprintf(stderr, "fp8rl %s: %s\n", name, message.c_str());
  return 2;
}

int failure(const char* name, const std::string& message) {
  std::fprintf(stderr, "fp8rl %s: %s\n", name, message.c_str());
  return 1;
}

}  // namespace fp8rl::cli

namespace {

void print_usage(FILE* out) {
  std::fprintf(out, "usage: fp8rl <command> [flags]\n\ncommands:\n");
  for (const auto& c : fp8rl::cli::commands()) std::fprintf(out, "  fp8rl %s\n", c.usage);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  for (const auto& c : fp8rl::cli::commands()) {
    if (name == c.name) return c.run(std::vector<std::string>(argv + 2, argv + argc));
  }
  std::fprintf(stderr, "fp8rl: unknown command '%s' (see fp8rl --help)\n", name.c_str());
  return 2;
}
