// A main for the fuzz targets when no fuzzing engine is linked (the default GCC build and CI):
// runs LLVMFuzzerTestOneInput once on every file named on the command line, descending into
// folders, so ctest replays the seed corpus and any saved crash input under the sanitizers the
// build uses. A target signals a bug by crashing or aborting; this program exits 0 after the
// last input, and 1 when an argument cannot be read.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool run_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz replay: cannot read %s\n", path.c_str());
    return false;
  }
  // A heap copy of exactly `size` bytes, so AddressSanitizer sees reads past the end.
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(copy.data(), copy.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int inputs = 0;
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::recursive_directory_iterator(arg)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());  // a stable order for reproducible runs
      for (const auto& file : files) {
        ok = run_file(file) && ok;
        ++inputs;
      }
    } else {
      ok = run_file(arg) && ok;
      ++inputs;
    }
  }
  if (inputs == 0) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
    return 1;
  }
  std::printf("fuzz replay: %d inputs run\n", inputs);
  return ok ? 0 : 1;
}
