// Atomic file and folder writes: the rename-at-the-end discipline every fp8rl output follows.
#include "common/fs.h"

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fp8rl {
namespace {

namespace stdfs = std::filesystem;

absl::Status errno_error(const std::string& what, const std::string& path, int err) {
  return absl::Status(err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kInternal,
                      absl::StrCat(what, " ", path, ": ", std::strerror(err)));
}

absl::Status fs_error(const std::string& what, const std::string& path, const std::error_code& ec) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", ec.message()));
}

// Reads a whole regular file into a byte container (std::string or std::vector<uint8_t>).
template <typename Container>
absl::StatusOr<Container> read_whole(const std::string& path) {
  std::error_code ec;
  const stdfs::file_status st = stdfs::status(path, ec);
  if (ec || !stdfs::exists(st)) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": no such file"));
  }
  if (!stdfs::is_regular_file(st)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": not a regular file"));
  }
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return errno_error("cannot open", path, errno);
  Container out;
  const uintmax_t size = stdfs::file_size(path, ec);
  if (ec) {
    std::fclose(f);
    return fs_error("cannot stat", path, ec);
  }
  out.resize(static_cast<size_t>(size));
  const size_t got = size > 0 ? std::fread(out.data(), 1, out.size(), f) : 0;
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed || got != out.size()) {
    return absl::InternalError(
        absl::StrCat("cannot read ", path, ": short read (", got, " of ", size, " bytes)"));
  }
  return out;
}

// The pid in "<base><marker><pid>" (marker ".tmp." or ".old."), or 0 when `name` is not of that
// form.
long writer_pid(std::string_view name, std::string_view base, std::string_view marker) {
  if (!name.starts_with(base)) return 0;
  name.remove_prefix(base.size());
  if (!name.starts_with(marker)) return 0;
  name.remove_prefix(marker.size());
  int64_t pid = 0;
  if (name.empty() || !absl::SimpleAtoi(absl::string_view(name.data(), name.size()), &pid) ||
      pid <= 0)
    return 0;
  return static_cast<long>(pid);
}

// True when no process with this pid exists on this host (EPERM means it exists).
bool writer_is_dead(long pid) {
  return pid != static_cast<long>(::getpid()) && ::kill(static_cast<pid_t>(pid), 0) != 0 &&
         errno == ESRCH;
}

// write_dir_atomic's cleanup of dead writers of the same target (see fs.h).
void recover_dead_writers(const std::string& target) {
  const stdfs::path p(target);
  const stdfs::path parent = p.has_parent_path() ? p.parent_path() : stdfs::path(".");
  const std::string base = p.filename().string();
  std::error_code ec;
  std::vector<stdfs::path> tmps, olds;
  for (stdfs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (long pid = writer_pid(name, base, ".tmp."); pid != 0 && writer_is_dead(pid)) {
      tmps.push_back(it->path());
    } else if (long pid = writer_pid(name, base, ".old."); pid != 0 && writer_is_dead(pid)) {
      olds.push_back(it->path());
    }
  }
  for (const stdfs::path& t : tmps) remove_all_quietly(t.string());
  for (const stdfs::path& o : olds) {
    std::error_code e;
    if (!stdfs::exists(target, e)) {
      stdfs::rename(o, target, e);
      if (!e) continue;
    }
    remove_all_quietly(o.string());
  }
}

}  // namespace

std::vector<std::string> remove_dead_temp_dirs(const std::string& folder, std::string_view prefix,
                                               bool own_are_stale) {
  const long self = static_cast<long>(::getpid());
  std::vector<std::string> removed;
  std::error_code ec;
  for (stdfs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos) continue;
    const long pid = writer_pid(name, std::string_view(name).substr(0, at), ".tmp.");
    std::error_code e;
    if (pid == 0 || !(writer_is_dead(pid) || (own_are_stale && pid == self))) continue;
    if (!it->is_directory(e) || e) continue;
    stdfs::remove_all(it->path(), e);
    if (!e) removed.push_back(it->path().string());
  }
  return removed;
}

std::string temp_path_for(const std::string& path) {
  std::string base = path;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return absl::StrCat(base, ".tmp.", static_cast<long>(::getpid()));
}

absl::StatusOr<std::string> read_text_file(const std::string& path) {
  return read_whole<std::string>(path);
}

absl::StatusOr<std::vector<uint8_t>> read_binary_file(const std::string& path) {
  return read_whole<std::vector<uint8_t>>(path);
}

absl::Status write_file_atomic(const std::string& path,
                               const std::vector<std::span<const uint8_t>>& pieces) {
  const std::string tmp = temp_path_for(path);
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return errno_error("cannot create", tmp, errno);
  for (const auto& piece : pieces) {
    if (piece.empty()) continue;
    if (std::fwrite(piece.data(), 1, piece.size(), f) != piece.size()) {
      const int err = errno;
      std::fclose(f);
      std::remove(tmp.c_str());
      return errno_error("cannot write", tmp, err);
    }
  }
  if (std::fclose(f) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return errno_error("cannot write", tmp, err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return errno_error(absl::StrCat("cannot rename ", tmp, " to"), path, err);
  }
  return absl::OkStatus();
}

absl::Status write_file_atomic(const std::string& path, std::string_view content) {
  const auto* p = reinterpret_cast<const uint8_t*>(content.data());
  return write_file_atomic(path, {std::span<const uint8_t>(p, content.size())});
}

absl::Status copy_file(const std::string& from, const std::string& to) {
  std::error_code ec;
  stdfs::copy_file(from, to, stdfs::copy_options::overwrite_existing, ec);
  if (ec) return fs_error(absl::StrCat("cannot copy ", from, " to"), to, ec);
  return absl::OkStatus();
}

void remove_all_quietly(const std::string& path) {
  std::error_code ec;
  stdfs::remove_all(path, ec);
}

absl::Status write_dir_atomic(const std::string& dir,
                              const std::function<absl::Status(const std::string& tmp_dir)>& fill) {
  std::error_code ec;
  std::string target = dir;
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  const stdfs::path parent = stdfs::path(target).parent_path();
  if (!parent.empty() && !stdfs::is_directory(parent, ec)) {
    return absl::NotFoundError(absl::StrCat("cannot write ", target, ": parent folder ",
                                            parent.string(), " does not exist"));
  }
  recover_dead_writers(target);
  const bool replacing = stdfs::exists(target, ec);
  if (replacing && !stdfs::is_directory(target, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", target, ": it exists and is not a folder"));
  }

  const std::string tmp = temp_path_for(target);
  remove_all_quietly(tmp);  // a leftover of an earlier process with the same pid
  if (!stdfs::create_directory(tmp, ec) || ec) {
    return fs_error("cannot create folder", tmp, ec);
  }
  if (absl::Status s = fill(tmp); !s.ok()) {
    remove_all_quietly(tmp);
    return s;
  }

  if (!replacing) {
    stdfs::rename(tmp, target, ec);
    if (ec) {
      remove_all_quietly(tmp);
      return fs_error(absl::StrCat("cannot rename ", tmp, " to"), target, ec);
    }
    return absl::OkStatus();
  }
  // Move the old folder aside, move the new one in, then delete the old one; put it back if the
  // second rename fails.
  const std::string old = absl::StrCat(target, ".old.", static_cast<long>(::getpid()));
  remove_all_quietly(old);
  stdfs::rename(target, old, ec);
  if (ec) {
    remove_all_quietly(tmp);
    return fs_error(absl::StrCat("cannot move aside existing"), target, ec);
  }
  stdfs::rename(tmp, target, ec);
  if (ec) {
    std::error_code restore_ec;
    stdfs::rename(old, target, restore_ec);
    remove_all_quietly(tmp);
    return fs_error(absl::StrCat("cannot rename ", tmp, " to"), target, ec);
  }
  remove_all_quietly(old);
  return absl::OkStatus();
}

}  // namespace fp8rl
