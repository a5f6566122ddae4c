// Paths that arrive from outside (job configs submitted over REST or gRPC) are confined to folders
// the operator chose (the services' --data-root, --models-root, --datasets-root flags): a path is
// resolved first, symlinks and ".." included, and must then lie in its root. Nothing is opened or
// read here, so an error never carries a file's contents. See docs/design/services.md "Job paths".
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fp8rl {

struct PathRoot {
  std::string flag;  // the option that sets it ("--datasets-root"); names the root in errors
  std::string dir;   // absolute, or relative to the working directory; must exist
};

// The canonical form of `path` when it lies in `root` (root.dir itself or below it):
//  - a relative path is taken relative to root.dir;
//  - the existing part of the path is resolved through the file system (symlinks, ".."), a part
//    that does not exist yet (an output folder) lexically (std::filesystem::weakly_canonical).
// InvalidArgument naming `field` when the path is empty or resolves outside the root
// ("checkpoint.dir: '/etc/x' is outside --data-root (/srv/fp8rl)"), or when the root itself does
// not exist ("--data-root: '/nope' does not exist"). A path component that appears later (a
// symlink created after the check) is not covered: roots should not be writable by job users.
absl::StatusOr<std::string> resolve_under_root(std::string_view field, const std::string& path,
                                               const PathRoot& root);

}  // namespace fp8rl
