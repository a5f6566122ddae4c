// Atomic writes: complete output under the final name or nothing, and never a stray temp file.
#include "common/fs.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

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

}  // namespace
}  // namespace fp8rl
