// The zero-copy upload (UploadOptions::zero_copy, the channel overloads of upload, upload_part and
// upload_parallel): chunks written as slices over the tensors' bytes store exactly what the
// message path stores, with chunk sizes that cut tensors in every way (a chunk spanning several
// tensors, a tensor spanning several chunks), in one part or several; a refused upload returns the
// service's error.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "services/weight_sync/client.h"
#include "services/weight_sync/payload.h"
#include "tests/unit/weight_sync/test_server.h"
#include "tests/unit/weight_sync/test_weights.h"

namespace fp8rl::weight_sync {
namespace {

using testing::random_fp8_set;

std::string concat(const model::WeightSet& set) {
  std::string out;
  for (const auto& t : set.tensors) out.append(t.bytes.begin(), t.bytes.end());
  return out;
}

TEST(ZeroCopyUpload, StoresWhatTheMessagePathStores) {
  for (uint64_t chunk_bytes : {uint64_t{1000}, uint64_t{65537}, kDefaultChunkBytes}) {
    SCOPED_TRACE(chunk_bytes);
    testing::TestServer zero_copy_server, message_server;
    model::WeightSet set = random_fp8_set(1, 401 + static_cast<uint32_t>(chunk_bytes % 97));
    UploadOptions zero_copy;
    zero_copy.chunk_bytes = chunk_bytes;
    UploadOptions message = zero_copy;
    message.zero_copy = false;
    absl::StatusOr<v1::UploadVersionResponse> a =
        upload(zero_copy_server.channel(), set, v1::WEIGHT_FORMAT_FP8, zero_copy);
    absl::StatusOr<v1::UploadVersionResponse> b =
        upload(message_server.channel(), set, v1::WEIGHT_FORMAT_FP8, message);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->bytes_received(), set.nbytes());
    EXPECT_EQ(a->version(), 1);
    StoredVersionPtr got = zero_copy_server.service().store().latest();
    StoredVersionPtr want = message_server.service().store().latest();
    ASSERT_NE(got, nullptr);
    ASSERT_NE(want, nullptr);
    EXPECT_TRUE(got->payload == concat(set));
    EXPECT_TRUE(got->payload == want->payload);
    EXPECT_EQ(manifest_difference(got->manifest, want->manifest), "");
  }
}

TEST(ZeroCopyUpload, PartsOnTheirOwnConnectionsAssembleTheVersion) {
  testing::TestServer server;
  const model::WeightSet set = random_fp8_set(3, 411);
  std::vector<std::shared_ptr<grpc::ChannelInterface>> channels;
  for (int i = 0; i < 3; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channels.push_back(
        grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args));
  }
  UploadOptions options;
  options.chunk_bytes = 300000;
  absl::StatusOr<v1::UploadVersionResponse> r =
      upload_parallel(channels, set, v1::WEIGHT_FORMAT_FP8, 3, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_received(), set.nbytes());
  StoredVersionPtr got = server.service().store().latest();
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->version(), 3);
  EXPECT_TRUE(got->payload == concat(set));
}

TEST(ZeroCopyUpload, RefusedUploadReturnsTheServicesError) {
  testing::TestServer server;
  const model::WeightSet set = random_fp8_set(2, 421);
  ASSERT_TRUE(upload(server.channel(), set, v1::WEIGHT_FORMAT_FP8).ok());
  absl::StatusOr<v1::UploadVersionResponse> again =
      upload(server.channel(), set, v1::WEIGHT_FORMAT_FP8);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument) << again.status();
  EXPECT_NE(again.status().message().find("not newer"), std::string::npos) << again.status();
  UploadOptions bad;
  bad.chunk_bytes = 0;
  absl::StatusOr<v1::UploadVersionResponse> refused =
      upload(server.channel(), random_fp8_set(3, 422), v1::WEIGHT_FORMAT_FP8, bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("chunk_bytes"), std::string::npos);
  EXPECT_EQ(server.service().store().latest_version(), 2);
}

}  // namespace
}  // namespace fp8rl::weight_sync
