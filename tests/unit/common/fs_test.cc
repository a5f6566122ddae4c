// Atomic writes: complete output under the final name or nothing, and never a stray temp file.
#include "common/fs.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "tests/unit/common/temp_dir.h"

namespace fp8rl {
namespace {

using testing_util::TempDir;
namespace stdfs = std::filesystem;

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng() % 255 + 1);
  return out;
}

TEST(AtomicFs, WriteFileConcatenatesPiecesAndLeavesNoTemp) {
  TempDir tmp;
  const auto a = random_bytes(1000, 1);
  const auto b = random_bytes(77, 2);
  const std::string path = tmp.file("out.bin");
  ASSERT_TRUE(
      write_file_atomic(path, {std::span<const uint8_t>(a), {}, std::span<const uint8_t>(b)}).ok());
  absl::StatusOr<std::vector<uint8_t>> got = read_binary_file(path);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<uint8_t> want = a;
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(*got, want);
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"out.bin"});
  EXPECT_EQ(temp_path_for(path), path + ".tmp." + std::to_string(::getpid()));
}

TEST(AtomicFs, WriteFileReplacesExistingContent) {
  TempDir tmp;
  const std::string path = tmp.file("config.json");
  ASSERT_TRUE(write_file_atomic(path, std::string(5000, 'x')).ok());
  ASSERT_TRUE(write_file_atomic(path, "{\"a\": 1}").ok());
  EXPECT_EQ(*read_text_file(path), "{\"a\": 1}");
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"config.json"});
}

TEST(AtomicFs, WriteFileIntoMissingFolderFailsCleanly) {
  TempDir tmp;
  absl::Status s = write_file_atomic(tmp.file("no_such_dir/out.bin"), "data");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("no_such_dir"), std::string::npos) << s;
  EXPECT_TRUE(tmp.entries().empty());
}

TEST(AtomicFs, ReadMissingFileIsNotFound) {
  TempDir tmp;
  absl::StatusOr<std::string> got = read_text_file(tmp.file("absent.json"));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(got.status().message()).find("absent.json"), std::string::npos);
  EXPECT_FALSE(read_binary_file(tmp.path()).ok());  // a folder is not a file
}

TEST(AtomicFs, WriteDirCreatesThenReplacesOnlyOnSuccess) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  auto fill_with = [](const std::string& name, const std::string& text) {
    return [=](const std::string& d) { return write_file_atomic(d + "/" + name, text); };
  };
  ASSERT_TRUE(write_dir_atomic(dir, fill_with("a.txt", "first")).ok());
  EXPECT_EQ(*read_text_file(dir + "/a.txt"), "first");

  // A failing fill leaves the existing folder as it was and no temporary folder.
  absl::Status s = write_dir_atomic(dir, [](const std::string& d) {
    EXPECT_TRUE(write_file_atomic(d + "/b.txt", "half").ok());
    return absl::DataLossError("simulated failure");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(*read_text_file(dir + "/a.txt"), "first");
  EXPECT_FALSE(stdfs::exists(dir + "/b.txt"));
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"ckpt"});

  // A successful fill replaces the whole folder (the old file is gone).
  ASSERT_TRUE(write_dir_atomic(dir + "/", fill_with("c.txt", "second")).ok());
  EXPECT_FALSE(stdfs::exists(dir + "/a.txt"));
  EXPECT_EQ(*read_text_file(dir + "/c.txt"), "second");
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"ckpt"});
}

TEST(AtomicFs, WriteDirFailureLeavesNothingBehind) {
  TempDir tmp;
  const std::string dir = tmp.file("out");
  absl::Status s =
      write_dir_atomic(dir, [](const std::string&) { return absl::InternalError("boom"); });
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(tmp.entries().empty());
}

TEST(AtomicFs, WriteDirRejectsMissingParentAndExistingFile) {
  TempDir tmp;
  auto ok_fill = [](const std::string&) { return absl::OkStatus(); };
  absl::Status s = write_dir_atomic(tmp.file("a/b/c"), ok_fill);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(s.message()).find("parent folder"), std::string::npos) << s;
  ASSERT_TRUE(write_file_atomic(tmp.file("plain"), "x").ok());
  s = write_dir_atomic(tmp.file("plain"), ok_fill);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"plain"});
}

// The pid of a process that has exited and been reaped: no live process has it (until the kernel
// reuses it, which takes a full turn of the pid space).
long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return static_cast<long>(child);
}

void make_folder_with(const std::string& dir, const std::string& name, const std::string& text) {
  stdfs::create_directories(dir);
  ASSERT_TRUE(write_file_atomic(dir + "/" + name, text).ok());
}

TEST(AtomicFs, WriteDirRemovesDeadWritersTemporaryAndKeepsLiveOnes) {
  TempDir tmp;
  const std::string dir = tmp.file("step-4");
  const std::string dead = absl::StrCat(dir, ".tmp.", dead_pid());
  const std::string live = absl::StrCat(dir, ".tmp.", static_cast<long>(::getppid()));
  make_folder_with(dead, "model.safetensors", "cut off");
  make_folder_with(live, "model.safetensors", "still being written");
  ASSERT_TRUE(write_dir_atomic(dir, [](const std::string& d) {
                return write_file_atomic(d + "/a.txt", "new");
              }).ok());
  EXPECT_FALSE(stdfs::exists(dead));
  EXPECT_TRUE(stdfs::exists(live + "/model.safetensors"));
  EXPECT_EQ(*read_text_file(dir + "/a.txt"), "new");
}

TEST(AtomicFs, WriteDirPutsBackTheFolderADeadWriterMovedAside) {
  TempDir tmp;
  const std::string dir = tmp.file("export");
  const std::string old = absl::StrCat(dir, ".old.", dead_pid());
  make_folder_with(old, "a.txt", "previous");
  // The writer died between its renames: `dir` is missing and the old folder is aside. A failing
  // write puts the previous folder back and leaves it as it was.
  absl::Status s =
      write_dir_atomic(dir, [](const std::string&) { return absl::DataLossError("boom"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(*read_text_file(dir + "/a.txt"), "previous");
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"export"});

  // With `dir` present, a dead writer's old folder is only removed.
  const std::string old2 = absl::StrCat(dir, ".old.", dead_pid());
  make_folder_with(old2, "a.txt", "older");
  ASSERT_TRUE(write_dir_atomic(dir, [](const std::string& d) {
                return write_file_atomic(d + "/b.txt", "newest");
              }).ok());
  EXPECT_EQ(*read_text_file(dir + "/b.txt"), "newest");
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"export"});
}

TEST(AtomicFs, RemoveDeadTempDirsTakesOnlyDeadWritersFoldersWithThePrefix) {
  TempDir tmp;
  const long gone = dead_pid();
  const long alive = static_cast<long>(::getppid());
  make_folder_with(tmp.file(absl::StrCat("step-3.tmp.", gone)), "x", "cut");
  make_folder_with(tmp.file(absl::StrCat("step-4.tmp.", alive)), "x", "writing");
  make_folder_with(tmp.file(absl::StrCat("other-1.tmp.", gone)), "x", "not ours");
  make_folder_with(tmp.file("step-2"), "x", "complete");
  make_folder_with(tmp.file("step-7.tmp.notapid"), "x", "odd name");
  // A file temporary (another writer's, maybe on another host) is never touched.
  ASSERT_TRUE(write_file_atomic(tmp.file(absl::StrCat("step-5.safetensors.tmp.", gone)), "f").ok());

  const std::vector<std::string> removed = remove_dead_temp_dirs(tmp.path(), "step-");
  EXPECT_EQ(removed, std::vector<std::string>{tmp.file(absl::StrCat("step-3.tmp.", gone))});
  std::vector<std::string> want = {
      absl::StrCat("other-1.tmp.", gone), absl::StrCat("step-4.tmp.", alive), "step-2",
      absl::StrCat("step-5.safetensors.tmp.", gone), "step-7.tmp.notapid"};
  std::sort(want.begin(), want.end());
  std::vector<std::string> got = tmp.entries();
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  EXPECT_TRUE(remove_dead_temp_dirs(tmp.file("absent"), "step-").empty());

  // This process's own folder stays unless the caller says its writes are not under way.
  const std::string own = tmp.file(absl::StrCat("step-6.tmp.", static_cast<long>(::getpid())));
  make_folder_with(own, "x", "mine");
  EXPECT_TRUE(remove_dead_temp_dirs(tmp.path(), "step-").empty());
  EXPECT_EQ(remove_dead_temp_dirs(tmp.path(), "step-", /*own_are_stale=*/true),
            std::vector<std::string>{own});
}

}  // namespace
}  // namespace fp8rl
