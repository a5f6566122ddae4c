// The `fp8rl` CLI is a set of subcommands. Each cmd_*.cc defines the entry points declared here;
// main.cc lists them all, with their usage lines, in one table (kCommands).
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

// Every command, in the order `fp8rl --help` lists them.
const std::vector<Command>& commands();

// Prints "fp8rl <name>: <message>" on stderr (one line) and returns 2 (usage) or 1 (failure).
int usage_error(const char* name, const std::string& message);
int failure(const char* name, const std::string& message);

// Entry points. Offline tools (cmd_init.cc, cmd_quantize.cc, cmd_generate.cc, cmd_score.cc):
int init_main(const std::vector<std::string>& args);
int quantize_main(const std::vector<std::string>& args);
int generate_main(const std::vector<std::string>& args);
int score_main(const std::vector<std::string>& args);
int tokenize_main(const std::vector<std::string>& args);  // cmd_tokenize.cc
int export_main(const std::vector<std::string>& args);    // cmd_export.cc
int plan_main(const std::vector<std::string>& args);      // cmd_plan.cc

#if FP8RL_HAVE_SERVICES
// The local cluster (cmd_cluster.cc) and the JobService client (cmd_jobs.cc); built only when the
// services are (the CMake option FP8RL_BUILD_SERVICES and gRPC found).
int up_main(const std::vector<std::string>& args);
int run_main(const std::vector<std::string>& args);
int submit_main(const std::vector<std::string>& args);
int status_main(const std::vector<std::string>& args);
int list_main(const std::vector<std::string>& args);
int cancel_main(const std::vector<std::string>& args);
int watch_main(const std::vector<std::string>& args);
int report_main(const std::vector<std::string>& args);  // cmd_report.cc
#endif

}  // namespace fp8rl::cli
