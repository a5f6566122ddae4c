// `fp8rl export`: writes a checkpoint (a Hugging Face folder, or a job's latest checkpoint) as a
// Hugging Face BF16 checkpoint or the block-FP8 checkpoint vLLM/SGLang load (model/hf_export.h),
// with the tokenizer files of the source model beside it.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/precision.h"
#include "model/hf_export.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "tools/fp8rl/args.h"
#include "tools/fp8rl/command.h"
#if FP8RL_HAVE_SERVICES
#include "tools/fp8rl/job_client.h"
#endif

namespace fp8rl::cli {
namespace {

namespace stdfs = std::filesystem;

constexpr char kName[] = "export";

struct ExportOptions {
  std::string checkpoint;  // --checkpoint, or resolved from --job
  std::string job;
  std::string coordinator;
  std::string out;
  std::string tokenizer;  // --tokenizer: where the tokenizer files come from
  model::HfExportOptions hf;
};

absl::StatusOr<ExportOptions> parse_options(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.value_flags = {"checkpoint", "job",       "coordinator",    "out",
                      "format",     "tokenizer", "max-shard-bytes"};
  absl::StatusOr<Args> args = Args::Parse(argv, spec);
  if (!args.ok()) return args.status();
  ExportOptions o;
  o.checkpoint = args->get("checkpoint").value_or("");
  o.job = args->get("job").value_or("");
  o.coordinator = args->get("coordinator").value_or("");
  if (args->has("checkpoint") == args->has("job")) {
    return absl::InvalidArgumentError("give exactly one of --checkpoint DIR, --job ID");
  }
  if (args->has("checkpoint") && o.checkpoint.empty()) {
    return absl::InvalidArgumentError("--checkpoint: empty path");
  }
  if (args->has("job") && o.job.empty()) return absl::InvalidArgumentError("--job: empty id");
  if (args->has("coordinator") && !args->has("job")) {
    return absl::InvalidArgumentError("--coordinator: only with --job");
  }
  absl::StatusOr<std::string> out = args->required("out");
  if (!out.ok()) return out.status();
  o.out = *out;
  while (o.out.size() > 1 && o.out.back() == '/') o.out.pop_back();  // "out/" names "out"
  if (o.out.empty()) return absl::InvalidArgumentError("--out: empty path");
  absl::StatusOr<std::string> format = args->required("format");
  if (!format.ok()) return format.status();
  absl::StatusOr<model::ExportFormat> f = model::parse_export_format(*format);
  if (!f.ok()) return absl::InvalidArgumentError(absl::StrCat("--format: ", f.status().message()));
  o.hf.format = *f;
  absl::StatusOr<int64_t> shard = args->get_int("max-shard-bytes", model::kDefaultMaxShardBytes);
  if (!shard.ok()) return shard.status();
  if (*shard <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max-shard-bytes: must be > 0, got ", *shard));
  }
  o.hf.max_shard_bytes = *shard;
  o.tokenizer = args->get("tokenizer").value_or("");
  if (args->has("tokenizer") && o.tokenizer.empty()) {
    return absl::InvalidArgumentError("--tokenizer: empty path");
  }
  return o;
}

// The newest complete checkpoint of a job: "<checkpoint.dir>/<id>/step-N" with the largest N
// that holds a config.json (the coordinator's checkpoint naming, services/coordinator/rl_loop.cc).
absl::StatusOr<std::string> latest_job_checkpoint(const std::string& root, const std::string& id) {
  const stdfs::path dir = stdfs::path(root) / id;
  std::error_code ec;
  int64_t best = -1;
  std::string best_path;
  for (const auto& entry : stdfs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (!name.starts_with("step-") || !absl::SimpleAtoi(name.substr(5), &step)) continue;
    if (step > best && stdfs::is_regular_file(entry.path() / "config.json", ec)) {
      best = step;
      best_path = entry.path().string();
    }
  }
  if (best < 0) {
    return absl::NotFoundError(absl::StrCat("--job: job ", id, " has no checkpoint under ",
                                            dir.string(), " (is checkpoint.every_steps set?)"));
  }
  return best_path;
}

// Fills o.checkpoint (and o.tokenizer unless given) from a job's config on the coordinator.
absl::Status resolve_job(ExportOptions& o) {
#if FP8RL_HAVE_SERVICES
  const std::string address = o.coordinator.empty() ? kDefaultCoordinator : o.coordinator;
  absl::StatusOr<service::ClientSecurity> security = cli_security(nullptr);  // FP8RL_TOKEN, ...
  if (!security.ok()) return security.status();
  absl::StatusOr<std::unique_ptr<JobClient>> client =
      JobClient::connect(address, std::chrono::seconds(5), *security);
  if (!client.ok()) return client.status();
  absl::StatusOr<v1::Job> job = (*client)->get(o.job);
  if (!job.ok()) return job.status();
  const nlohmann::json config = nlohmann::json::parse(job->config_json(), nullptr, false);
  if (!config.is_object()) {
    return absl::InternalError(absl::StrCat("--job: job ", o.job, " has an unreadable config"));
  }
  const nlohmann::json ckpt = config.value("checkpoint", nlohmann::json::object());
  const std::string root = ckpt.value("dir", std::string());
  if (root.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--job: job ", o.job, " writes no checkpoints (checkpoint.dir is not set)"));
  }
  absl::StatusOr<std::string> path = latest_job_checkpoint(root, o.job);
  if (!path.ok()) return path.status();
  o.checkpoint = *path;
  // The job's trainer checkpoints hold weights only; its tokenizer is the source model's.
  const nlohmann::json model = config.value("model", nlohmann::json::object());
  if (o.tokenizer.empty()) o.tokenizer = model.value("checkpoint", std::string());
  return absl::OkStatus();
#else
  (void)o;
  return absl::UnimplementedError(
      "--job: this fp8rl was built without the services; use --checkpoint DIR");
#endif
}

absl::Status run_export(ExportOptions& o) {
  std::error_code ec;
  if (stdfs::exists(o.out, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("--out: ", o.out, " already exists (export never overwrites)"));
  }
  const stdfs::path parent = stdfs::absolute(o.out, ec).parent_path();
  if (!stdfs::is_directory(parent, ec)) {
    return absl::NotFoundError(
        absl::StrCat("--out: parent folder ", parent.string(), " does not exist"));
  }
  if (!o.job.empty()) {
    if (absl::Status s = resolve_job(o); !s.ok()) return s;
  } else {
    if (!stdfs::is_directory(o.checkpoint, ec)) {
      return absl::NotFoundError(
          absl::StrCat("--checkpoint: ", o.checkpoint, " does not exist or is not a folder"));
    }
    if (o.tokenizer.empty()) o.tokenizer = o.checkpoint;
  }
  if (!o.tokenizer.empty() && !stdfs::is_directory(o.tokenizer, ec)) {
    return absl::NotFoundError(absl::StrCat("--tokenizer: ", o.tokenizer, " is not a folder"));
  }
  o.hf.side_files_dir = o.tokenizer;
  // FP8 export: load with FP8 linears, so a checkpoint that is FP8 already keeps its codes and
  // scales bit for bit; hf export: the fp32 master, rounded once to BF16.
  PrecisionPolicy policy;
  if (o.hf.format == model::ExportFormat::kFp8) policy.linear = Precision::kFP8;
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Load(o.checkpoint, policy);
  if (!m.ok()) {
    return absl::Status(
        m.status().code(),
        absl::StrCat(o.job.empty() ? "--checkpoint: " : "--job: ", m.status().message()));
  }
  absl::StatusOr<model::HfExportSummary> summary = model::export_hf_checkpoint(**m, o.out, o.hf);
  if (!summary.ok()) return summary.status();
  std::printf(
      "fp8rl export: %s -> %s (%s, %lld tensors, %.1f MiB in %lld shard%s; copied: %s)\n",
      o.checkpoint.c_str(), o.out.c_str(), o.hf.format == model::ExportFormat::kFp8 ? "fp8" : "hf",
      static_cast<long long>(summary->tensors),
      static_cast<double>(summary->total_bytes) / (1024.0 * 1024.0),
      static_cast<long long>(summary->shards), summary->shards == 1 ? "" : "s",
      summary->copied_files.empty() ? "none" : absl::StrJoin(summary->copied_files, ", ").c_str());
  return absl::OkStatus();
}

}  // namespace

int export_main(const std::vector<std::string>& argv) {
  absl::StatusOr<ExportOptions> options = parse_options(argv);
  if (!options.ok()) return usage_error(kName, std::string(options.status().message()));
  if (absl::Status s = run_export(*options); !s.ok()) {
    return failure(kName, std::string(s.message()));
  }
  return 0;
}

}  // namespace fp8rl::cli
