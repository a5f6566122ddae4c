// Path confinement to operator roots (see path_roots.h).
#include "common/path_roots.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace fp8rl {
namespace {

namespace fs = std::filesystem;

// True when every component of `root` is the same leading component of `path` (both canonical).
bool is_within(const fs::path& path, const fs::path& root) {
  auto p = path.begin();
  for (auto r = root.begin(); r != root.end(); ++r, ++p) {
    if (r->empty()) continue;  // a trailing separator of the root
    if (p == path.end() || *p != *r) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> resolve_under_root(std::string_view field, const std::string& path,
                                               const PathRoot& root) {
  const std::string name(field);
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": empty path"));
  std::error_code ec;
  const fs::path root_dir =
      fs::canonical(root.dir.empty() ? fs::path(".") : fs::path(root.dir), ec);
  if (ec || !fs::is_directory(root_dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(root.flag, ": '", root.dir, "' does not exist or is not a folder"));
  }
  const fs::path given(path);
  const fs::path joined = given.is_absolute() ? given : root_dir / given;
  // weakly_canonical normalizes the part after the first missing component lexically, so
  // "root/missing/../link/x" comes back as "root/link/x" with `link` unresolved; resolving again
  // until nothing changes follows such symlinks too (and the loop bound stops symlink cycles).
  fs::path resolved = joined;
  for (int pass = 0;; ++pass) {
    fs::path next = fs::weakly_canonical(resolved, ec);
    if (ec || pass == 40) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": '", path, "' cannot be resolved: ", ec ? ec.message() : "too many symlinks"));
    }
    if (next == resolved) break;
    resolved = std::move(next);
  }
  if (!is_within(resolved, root_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": '", path, "' is outside ", root.flag, " (", root_dir.string(), ")"));
  }
  return resolved.string();
}

}  // namespace fp8rl
