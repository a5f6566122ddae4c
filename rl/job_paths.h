// Every path of a job config, confined to the folder the operator configured for its kind:
//   checkpoint.dir                          -> data root     (--data-root; outputs)
//   model.checkpoint, model.init.config     -> models root   (--models-root)
//   task.params.train_path / val_path       -> datasets root (--datasets-root)
// The coordinator resolves them at submission (REST 400 / gRPC INVALID_ARGUMENT naming the
// field) and stores the resolved paths, so services that later open them get canonical paths
// inside the roots. A new path field is added to job_path_fields and nowhere else.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "rl/job_config.h"

namespace fp8rl::rl {

struct JobPathRoots {
  std::string data_root;  // absolute, or relative to the working directory; must exist
  std::string models_root;
  std::string datasets_root;
};

enum class PathRootKind { kData, kModels, kDatasets };

struct JobPathField {
  const char* field;  // "task.params.train_path"
  PathRootKind root;
  std::string* path;  // into the config; empty: field not set
};

// The path fields of `config` (pointers into it), in config order.
std::vector<JobPathField> job_path_fields(JobConfig& config);

// Resolves every non-empty path field against its root (common/path_roots.h) and rewrites it to
// the resolved absolute path. InvalidArgument naming the first field outside its root; the
// files are not opened.
absl::Status resolve_job_paths(JobConfig& config, const JobPathRoots& roots);

}  // namespace fp8rl::rl
