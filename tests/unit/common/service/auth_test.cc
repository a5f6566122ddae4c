// Bearer tokens and TLS of the shared service plumbing: token files (several tokens, comments,
// bad lines named without their text, reloads that keep the old set on error), the REST guard
// on /v1/ (401 JSON without or with a wrong token, open health/metrics/other paths), HTTPS and
// gRPC TLS from PEM files made at test time with scripts/make_certs.sh (a client without the CA
// is refused; mutual TLS refuses a client without a certificate), and the cluster token a
// channel from make_channel() carries to a handler's authorize().
#include "common/service/auth.h"

#include <httplib.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"
#include "common/service/http_server.h"
#include "common/service/metrics.h"
#include "common/service/security.h"
#include "fp8rl/v1/worker_registry.grpc.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/common/temp_dir.h"

namespace fp8rl::service {
namespace {

using testing_util::TempDir;

const std::string kTokenA = "alpha-token-0123456789";
const std::string kTokenB = "bravo-token-9876543210";

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A CA and a service certificate for localhost/127.0.0.1 in `dir` (scripts/make_certs.sh).
bool make_certs(const std::string& dir) {
  const char* source = std::getenv("FP8RL_SOURCE_DIR");
  const std::string script = absl::StrCat(source ? source : ".", "/scripts/make_certs.sh");
  return std::system(absl::StrCat("bash '", script, "' '", dir, "' > /dev/null").c_str()) == 0;
}

TEST(TokenSet, AcceptsEveryTokenOfTheFileAndNothingElse) {
  TempDir dir;
  write(dir.file("tokens"), absl::StrCat("# operators\n", kTokenA, "\n\n  ", kTokenB, "  \n"));
  auto tokens = TokenSet::load(dir.file("tokens"), "--auth-token-file");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ((*tokens)->size(), 2u);
  EXPECT_TRUE((*tokens)->accepts(kTokenA));
  EXPECT_TRUE((*tokens)->accepts(kTokenB));
  EXPECT_FALSE((*tokens)->accepts(""));
  EXPECT_FALSE((*tokens)->accepts(kTokenA.substr(0, kTokenA.size() - 1)));  // a prefix
  EXPECT_FALSE((*tokens)->accepts(kTokenA + "x"));
  EXPECT_FALSE((*tokens)->accepts("# operators"));
}

TEST(TokenSet, BadFilesNameTheFlagAndLineButNeverTheToken) {
  TempDir dir;
  write(dir.file("short"), absl::StrCat(kTokenA, "\nshort-secret\n"));
  auto s = TokenSet::load(dir.file("short"), "--auth-token-file");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("--auth-token-file: line 2"), std::string::npos)
      << s.status();
  EXPECT_EQ(s.status().message().find("short-secret"), std::string::npos) << s.status();

  write(dir.file("empty"), "# nothing yet\n\n");
  auto e = TokenSet::load(dir.file("empty"), "--cluster-token-file");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--cluster-token-file: no token"), std::string::npos);

  write(dir.file("space"), "has a space inside it\n");
  auto sp = TokenSet::load(dir.file("space"), "--auth-token-file");
  ASSERT_FALSE(sp.ok());
  EXPECT_EQ(sp.status().message().find("inside"), std::string::npos) << sp.status();

  auto missing = TokenSet::load(dir.file("nope"), "--auth-token-file");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot read"), std::string::npos);
}

TEST(TokenSet, ReloadSwapsTheTokensAndABadFileKeepsTheOldOnes) {
  TempDir dir;
  write(dir.file("tokens"), kTokenA + "\n");
  auto tokens = TokenSet::load(dir.file("tokens"), "--auth-token-file");
  ASSERT_TRUE(tokens.ok());
  write(dir.file("tokens"), kTokenB + "\n");
  auto n = (*tokens)->reload();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1u);
  EXPECT_FALSE((*tokens)->accepts(kTokenA));  // revoked
  EXPECT_TRUE((*tokens)->accepts(kTokenB));
  write(dir.file("tokens"), "tiny\n");
  EXPECT_FALSE((*tokens)->reload().ok());
  EXPECT_TRUE((*tokens)->accepts(kTokenB));  // still in force
}

TEST(BearerToken, ParsesTheSchemeCaseInsensitively) {
  EXPECT_EQ(bearer_token("Bearer abc"), "abc");
  EXPECT_EQ(bearer_token("bearer   abc  "), "abc");
  EXPECT_EQ(bearer_token("BEARER abc"), "abc");
  EXPECT_FALSE(bearer_token("Basic abc").has_value());
  EXPECT_FALSE(bearer_token("Bearer ").has_value());
  EXPECT_FALSE(bearer_token("abc").has_value());
  EXPECT_FALSE(bearer_token("").has_value());
}

TEST(TokenFile, GeneratedTokensAreFreshAndTheFileIsOwnerOnly) {
  TempDir dir;
  auto a = generate_token();
  auto b = generate_token();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  const std::string path = dir.file("cluster.token");
  write(path, "old contents\n");
  chmod(path.c_str(), 0644);
  ASSERT_TRUE(write_token_file(path, *a).ok());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto read = read_token_file(path, "--cluster-token-file");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, *a);
  auto set = TokenSet::load(path, "--cluster-token-file");
  ASSERT_TRUE(set.ok());
  EXPECT_TRUE((*set)->accepts(*a));
  EXPECT_EQ(dir.entries().size(), 1u);  // no temporary file left
}

// A server with a /v1/ route, an open route and the guard in front.
class GuardedHttp {
 public:
  explicit GuardedHttp(std::shared_ptr<const TokenSet> tokens, HttpServerOptions options = {}) {
    options.host = "127.0.0.1";
    server_ = std::make_unique<HttpServer>(options, &registry_);
    server_->set_guard(bearer_guard(std::move(tokens), "/v1/"));
    server_->get("/v1/jobs", [](const HttpRequest&) { return HttpResponse{200, "{\"jobs\":[]}"}; });
    server_->post("/v1/jobs", [this](const HttpRequest&) {
      ++posts_;
      return HttpResponse{201, "{}"};
    });
    server_->get("/console", [](const HttpRequest&) {
      return HttpResponse{200, "<html></html>", "text/html"};
    });
  }
  absl::StatusOr<int> start() { return server_->start(); }
  int posts() const { return posts_; }

 private:
  MetricsRegistry registry_;
  std::unique_ptr<HttpServer> server_;
  std::atomic<int> posts_{0};
};

TEST(RestGuard, V1NeedsAnAcceptedTokenOtherPathsStayOpen) {
  auto tokens = TokenSet::from_tokens({kTokenA, kTokenB}, "test");
  ASSERT_TRUE(tokens.ok());
  GuardedHttp server(*tokens);
  auto port = server.start();
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Client client("127.0.0.1", *port);

  auto none = client.Get("/v1/jobs");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(none->get_header_value("WWW-Authenticate"), "Bearer");
  EXPECT_NE(nlohmann::json::parse(none->body)["error"].get<std::string>().find("missing"),
            std::string::npos);

  auto wrong = client.Get("/v1/jobs", {{"Authorization", "Bearer not-the-token-at-all"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  EXPECT_EQ(nlohmann::json::parse(wrong->body)["error"], "invalid bearer token");
  EXPECT_EQ(wrong->body.find("not-the-token"), std::string::npos);

  auto basic = client.Get("/v1/jobs", {{"Authorization", "Basic " + kTokenA}});
  ASSERT_TRUE(basic);
  EXPECT_EQ(basic->status, 401);

  // A refused POST never reaches the handler; an accepted one does.
  auto refused_post = client.Post("/v1/jobs", "{}", "application/json");
  ASSERT_TRUE(refused_post);
  EXPECT_EQ(refused_post->status, 401);
  EXPECT_EQ(server.posts(), 0);
  auto post =
      client.Post("/v1/jobs", {{"Authorization", "Bearer " + kTokenB}}, "{}", "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 201);
  EXPECT_EQ(server.posts(), 1);

  auto right = client.Get("/v1/jobs", {{"Authorization", "Bearer " + kTokenA}});
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200);

  for (const char* open : {"/healthz", "/metrics", "/console"}) {
    auto r = client.Get(open);
    ASSERT_TRUE(r) << open;
    EXPECT_EQ(r->status, 200) << open;
  }
}

TEST(RestGuard, WithoutTokensEverythingIsOpen) {
  GuardedHttp server(nullptr);
  auto port = server.start();
  ASSERT_TRUE(port.ok());
  httplib::Client client("127.0.0.1", *port);
  auto r = client.Get("/v1/jobs");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(Https, ServesWithTheCaAndRefusesClientsWithoutIt) {
  TempDir dir;
  ASSERT_TRUE(make_certs(dir.file("pki")));
  ASSERT_TRUE(make_certs(dir.file("other")));  // an unrelated CA
  auto tokens = TokenSet::from_tokens({kTokenA}, "test");
  ASSERT_TRUE(tokens.ok());
  HttpServerOptions options;
  options.tls_cert = dir.file("pki/service.pem");
  options.tls_key = dir.file("pki/service.key");
  GuardedHttp server(*tokens, options);
  auto port = server.start();
  ASSERT_TRUE(port.ok()) << port.status();

  httplib::SSLClient good("127.0.0.1", *port);
  good.set_ca_cert_path(dir.file("pki/ca.pem").c_str());
  good.enable_server_certificate_verification(true);
  auto ok = good.Get("/v1/jobs", {{"Authorization", "Bearer " + kTokenA}});
  ASSERT_TRUE(ok) << httplib::to_string(ok.error());
  EXPECT_EQ(ok->status, 200);
  auto no_token = good.Get("/v1/jobs");
  ASSERT_TRUE(no_token);
  EXPECT_EQ(no_token->status, 401);

  httplib::SSLClient wrong_ca("127.0.0.1", *port);
  wrong_ca.set_ca_cert_path(dir.file("other/ca.pem").c_str());
  wrong_ca.enable_server_certificate_verification(true);
  auto refused = wrong_ca.Get("/healthz");
  EXPECT_FALSE(refused);

  httplib::Client plain("127.0.0.1", *port);
  plain.set_read_timeout(std::chrono::seconds(2));
  auto plain_answer = plain.Get("/healthz");
  EXPECT_TRUE(!plain_answer || plain_answer->status != 200);
}

TEST(Https, AKeyThatDoesNotMatchFailsStartNamingTheFlag) {
  TempDir dir;
  ASSERT_TRUE(make_certs(dir.file("pki")));
  ASSERT_TRUE(make_certs(dir.file("other")));
  HttpServerOptions options;
  options.host = "127.0.0.1";
  options.tls_cert = dir.file("pki/service.pem");
  options.tls_key = dir.file("other/service.key");
  HttpServer server(options, nullptr);
  auto port = server.start();
  ASSERT_FALSE(port.ok());
  EXPECT_NE(port.status().message().find("--tls-cert"), std::string::npos) << port.status();
}

TEST(TlsFiles, ChecksNameTheFlag) {
  TempDir dir;
  ASSERT_TRUE(make_certs(dir.file("pki")));
  auto key_missing = check_tls_files({dir.file("pki/service.pem"), "", ""});
  ASSERT_FALSE(key_missing.ok());
  EXPECT_NE(key_missing.status().message().find("--tls-key"), std::string::npos);
  auto ca_alone = check_tls_files({"", "", dir.file("pki/ca.pem")});
  ASSERT_FALSE(ca_alone.ok());
  EXPECT_NE(ca_alone.status().message().find("--tls-cert"), std::string::npos);
  write(dir.file("junk.pem"), "not a certificate");
  auto junk = check_tls_files({dir.file("junk.pem"), dir.file("pki/service.key"), ""});
  ASSERT_FALSE(junk.ok());
  EXPECT_NE(junk.status().message().find("not a PEM file"), std::string::npos);
  EXPECT_TRUE(check_tls_files({dir.file("pki/service.pem"), dir.file("pki/service.key"),
                               dir.file("pki/ca.pem")})
                  .ok());
}

// A WorkerRegistry whose handlers only run authorize(): answers with the call's outcome.
class GuardedRegistry final : public v1::WorkerRegistry::Service {
 public:
  explicit GuardedRegistry(std::shared_ptr<const TokenSet> tokens) : tokens_(std::move(tokens)) {}
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse* response) override {
    if (grpc::Status auth = authorize(tokens_.get(), context); !auth.ok()) return auth;
    ++served;
    response->set_reregister(false);
    return grpc::Status::OK;
  }
  std::atomic<int> served{0};

 private:
  std::shared_ptr<const TokenSet> tokens_;
};

grpc::Status heartbeat(const std::string& address, const ClientSecurity& security) {
  grpc::ChannelArguments args;
  auto stub = v1::WorkerRegistry::NewStub(make_channel(address, args, security));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::HeartbeatRequest request;
  v1::HeartbeatResponse response;
  return stub->Heartbeat(&context, request, &response);
}

TEST(GrpcAuth, TheChannelTokenReachesAuthorize) {
  auto tokens = TokenSet::from_tokens({kTokenA}, "test");
  ASSERT_TRUE(tokens.ok());
  GuardedRegistry registry(*tokens);
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  auto server = GrpcServer::start(options, {&registry});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());

  grpc::Status none = heartbeat(address, {});
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
  ClientSecurity wrong;
  wrong.token = kTokenB;
  EXPECT_EQ(heartbeat(address, wrong).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(registry.served.load(), 0);
  ClientSecurity right;
  right.token = kTokenA;
  grpc::Status ok = heartbeat(address, right);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(registry.served.load(), 1);
}

TEST(GrpcTls, MutualTlsNeedsTheCaAndAClientCertificate) {
  TempDir dir;
  ASSERT_TRUE(make_certs(dir.file("pki")));
  ASSERT_TRUE(make_certs(dir.file("other")));
  const TlsFiles files{dir.file("pki/service.pem"), dir.file("pki/service.key"),
                       dir.file("pki/ca.pem")};
  auto credentials = grpc_server_credentials(files);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto tokens = TokenSet::from_tokens({kTokenA}, "test");
  ASSERT_TRUE(tokens.ok());
  GuardedRegistry registry(*tokens);
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  options.credentials = *credentials;
  auto server = GrpcServer::start(options, {&registry});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());

  auto full = client_security(files, kTokenA);  // CA + client certificate + token
  ASSERT_TRUE(full.ok()) << full.status();
  grpc::Status ok = heartbeat(address, *full);
  EXPECT_TRUE(ok.ok()) << ok.error_message();

  ClientSecurity no_client_cert = *full;  // verifies the server, presents nothing
  no_client_cert.cert_pem.clear();
  no_client_cert.key_pem.clear();
  EXPECT_EQ(heartbeat(address, no_client_cert).error_code(), grpc::StatusCode::UNAVAILABLE);

  auto other = client_security(
      {dir.file("other/service.pem"), dir.file("other/service.key"), dir.file("other/ca.pem")},
      kTokenA);  // a certificate from another CA, and not our CA
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(heartbeat(address, *other).error_code(), grpc::StatusCode::UNAVAILABLE);

  ClientSecurity plaintext;
  plaintext.token = kTokenA;
  EXPECT_EQ(heartbeat(address, plaintext).error_code(), grpc::StatusCode::UNAVAILABLE);

  ClientSecurity no_token = *full;  // TLS alone is not the cluster token
  no_token.token.clear();
  EXPECT_EQ(heartbeat(address, no_token).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(registry.served.load(), 1);
}

}  // namespace
}  // namespace fp8rl::service
