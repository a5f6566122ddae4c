// Whole-file reads and atomic file/folder writes: outputs appear complete under their final name
// or not at all (write to "<path>.tmp.<pid>", rename at the end, clean up on failure).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp8rl {

// "<path>.tmp.<pid>": the temporary name an atomic write of `path` uses (same folder, so the final
// rename never crosses file systems).
std::string temp_path_for(const std::string& path);

absl::StatusOr<std::string> read_text_file(const std::string& path);
absl::StatusOr<std::vector<uint8_t>> read_binary_file(const std::string& path);

// Writes the concatenation of `pieces` to `path` atomically. An existing file is replaced only
// after the new content is fully written; on failure nothing is left behind.
absl::Status write_file_atomic(const std::string& path,
                               const std::vector<std::span<const uint8_t>>& pieces);
absl::Status write_file_atomic(const std::string& path, std::string_view content);

// Copies a regular file (not atomically: use inside write_dir_atomic).
absl::Status copy_file(const std::string& from, const std::string& to);

// Builds a folder atomically: `fill` populates a fresh temporary folder "<dir>.tmp.<pid>", which
// then replaces `dir` (an existing folder is removed only after the new one is complete). If
// `fill` fails, the temporary folder is removed and `dir` is untouched. `dir`'s parent must exist.
// Leftovers of an earlier writer of the same `dir` that died (its pid is not a live process on
// this host) are cleaned up first: its "<dir>.tmp.<pid>" is removed, and its "<dir>.old.<pid>"
// (the previous folder, moved aside by a writer killed between its two renames) is put back as
// `dir` when `dir` is missing, removed otherwise.
absl::Status write_dir_atomic(const std::string& dir,
                              const std::function<absl::Status(const std::string& tmp_dir)>& fill);

// Removes the temporary folders "<prefix>*.tmp.<pid>" directly inside `folder` whose writer is
// dead (no live process with that pid on this host), left by an atomic folder write that was cut
// off (killed, or on a disk that turned read-only). With `own_are_stale`, this process's own such
// folders go too (for a caller that knows none of its writes with that prefix is under way).
// Files are never touched (other writers' file temporaries may belong to processes this host
// cannot see), nor folders of other live pids. Returns the paths removed; anything that cannot be
// listed or removed is skipped (best effort).
std::vector<std::string> remove_dead_temp_dirs(const std::string& folder, std::string_view prefix,
                                               bool own_are_stale = false);

// Removes a file or folder tree, ignoring errors (cleanup paths).
void remove_all_quietly(const std::string& path);

}  // namespace fp8rl
