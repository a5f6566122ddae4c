// fp8rl: the command-line tool (user CLI and local launcher). Dispatches to the commands of one
// table, kCommands.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/fp8rl/command.h"

namespace fp8rl::cli {

namespace {

// Every `fp8rl` command, in the order `fp8rl --help` lists them.
const std::vector<Command> kCommands = {
    {"init", "init --config CONFIG.json --out DIR [--seed S] [--init-std X] [--dtype f32|bf16]",
     init_main},
    {"quantize",
     "quantize --model DIR --out DIR [--pow2-scales] [--bf16-first-layers N] "
     "[--bf16-last-layers N]",
     quantize_main},
    {"generate",
     "generate --model DIR --precision fp32|bf16|fp8 --in FILE --out FILE "
     "--max-new-tokens N [--temperature T] [--top-p P] [--top-k K] [--seed S] "
     "[--kv-cache fp32|bf16|fp8] [--stop-token ID ...] [--bf16-first-layers N] "
     "[--bf16-last-layers N] [--pow2-scales] [--device cuda|cpu|auto] "
     "[--gpu-memory-fraction F]",
     generate_main},
    {"score",
     "score --model DIR --precision fp32|bf16|fp8 --in FILE --out FILE [--temperature T] "
     "[--kv-cache fp32|bf16|fp8] [--bf16-first-layers N] [--bf16-last-layers N] "
     "[--pow2-scales] [--no-kv-fake-quant] [--device cuda|cpu|auto] [--gpu-memory-fraction F]",
     score_main},
    {"tokenize", "tokenize --tokenizer DIR --in FILE --out FILE", tokenize_main},
    {"export",
     "export (--checkpoint DIR | --job ID [--coordinator HOST:PORT]) --out DIR --format hf|fp8 "
     "[--max-shard-bytes N] [--tokenizer DIR]",
     export_main},
    {"plan",
     "plan --model CONFIG.json --gpu-memory GIB [--trainers N] "
     "[--shard none|grads_optimizer|params] [--step-tokens T] [--recompute] "
     "[--gpu-memory-fraction F] [--training fp8|bf16]",
     plan_main},
#if FP8RL_HAVE_SERVICES
    {"up",
     "up [--workers N] [--trainers N] [--port-offset N] [--data-dir DIR] [--bin-dir DIR] "
     "[--startup-timeout S] [--stop-timeout S] [--log-level L] [--no-restart] "
     "[--data-root DIR] [--models-root DIR] [--datasets-root DIR] [--auth-token-file FILE] "
     "[--tls-cert PEM --tls-key PEM --tls-ca PEM]",
     up_main},
    {"run",
     "run CONFIG [--workers N] [--trainers N] [--port-offset N] [--data-dir DIR] [--bin-dir DIR] "
     "[--startup-timeout S] [--stop-timeout S] [--log-level L] [--no-restart] "
     "[--data-root DIR] [--models-root DIR] [--datasets-root DIR] [--auth-token-file FILE] "
     "[--tls-cert PEM --tls-key PEM --tls-ca PEM]",
     run_main},
    // The job commands also take --token-file FILE (else $FP8RL_TOKEN) and --tls-ca/--tls-cert/
    // --tls-key (else $FP8RL_TLS_CA/_CERT/_KEY); see docs/guide.md.
    {"submit", "submit CONFIG [--coordinator HOST:PORT] [--quiet] [--token-file FILE]",
     submit_main},
    {"status", "status [ID] [--coordinator HOST:PORT]", status_main},
    {"list", "list [--state STATE] [--limit N] [--coordinator HOST:PORT]", list_main},
    {"cancel", "cancel ID [--coordinator HOST:PORT]", cancel_main},
    {"watch", "watch ID [--coordinator HOST:PORT]", watch_main},
    {"report", "report ID --out DIR [--coordinator HOST:PORT]", report_main},
#endif
};

}  // namespace

const std::vector<Command>& commands() { return kCommands; }

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
