// TLS credentials and the token-carrying channel factory (see security.h).
#include "common/service/security.h"

#include <grpcpp/support/client_interceptor.h>

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fp8rl::service {
namespace {

absl::StatusOr<std::string> read_pem(const std::string& path, std::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(absl::StrCat(std::string(flag), ": cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(flag), ": '", path, "' is not a PEM file"));
  }
  return text.str();
}

// Adds "authorization: Bearer <token>" to every call of the channel.
class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *value_);
    }
    methods->Proceed();
  }

 private:
  const std::string* value_;  // owned by the factory, which outlives the channel's calls
};

class BearerInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& token)
      : value_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(&value_);
  }

 private:
  const std::string value_;
};

}  // namespace

absl::StatusOr<TlsFiles> check_tls_files(TlsFiles files) {
  if (!files.cert.empty() && files.key.empty()) {
    return absl::InvalidArgumentError("--tls-key: required with --tls-cert");
  }
  if (files.cert.empty() && !files.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert: required with --tls-key");
  }
  if (!files.ca.empty() && files.cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert: required with --tls-ca (mutual TLS needs this service's own certificate)");
  }
  for (auto [flag, path] : {std::pair{"--tls-cert", &files.cert},
                            std::pair{"--tls-key", &files.key}, std::pair{"--tls-ca", &files.ca}}) {
    if (path->empty()) continue;
    absl::StatusOr<std::string> pem = read_pem(*path, flag);
    if (!pem.ok()) return pem.status();
  }
  return files;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> grpc_server_credentials(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert = read_pem(files.cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = read_pem(files.key, "--tls-key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!files.ca.empty()) {
    absl::StatusOr<std::string> ca = read_pem(files.ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<ClientSecurity> client_security(const TlsFiles& files, std::string token) {
  ClientSecurity out;
  out.token = std::move(token);
  if (!files.enabled() && files.ca.empty()) return out;
  out.tls = true;
  if (!files.ca.empty()) {
    absl::StatusOr<std::string> ca = read_pem(files.ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    out.ca_pem = *ca;
  }
  if (!files.cert.empty()) {
    absl::StatusOr<std::string> cert = read_pem(files.cert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = read_pem(files.key, "--tls-key");
    if (!key.ok()) return key.status();
    out.cert_pem = *cert;
    out.key_pem = *key;
  }
  return out;
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            const grpc::ChannelArguments& args,
                                            const ClientSecurity& security) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments channel_args = args;
  if (security.tls && !security.server_name.empty()) {
    channel_args.SetSslTargetNameOverride(security.server_name);
  }
  if (security.tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = security.ca_pem;
    ssl.pem_cert_chain = security.cert_pem;
    ssl.pem_private_key = security.key_pem;
    credentials = grpc::SslCredentials(ssl);
  }
  if (security.token.empty()) return grpc::CreateCustomChannel(address, credentials, channel_args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerInterceptorFactory>(security.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, channel_args,
                                                                 std::move(interceptors));
}

absl::StatusOr<ServiceSecurity> load_service_security(const ServiceOptions& options) {
  ServiceSecurity out;
  absl::StatusOr<TlsFiles> tls =
      check_tls_files({options.tls_cert, options.tls_key, options.tls_ca});
  if (!tls.ok()) return tls.status();
  out.tls = *tls;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      grpc_server_credentials(out.tls);
  if (!credentials.ok()) return credentials.status();
  out.grpc_credentials = *credentials;
  std::string token;
  if (!options.cluster_token_file.empty()) {
    absl::StatusOr<std::shared_ptr<TokenSet>> tokens =
        TokenSet::load(options.cluster_token_file, "--cluster-token-file");
    if (!tokens.ok()) return tokens.status();
    out.cluster_tokens = *tokens;
    // Calls to other services carry the file's first token; the others are accepted too, so a
    // new token can be rolled out (add it everywhere, SIGHUP, then move it first) without a gap.
    absl::StatusOr<std::string> first =
        read_token_file(options.cluster_token_file, "--cluster-token-file");
    if (!first.ok()) return first.status();
    token = *first;
  }
  absl::StatusOr<ClientSecurity> client = client_security(out.tls, std::move(token));
  if (!client.ok()) return client.status();
  out.client = std::move(*client);
  out.client.server_name = options.tls_server_name;
  return out;
}

}  // namespace fp8rl::service
