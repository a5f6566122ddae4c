// Same-host shortcut (docs/design/weight-sync.md "Same-host mapping"): a generation worker on
// weight sync's own host reads a stored version from a file weight sync writes once into a shared
// tmpfs (/dev/shm by default) instead of receiving it chunk by chunk over TCP. Every worker on the
// host reads the same file; the bytes land in the worker's receive buffer through the same
// PayloadAssembler checks as chunks from the stream (order, size, CRC-32C per tensor), so a
// corrupted or truncated file is refused exactly as a corrupted stream is.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/weight_sync/payload.h"

namespace fp8rl::weight_sync {

// Whether weight sync offers (or a worker asks for) the same-host file: off, or auto (used where
// weight sync and the worker report the same local_host_id()).
enum class SameHostMode { kOff, kAuto };
// "off" / "auto"; InvalidArgument "<field>: must be off or auto, got 'x'" otherwise.
absl::StatusOr<SameHostMode> parse_same_host_mode(std::string_view value, std::string_view field);
std::string_view same_host_mode_name(SameHostMode mode);

// This host's identity for the shortcut: the kernel's boot id and the hostname ("<boot
// id>/<host>"). Two processes with the same id run on one kernel; whether they also share the
// directory the file is written to is found out by opening it (a worker that cannot falls back to
// TCP). Empty when neither can be read (then nothing is offered or asked for).
std::string local_host_id();

// One version's payload in a file of its own under a shared directory, written whole before
// anyone is told its path and never written again; the file is unlinked when the last holder
// lets go (a reader that opened it keeps its bytes until it closes it).
class SameHostFile {
 public:
  // Creates `dir`/fp8rl-weights-<pid>-<version>-<n> (O_EXCL, mode 0600) holding `payload`.
  // Unavailable naming the path and errno when it cannot be created or written (nothing is left
  // behind).
  static absl::StatusOr<std::shared_ptr<const SameHostFile>> write(const std::string& dir,
                                                                   int64_t version,
                                                                   std::string_view payload);
  // Takes over `path` (a complete file of `bytes` bytes under `dir`, e.g. a same-host upload):
  // renames it to a name as write() gives, so that it is unlinked as one of this process's files.
  // Unavailable naming both paths when the rename fails (the file is left where it was).
  static absl::StatusOr<std::shared_ptr<const SameHostFile>> adopt(const std::string& dir,
                                                                   int64_t version,
                                                                   const std::string& path,
                                                                   uint64_t bytes);
  ~SameHostFile();  // unlinks the file
  SameHostFile(const SameHostFile&) = delete;
  SameHostFile& operator=(const SameHostFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t version() const { return version_; }
  uint64_t bytes() const { return bytes_; }

 private:
  SameHostFile(std::string path, int64_t version, uint64_t bytes)
      : path_(std::move(path)), version_(version), bytes_(bytes) {}
  const std::string path_;
  const int64_t version_;
  const uint64_t bytes_;
};

// Weight sync's side: the file of each version it offers, written by the first stream that asks
// and shared by every other. Holds the newest version's file itself (a worker that subscribes
// later reads the same file); an older one lives while a stream that offered it still holds it.
class SameHostFiles {
 public:
  explicit SameHostFiles(std::string dir) : dir_(std::move(dir)) {}

  // The file holding `payload` as `version` (written once per version; concurrent callers wait
  // for the first). Errors as SameHostFile::write.
  absl::StatusOr<std::shared_ptr<const SameHostFile>> file_for(int64_t version,
                                                               std::string_view payload);

  // Makes `path` (a same-host upload of `version`, verified) the file offered for `version`
  // (SameHostFile::adopt), so the workers read the uploader's file and nothing is written again.
  absl::StatusOr<std::shared_ptr<const SameHostFile>> adopt(int64_t version,
                                                            const std::string& path,
                                                            uint64_t bytes);

  // Tests only: called with each file's path after it was written and before it is offered.
  void set_after_write(std::function<void(const std::string& path)> hook);
  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
  // Guards newest_ and after_write_; held while the newest version's file is written, so a
  // second stream waits for it instead of writing its own.
  std::mutex mu_;
  std::shared_ptr<const SameHostFile> newest_;  // guarded by mu_
  bool cleaned_ = false;  // guarded by mu_; orphaned files removed (first file_for)
  std::function<void(const std::string& path)> after_write_;  // guarded by mu_
};

// Removes the same-host files under `dir` left by processes that no longer run (weight sync's
// fp8rl-weights-<pid>-* and uploaders' fp8rl-upload-<pid>-*: a killed process cannot unlink its
// files; /proc/<pid> of the name's pid is gone). Files of running processes are left alone.
// Returns how many were removed. SameHostFiles calls it once, before writing its first file.
int remove_orphaned_same_host_files(const std::string& dir);

// An uploader's side of a same-host upload: writes the tensors' bytes, in order (the payload of
// their manifest), into a new file `dir`/fp8rl-upload-<pid>-<version>-<n> (O_EXCL, mode 0600) and
// returns its path. Unavailable naming the path and errno when it cannot be created or written
// (nothing is left behind).
absl::StatusOr<std::string> write_upload_file(const std::string& dir, int64_t version,
                                              std::span<const std::span<const char>> pieces);

// Whether `path` names a same-host upload file directly under `dir` (what weight sync accepts
// in a MappedUpload: no other file of the host is read on an uploader's word).
bool is_upload_file_path(const std::string& dir, const std::string& path);

// A worker's side: reads `path` into `assembler` (begun with begin_into for the version's
// manifest) in pieces of `piece_bytes`, each through chunk_target / commit_chunk, so every tensor's
// CRC-32C is checked as its last byte lands; `on_bytes` (may be empty) sees each verified piece.
// Unavailable naming the path when the file cannot be opened or is not exactly the manifest's
// total_bytes long (a reader that could not map it: fall back to the stream); the assembler's
// DataLoss for a CRC mismatch. The assembler is complete after OK.
absl::Status read_same_host_file(
    const std::string& path, PayloadAssembler* assembler, uint64_t total_bytes,
    uint64_t piece_bytes,
    const std::function<void(uint64_t offset, std::span<const char> bytes)>& on_bytes);

}  // namespace fp8rl::weight_sync
