// Safetensors round trips for every dtype on random data, and one test per malformed-file case:
// each must fail with an error naming the file (and the tensor where there is one).
#include "common/safetensors.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <random>

#include "common/fs.h"
#include "tests/unit/common/f16_reference.h"
#include "tests/unit/common/temp_dir.h"

namespace fp8rl {
namespace {

using testing_util::TempDir;

std::vector<uint8_t> random_bytes(size_t n, std::mt19937& rng) {
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng() % 255 + 1);
  return out;
}

// Random finite, non-zero values in dtype d (NaN codes avoided so decoded values compare).
std::vector<uint8_t> random_float_bytes(DType d, int64_t n, std::mt19937& rng,
                                        std::vector<float>* decoded) {
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<uint8_t> bytes(static_cast<size_t>(n * dtype_size(d)));
  decoded->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float x = dist(rng);
    if (x == 0.0f) x = 0.5f;
    switch (d) {
      case DType::kF32:
        std::memcpy(&bytes[4 * i], &x, 4);
        (*decoded)[i] = x;
        break;
      case DType::kF64: {
        const double v = static_cast<double>(x) * 1.0000001;
        std::memcpy(&bytes[8 * i], &v, 8);
        (*decoded)[i] = static_cast<float>(v);
        break;
      }
      case DType::kF16: {
        // x rounded to F16 by dropping mantissa bits (a random F16 code near x; exponents below
        // F16's range become subnormals or zero, replaced by 1.0), decoded by the reference.
        const uint32_t f = std::bit_cast<uint32_t>(x);
        const int exponent = static_cast<int>((f >> 23) & 0xFF) - 127 + 15;
        uint16_t h = 0x3C00;  // 1.0
        if (exponent > 0 && exponent < 31) {
          h = static_cast<uint16_t>(((f >> 16) & 0x8000u) |
                                    (static_cast<uint32_t>(exponent) << 10) | ((f >> 13) & 0x3FFu));
        }
        std::memcpy(&bytes[2 * i], &h, 2);
        (*decoded)[i] = testing_util::f16_reference(h);
        break;
      }
      case DType::kBF16: {
        const uint16_t hi = static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16);
        std::memcpy(&bytes[2 * i], &hi, 2);
        (*decoded)[i] = std::bit_cast<float>(static_cast<uint32_t>(hi) << 16);
        break;
      }
      case DType::kF8E4M3: {
        uint8_t code = static_cast<uint8_t>(rng() % 256);
        if ((code & 0x7F) == 0x7F || code == 0 || code == 0x80) code = 0x3A;
        bytes[i] = code;
        (*decoded)[i] = e4m3_to_f32(code);
        break;
      }
      default:
        break;
    }
  }
  return bytes;
}

// A safetensors file from a header text and a data section, with an optional wrong length field.
void write_raw(const std::string& path, const std::string& header, size_t data_size,
               int64_t length_override = -1) {
  std::string out(8, '\0');
  const uint64_t len = length_override >= 0 ? static_cast<uint64_t>(length_override)
                                            : static_cast<uint64_t>(header.size());
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xFF);
  out += header;
  out += std::string(data_size, '\x11');
  ASSERT_TRUE(write_file_atomic(path, out).ok());
}

// Expects Open to fail with a message containing every one of `needles` and the file path.
void expect_open_error(const std::string& path, const std::vector<std::string>& needles) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  const std::string msg(f.status().message());
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
}

TEST(Safetensors, RoundTripsEveryDtypeOnRandomData) {
  TempDir tmp;
  std::mt19937 rng(1234);
  const std::vector<DType> all = {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3,
                                  DType::kF64, DType::kI64, DType::kI32,  DType::kI16,
                                  DType::kI8,  DType::kU8,  DType::kBool};
  SafetensorsWriter w;
  std::map<std::string, std::vector<uint8_t>> want_bytes;
  std::map<std::string, std::vector<float>> want_f32;
  std::map<std::string, std::vector<int64_t>> want_shape;
  int k = 0;
  for (DType d : all) {
    const std::vector<int64_t> shape = {3 + k % 4, 5 + k};
    const int64_t n = shape[0] * shape[1];
    const std::string name = "t." + std::string(dtype_name(d)) + ".weight";
    std::vector<uint8_t> bytes;
    if (is_float_dtype(d)) {
      bytes = random_float_bytes(d, n, rng, &want_f32[name]);
    } else if (d == DType::kBool) {
      bytes.resize(n);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng() % 2);
    } else {
      bytes = random_bytes(static_cast<size_t>(n * dtype_size(d)), rng);
    }
    want_bytes[name] = bytes;
    want_shape[name] = shape;
    ASSERT_TRUE(w.add(name, d, shape, bytes).ok());
    ++k;
  }
  ASSERT_TRUE(w.add("scalar", DType::kF32, {}, random_bytes(4, rng)).ok());
  ASSERT_TRUE(w.add("empty", DType::kBF16, {0, 7}, {}).ok());
  w.set_metadata("format", "pt");
  w.set_metadata("note", "fp8rl test");
  const std::string path = tmp.file("model.safetensors");
  ASSERT_TRUE(w.write(path).ok());
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"model.safetensors"});

  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->names().size(), all.size() + 2);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "fp8rl test");
  for (DType d : all) {
    const std::string name = "t." + std::string(dtype_name(d)) + ".weight";
    absl::StatusOr<TensorInfo> info = f->info(name);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->dtype, d);
    EXPECT_EQ(info->shape, want_shape[name]);
    EXPECT_EQ(*f->raw(name), want_bytes[name]) << name;
    absl::StatusOr<std::vector<float>> values = f->read_f32(name);
    if (is_float_dtype(d)) {
      ASSERT_TRUE(values.ok()) << values.status();
      EXPECT_EQ(*values, want_f32[name]) << name;
    } else {
      ASSERT_FALSE(values.ok());
      EXPECT_NE(std::string(values.status().message()).find(name), std::string::npos);
    }
  }
  EXPECT_EQ(f->info("scalar")->numel(), 1);
  EXPECT_EQ(f->info("empty")->nbytes(), 0);
  EXPECT_TRUE(f->raw("empty")->empty());
  EXPECT_EQ(f->info("absent").status().code(), absl::StatusCode::kNotFound);
}

TEST(Safetensors, WriterAlignsHeaderAndIsDeterministic) {
  TempDir tmp;
  std::mt19937 rng(5);
  const auto a = random_bytes(4 * 6, rng);
  const auto b = random_bytes(2 * 3, rng);
  SafetensorsWriter w1, w2;
  ASSERT_TRUE(w1.add("b", DType::kBF16, {3}, b).ok());
  ASSERT_TRUE(w1.add("a", DType::kF32, {2, 3}, a).ok());
  ASSERT_TRUE(w2.add("a", DType::kF32, {2, 3}, a).ok());
  ASSERT_TRUE(w2.add("b", DType::kBF16, {3}, b).ok());
  ASSERT_TRUE(w1.write(tmp.file("1.safetensors")).ok());
  ASSERT_TRUE(w2.write(tmp.file("2.safetensors")).ok());
  const auto f1 = *read_binary_file(tmp.file("1.safetensors"));
  EXPECT_EQ(f1, *read_binary_file(tmp.file("2.safetensors")));

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | f1[i];
  EXPECT_EQ((8 + header_len) % 8, 0u);
  EXPECT_EQ(f1.size(), 8 + header_len + a.size() + b.size());
  // Data in name order: a first, then b.
  EXPECT_TRUE(std::equal(a.begin(), a.end(), f1.begin() + 8 + header_len));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), f1.begin() + 8 + header_len + a.size()));
  const std::string header(f1.begin() + 8, f1.begin() + 8 + header_len);
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
}

TEST(Safetensors, WriterRejectsBadTensors) {
  SafetensorsWriter w;
  absl::Status s = w.add("w", DType::kF32, {2, 3}, std::vector<uint8_t>(20, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("'w'"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("24"), std::string::npos) << s;
  EXPECT_FALSE(w.add("w", DType::kF32, {-1, 3}, {}).ok());
  EXPECT_FALSE(w.add("__metadata__", DType::kU8, {1}, {1}).ok());
  EXPECT_FALSE(w.add("", DType::kU8, {1}, {1}).ok());
  ASSERT_TRUE(w.add_f32("x", {2}, {1.5f, -2.0f}).ok());
  EXPECT_EQ(w.add_f32("x", {2}, {1.5f, -2.0f}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(w.size(), 1u);
  EXPECT_EQ(w.data_bytes(), 8);
}

TEST(Safetensors, TooShortFile) {
  TempDir tmp;
  ASSERT_TRUE(write_file_atomic(tmp.file("a.safetensors"), "abc").ok());
  expect_open_error(tmp.file("a.safetensors"), {"too short"});
}

TEST(Safetensors, HeaderLengthBeyondFile) {
  TempDir tmp;
  const std::string h = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  write_raw(tmp.file("a.safetensors"), h, 8, 1 << 20);
  expect_open_error(tmp.file("a.safetensors"), {"header length 1048576", "exceeds"});
}

TEST(Safetensors, MalformedJson) {
  TempDir tmp;
  write_raw(tmp.file("a.safetensors"), R"({"w":{"dtype":"F32","shape":[2],)", 8);
  expect_open_error(tmp.file("a.safetensors"), {"malformed JSON"});
  write_raw(tmp.file("b.safetensors"), R"([1, 2])", 0);
  expect_open_error(tmp.file("b.safetensors"), {"must be a JSON object"});
}

TEST(Safetensors, DuplicateTensorName) {
  TempDir tmp;
  write_raw(tmp.file("a.safetensors"),
            R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
            R"("w":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
            4);
  expect_open_error(tmp.file("a.safetensors"), {"duplicate key 'w'"});
}

TEST(Safetensors, UnknownDtype) {
  TempDir tmp;
  write_raw(tmp.file("a.safetensors"),
            R"({"layer.w":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[0,2]}})", 2);
  expect_open_error(tmp.file("a.safetensors"), {"'layer.w'", "unknown dtype 'F8_E5M2'"});
}

TEST(Safetensors, TruncatedData) {
  TempDir tmp;
  write_raw(tmp.file("a.safetensors"), R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
            12);
  expect_open_error(tmp.file("a.safetensors"), {"'w'", "out of range", "truncated"});

  // A real file cut by one byte.
  SafetensorsWriter writer;
  std::mt19937 rng(3);
  ASSERT_TRUE(writer.add("a", DType::kF32, {8}, random_bytes(32, rng)).ok());
  ASSERT_TRUE(writer.add("z.last", DType::kBF16, {8}, random_bytes(16, rng)).ok());
  ASSERT_TRUE(writer.write(tmp.file("b.safetensors")).ok());
  std::filesystem::resize_file(tmp.file("b.safetensors"),
                               std::filesystem::file_size(tmp.file("b.safetensors")) - 1);
  expect_open_error(tmp.file("b.safetensors"), {"'z.last'", "out of range"});
}

TEST(Safetensors, OffsetsNotMatchingShapeTimesDtype) {
  TempDir tmp;
  write_raw(tmp.file("a.safetensors"),
            R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 16);
  expect_open_error(tmp.file("a.safetensors"), {"'w'", "hold 8 bytes", "needs 12"});
}

TEST(Safetensors, OverlappingTensors) {
  TempDir tmp;
  write_raw(tmp.file("a.safetensors"),
            R"({"first":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("second":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12);
  expect_open_error(tmp.file("a.safetensors"), {"'first'", "'second'", "overlap"});
}

TEST(Safetensors, BadEntryFields) {
  TempDir tmp;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "non-negative"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", "out of range"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", "[begin, end]"},
      {R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", "'shape' must be an array"},
      {R"({"w":{"shape":[2],"data_offsets":[0,8]}})", "missing string 'dtype'"},
      {R"({"w":{"dtype":"F32","shape":[2]}})", "missing 'data_offsets'"},
      {R"({"w":[1]})", "entry must be an object"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":1}})",
       "__metadata__ 'k' must be a string"},
  };
  int i = 0;
  for (const auto& [header, needle] : cases) {
    const std::string path = tmp.file("case" + std::to_string(i++) + ".safetensors");
    write_raw(path, header, 8);
    expect_open_error(path, {needle});
  }
}

TEST(Safetensors, MissingFile) {
  TempDir tmp;
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(tmp.file("absent.safetensors"));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(f.status().message()).find("absent.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace fp8rl
