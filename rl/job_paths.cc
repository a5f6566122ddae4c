// Confines a job config's paths to the operator's roots (see job_paths.h).
#include "rl/job_paths.h"

#include "common/path_roots.h"

namespace fp8rl::rl {

std::vector<JobPathField> job_path_fields(JobConfig& c) {
  return {
      {"model.checkpoint", PathRootKind::kModels, &c.model.checkpoint},
      {"model.init.config", PathRootKind::kModels, &c.model.init_config_path},
      {"task.params.train_path", PathRootKind::kDatasets, &c.task.train_path},
      {"task.params.val_path", PathRootKind::kDatasets, &c.task.val_path},
      {"checkpoint.dir", PathRootKind::kData, &c.checkpoint.dir},
  };
}

absl::Status resolve_job_paths(JobConfig& config, const JobPathRoots& roots) {
  for (const JobPathField& f : job_path_fields(config)) {
    if (f.path->empty()) continue;
    PathRoot root;
    switch (f.root) {
      case PathRootKind::kData:
        root = {"--data-root", roots.data_root};
        break;
      case PathRootKind::kModels:
        root = {"--models-root", roots.models_root};
        break;
      case PathRootKind::kDatasets:
        root = {"--datasets-root", roots.datasets_root};
        break;
    }
    absl::StatusOr<std::string> resolved = resolve_under_root(f.field, *f.path, root);
    if (!resolved.ok()) return resolved.status();
    *f.path = *resolved;
  }
  return absl::OkStatus();
}

}  // namespace fp8rl::rl
