// The same-host file of a version: written once by weight sync, read by workers on its host (see
// same_host.h).
#include "services/weight_sync/same_host.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fp8rl::weight_sync {
namespace {

std::string errno_text(int e) { return std::string(std::strerror(e)); }

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

// Closes a descriptor on every path out of a function.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// A fresh name `dir`/<prefix><pid>-<version>-<n> (n counts up per process).
std::string fresh_name(const std::string& dir, std::string_view prefix, int64_t version) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(dir, "/", std::string(prefix), ::getpid(), "-", version, "-",
                      counter.fetch_add(1));
}

// Creates `path` (O_EXCL, 0600) holding `pieces` one after the other; unlinks it on failure.
absl::Status write_new_file(const std::string& path,
                            std::span<const std::span<const char>> pieces) {
  Fd f;
  f.fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (f.fd < 0) {
    return absl::UnavailableError(absl::StrCat("same-host file ", path, ": ", errno_text(errno)));
  }
  uint64_t total = 0;
  for (std::span<const char> piece : pieces) {
    uint64_t done = 0;
    while (done < piece.size()) {
      const ssize_t n = ::write(f.fd, piece.data() + done, piece.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int e = n < 0 ? errno : ENOSPC;
        ::unlink(path.c_str());
        return absl::UnavailableError(absl::StrCat("same-host file ", path, ": writing at ",
                                                   total + done, ": ", errno_text(e)));
      }
      done += static_cast<uint64_t>(n);
    }
    total += piece.size();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SameHostMode> parse_same_host_mode(std::string_view value, std::string_view field) {
  if (value == "off") return SameHostMode::kOff;
  if (value == "auto") return SameHostMode::kAuto;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(field), ": must be off or auto, got '", std::string(value), "'"));
}

std::string_view same_host_mode_name(SameHostMode mode) {
  return mode == SameHostMode::kAuto ? "auto" : "off";
}

std::string local_host_id() {
  const std::string boot = read_first_line("/proc/sys/kernel/random/boot_id");
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  if (boot.empty() && host[0] == '\0') return "";
  return absl::StrCat(boot, "/", host);
}

absl::StatusOr<std::shared_ptr<const SameHostFile>> SameHostFile::write(const std::string& dir,
                                                                        int64_t version,
                                                                        std::string_view payload) {
  const std::string path = fresh_name(dir, "fp8rl-weights-", version);
  const std::span<const char> piece(payload.data(), payload.size());
  if (absl::Status s = write_new_file(path, std::span<const std::span<const char>>(&piece, 1));
      !s.ok()) {
    return s;
  }
  return std::shared_ptr<const SameHostFile>(new SameHostFile(path, version, payload.size()));
}

absl::StatusOr<std::shared_ptr<const SameHostFile>> SameHostFile::adopt(const std::string& dir,
                                                                        int64_t version,
                                                                        const std::string& path,
                                                                        uint64_t bytes) {
  const std::string mine = fresh_name(dir, "fp8rl-weights-", version);
  if (::rename(path.c_str(), mine.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("same-host file ", path, ": renaming to ", mine, ": ", errno_text(errno)));
  }
  return std::shared_ptr<const SameHostFile>(new SameHostFile(mine, version, bytes));
}

absl::StatusOr<std::string> write_upload_file(const std::string& dir, int64_t version,
                                              std::span<const std::span<const char>> pieces) {
  std::string path = fresh_name(dir, "fp8rl-upload-", version);
  if (absl::Status s = write_new_file(path, pieces); !s.ok()) return s;
  return path;
}

bool is_upload_file_path(const std::string& dir, const std::string& path) {
  const std::filesystem::path p(path);
  return !dir.empty() && p.is_absolute() && p.parent_path() == std::filesystem::path(dir) &&
         p.filename().string().rfind("fp8rl-upload-", 0) == 0 && p.lexically_normal() == p;
}

SameHostFile::~SameHostFile() { ::unlink(path_.c_str()); }

int remove_orphaned_same_host_files(const std::string& dir) {
  std::error_code ec;
  int removed = 0;
  for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::string_view prefix;
    for (std::string_view p : {"fp8rl-weights-", "fp8rl-upload-"}) {
      if (name.rfind(p, 0) == 0) prefix = p;
    }
    if (prefix.empty()) continue;
    const size_t dash = name.find('-', prefix.size());
    int64_t pid = 0;
    if (dash == std::string::npos ||
        !absl::SimpleAtoi(name.substr(prefix.size(), dash - prefix.size()), &pid) || pid <= 0) {
      continue;
    }
    if (std::filesystem::exists(absl::StrCat("/proc/", pid), ec)) continue;  // still running
    if (std::filesystem::remove(e.path(), ec)) ++removed;
  }
  return removed;
}

absl::StatusOr<std::shared_ptr<const SameHostFile>> SameHostFiles::file_for(
    int64_t version, std::string_view payload) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!cleaned_) {
    cleaned_ = true;
    remove_orphaned_same_host_files(dir_);
  }
  if (newest_ != nullptr && newest_->version() == version && newest_->bytes() == payload.size()) {
    return newest_;
  }
  absl::StatusOr<std::shared_ptr<const SameHostFile>> file =
      SameHostFile::write(dir_, version, payload);
  if (!file.ok()) return file.status();
  if (after_write_) after_write_((*file)->path());
  // Only a newer version replaces the one held (a stream still sending an older version holds
  // its own reference).
  if (newest_ == nullptr || newest_->version() < version) newest_ = *file;
  return file;
}

absl::StatusOr<std::shared_ptr<const SameHostFile>> SameHostFiles::adopt(int64_t version,
                                                                         const std::string& path,
                                                                         uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<std::shared_ptr<const SameHostFile>> file =
      SameHostFile::adopt(dir_, version, path, bytes);
  if (!file.ok()) return file.status();
  if (newest_ == nullptr || newest_->version() < version) newest_ = *file;
  return file;
}

void SameHostFiles::set_after_write(std::function<void(const std::string& path)> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  after_write_ = std::move(hook);
}

absl::Status read_same_host_file(
    const std::string& path, PayloadAssembler* assembler, uint64_t total_bytes,
    uint64_t piece_bytes,
    const std::function<void(uint64_t offset, std::span<const char> bytes)>& on_bytes) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("same-host file ", path, ": cannot open: ", errno_text(errno)));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != total_bytes) {
    return absl::UnavailableError(absl::StrCat("same-host file ", path, ": ", st.st_size,
                                               " bytes, the manifest says ", total_bytes));
  }
  const int64_t version = assembler->version();
  for (uint64_t offset = 0; offset < total_bytes;) {
    const uint64_t n = std::min(piece_bytes, total_bytes - offset);
    absl::StatusOr<char*> at = assembler->chunk_target(version, offset, n);
    if (!at.ok()) return at.status();
    uint64_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(f.fd, *at + got, n - got, static_cast<off_t>(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        assembler->reset();
        return absl::UnavailableError(absl::StrCat("same-host file ", path, ": reading at ",
                                                   offset + got, ": ",
                                                   r < 0 ? errno_text(errno) : "end of file"));
      }
      got += static_cast<uint64_t>(r);
    }
    if (absl::Status s = assembler->commit_chunk(); !s.ok()) return s;
    if (on_bytes) on_bytes(offset, std::span<const char>(*at, n));
    offset += n;
  }
  return absl::OkStatus();
}

}  // namespace fp8rl::weight_sync
