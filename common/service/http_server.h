// The HTTP side of every service (cpp-httplib underneath): /metrics (Prometheus text), /healthz,
// and any REST routes a service adds, with a request body size limit. Errors are JSON
// {"error": "..."}; a handler that throws answers 500 and the server keeps serving.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/service/metrics.h"

namespace fp8rl::service {

struct HttpRequest {
  std::string method;
  std::string path;
  std::string body;
  std::vector<std::string> params;  // regex capture groups of the route pattern, in order
  std::map<std::string, std::string> query;
  std::map<std::string, std::string> headers;  // names in lower case ("content-type")
  std::string authorization;  // the Authorization header ("" when absent); never logged
};

struct HttpResponse {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  // Extra response headers. A handler that can tell cheaply whether its answer changed sets
  // "ETag" here (used instead of body_etag) and may answer 304 itself (see http_matches_etag).
  std::map<std::string, std::string> headers = {};
};

// True when the request's If-None-Match ("*", or a list of tags, weak or not) names `etag`.
bool http_matches_etag(const HttpRequest& request, const std::string& etag);

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;
// Runs before every route handler (not /healthz or /metrics): an answer stops the request there
// (authentication, see auth.h); nullopt lets the route handle it.
using HttpGuard = std::function<std::optional<HttpResponse>(const HttpRequest&)>;

// The ETag the server sends with a 200 answer to a GET: a quoted hex checksum of the body.
std::string body_etag(std::string_view body);

// {"error": message} with the given status.
HttpResponse json_error(int status, std::string_view message);

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;                      // 0: pick a free port (see HttpServer::port())
  int64_t max_body_bytes = 1 << 20;  // larger bodies: 400 {"error": "body: ..."}
  int threads = 8;                   // worker threads serving requests
  // HTTPS when both are set: PEM certificate chain and private key files (read at construction;
  // an unreadable or mismatched pair makes start() fail naming --tls-cert). Plain HTTP otherwise.
  std::string tls_cert = {};
  std::string tls_key = {};
};

class HttpServer {
 public:
  // `metrics` (optional) is served on GET /metrics and gets fp8rl_http_requests_total.
  // `healthy` (optional) decides GET /healthz: 200 {"status":"ok"} or 503.
  HttpServer(HttpServerOptions options, MetricsRegistry* metrics,
             std::function<bool()> healthy = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes: ECMAScript regex matched against the whole path ("/v1/jobs/([^/:]+)"). Add before
  // start(). A GET route's 200 answer carries an ETag (the handler's
  // headers["ETag"], else body_etag); a request whose If-None-Match names it gets 304 with no
  // body, so pollers do not download what they already have. A POST sent
  // with neither Content-Length nor chunked Transfer-Encoding (plain `curl -X POST URL`) reaches
  // its route with an empty body, as HTTP/1.1 defines it.
  void get(const std::string& pattern, HttpHandler handler);
  void post(const std::string& pattern, HttpHandler handler);
  // Installs the guard every route request passes first (replaces an earlier one). Before start().
  void set_guard(HttpGuard guard);

  // Binds and serves on a background thread; returns the bound port. FailedPrecondition when the
  // address cannot be bound. The listener sets SO_REUSEADDR and not SO_REUSEPORT: a restarted
  // process re-binds at once (TIME_WAIT connections do not block it), a live listener refuses.
  absl::StatusOr<int> start();
  // Stops accepting, finishes in-flight requests, joins the thread. Idempotent.
  void stop();
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace fp8rl::service
