// Transport security and the cluster token for every service: TLS credentials for gRPC servers
// and channels from PEM files (mutual TLS when a CA is given), and the channel factory every
// internal client uses, which attaches "authorization: Bearer <cluster token>" to each call.
// All of it is off by default (plain gRPC/HTTP on trusted networks such as loopback); see
// docs/deploy.md for turning it on.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/service/auth.h"
#include "common/service/options.h"

namespace fp8rl::service {

// PEM file paths. cert+key: this process's identity (server, and client for mutual TLS);
// ca: the certificates that verify the peer. TLS is on when cert is set.
struct TlsFiles {
  std::string cert;
  std::string key;
  std::string ca;
  bool enabled() const { return !cert.empty(); }
};

// What a client sends: a bearer token (empty: none) and, when `tls`, TLS with the CA bundle
// (empty: the system's roots) and an optional client certificate. PEM contents, not paths.
struct ClientSecurity {
  std::string token;
  bool tls = false;
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  // When set (and tls): the name the server's certificate must carry, instead of the address's
  // host (GRPC_SSL_TARGET_NAME_OVERRIDE_ARG).
  std::string server_name;
};

// Checks the files (cert and key together; ca needs cert and key) and reads them. Errors name
// the flag ("--tls-key: required with --tls-cert").
absl::StatusOr<TlsFiles> check_tls_files(TlsFiles files);

// Insecure credentials when TLS is off; otherwise TLS from the PEM files, requiring and
// verifying a client certificate when files.ca is set.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> grpc_server_credentials(
    const TlsFiles& files);

// The client side of `files` (CA and, for mutual TLS, cert+key) plus `token`.
absl::StatusOr<ClientSecurity> client_security(const TlsFiles& files, std::string token);

// A channel to `address` with `security`'s credentials and token.
std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            const grpc::ChannelArguments& args,
                                            const ClientSecurity& security);

// Everything a service derives from its ServiceOptions' security flags.
struct ServiceSecurity {
  TlsFiles tls;
  std::shared_ptr<TokenSet> cluster_tokens;  // null: internal endpoints take no token
  std::shared_ptr<grpc::ServerCredentials> grpc_credentials;
  ClientSecurity client;  // for calls to other services: TLS as configured + the cluster token
};

// Reads --cluster-token-file and the TLS files of `options`; errors name the flag.
absl::StatusOr<ServiceSecurity> load_service_security(const ServiceOptions& options);

}  // namespace fp8rl::service
