// Tests of common/json_util.h: strict parsing rejects duplicate keys and nesting beyond
// kMaxJsonDepth (which would overflow the stack when the value is later copied or dumped).
#include "common/json_util.h"

#include <gtest/gtest.h>

#include <string>

namespace fp8rl {
namespace {

std::string nested_arrays(int depth) {
  return std::string(static_cast<size_t>(depth), '[') + "1" +
         std::string(static_cast<size_t>(depth), ']');
}

TEST(ParseJsonStrict, NestingUpToTheLimitParsesAndCopies) {
  absl::StatusOr<nlohmann::ordered_json> j = parse_json_strict(nested_arrays(kMaxJsonDepth), "x");
  ASSERT_TRUE(j.ok()) << j.status();
  const nlohmann::ordered_json copy = *j;
  EXPECT_EQ(copy.dump(), nested_arrays(kMaxJsonDepth));
}

TEST(ParseJsonStrict, DeeperNestingIsAnErrorNotACrash) {
  for (int depth : {kMaxJsonDepth + 1, 100000}) {
    absl::StatusOr<nlohmann::ordered_json> j = parse_json_strict(nested_arrays(depth), "body");
    ASSERT_FALSE(j.ok()) << depth;
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(j.status().message()),
              "body: malformed JSON: arrays and objects nested deeper than 128");
  }
  // Objects count like arrays, and the limit applies inside a valid outer document.
  std::string objects = R"({"model": {"init": {"config": )";
  for (int i = 0; i < 200; ++i) objects += R"({"a": )";
  objects += "1" + std::string(200, '}') + "}}}";
  absl::StatusOr<nlohmann::ordered_json> j = parse_json_strict(objects, "body");
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("nested deeper than"), std::string::npos) << j.status();
}

TEST(ParseJsonStrict, DuplicateKeysAndSyntaxErrorsNameTheSource) {
  absl::StatusOr<nlohmann::ordered_json> dup = parse_json_strict(R"({"a": 1, "a": 2})", "f.json");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(std::string(dup.status().message()), "f.json: malformed JSON: duplicate key 'a'");
  absl::StatusOr<nlohmann::ordered_json> bad = parse_json_strict("{\"a\": secret}", "f.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().find("secret"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace fp8rl
