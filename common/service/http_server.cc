// cpp-httplib behind a small interface (see http_server.h), so services never include httplib.h.
#include "common/service/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <regex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/service/crc32c.h"
#include "common/service/log.h"
#include "nlohmann/json.hpp"

namespace fp8rl::service {

namespace {

void set_listener_socket_options(int fd) {
  // httplib's default sets only SO_REUSEPORT on Linux: a second process could then bind the same
  // port and take half its connections, and sockets left in TIME_WAIT by this listener would
  // block `fp8rl up`'s pre-flight bind (which, like gRPC, uses SO_REUSEADDR). SO_REUSEADDR alone
  // lets a restarted process re-bind at once while a live listener still makes bind() fail.
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
}

// Debian's compiled httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG is fixed in
// the library): with a few dozen clients connecting at once the kernel drops SYNs and clients
// wait a 1 s retransmit (seen as p99 > 1 s by bench/rest_load). Re-listening on the bound socket
// raises the backlog (capped by net.core.somaxconn).
constexpr int kListenBacklog = SOMAXCONN;

}  // namespace

std::string body_etag(std::string_view body) {
  // CRC-32C and the length: a changed body gets a new tag (a collision needs the same length and
  // checksum), and the tag costs one pass over bytes the server sends anyway.
  return absl::StrFormat("\"%08x-%x\"", crc32c(body), body.size());
}

namespace {

// True when an If-None-Match header value ("*", or a list of tags, weak or not) names `etag`.
bool etag_matches(const std::string& if_none_match, const std::string& etag) {
  for (absl::string_view tag : absl::StrSplit(if_none_match, ',')) {
    tag = absl::StripAsciiWhitespace(tag);
    if (absl::StartsWith(tag, "W/")) tag.remove_prefix(2);
    if (tag == "*" || tag == etag) return true;
  }
  return false;
}

}  // namespace

bool http_matches_etag(const HttpRequest& request, const std::string& etag) {
  auto it = request.headers.find("if-none-match");
  return it != request.headers.end() && etag_matches(it->second, etag);
}

HttpResponse json_error(int status, std::string_view message) {
  return {status, nlohmann::json{{"error", message}}.dump(), "application/json"};
}

struct HttpServer::Impl {
  HttpServerOptions options;
  MetricsRegistry* metrics = nullptr;
  CounterFamily* requests = nullptr;
  std::function<bool()> healthy;
  std::unique_ptr<httplib::Server> server;  // httplib::SSLServer when TLS is configured
  bool tls_invalid = false;                 // the certificate or key could not be loaded
  HttpGuard guard;
  std::thread thread;
  std::atomic<bool> listen_returned{false};  // set by `thread` when listen_after_bind returns
  int listen_fd = -1;  // the socket httplib last created for listening (set before bind)
  bool started = false;

  void count(int status) {
    if (requests != nullptr) requests->with({absl::StrCat(status)}).inc();
  }

  // Runs a route handler and writes its answer; a throwing handler becomes a 500.
  void respond(const HttpHandler& handler, const HttpRequest& request, httplib::Response& res) {
    HttpResponse response;
    try {
      std::optional<HttpResponse> refused;
      if (guard) refused = guard(request);
      response = refused ? std::move(*refused) : handler(request);
    } catch (const std::exception& e) {
      log_error("http", "handler threw", {{"path", request.path}, {"error", e.what()}});
      response = json_error(500, absl::StrCat("internal error: ", e.what()));
    }
    if (response.status == 304) {  // the handler checked its own ETag
      res.status = 304;
      for (const auto& [name, value] : response.headers) res.set_header(name, value);
      count(304);
      return;
    }
    if (request.method == "GET" && response.status == 200) {
      auto own = response.headers.find("ETag");
      const std::string etag =
          own != response.headers.end() ? own->second : body_etag(response.body);
      response.headers["ETag"] = etag;
      if (http_matches_etag(request, etag)) {
        res.status = 304;
        res.set_header("ETag", etag);
        count(304);
        return;
      }
    }
    res.status = response.status;
    for (const auto& [name, value] : response.headers) res.set_header(name, value);
    res.set_content(response.body, response.content_type);
    count(response.status);
  }

  static HttpRequest to_request(const httplib::Request& req) {
    HttpRequest request;
    request.method = req.method;
    request.path = req.path;
    request.body = req.body;
    request.authorization = req.get_header_value("Authorization");
    for (const auto& [key, value] : req.params) request.query[key] = value;
    for (const auto& [name, value] : req.headers)
      request.headers[absl::AsciiStrToLower(name)] = value;
    return request;
  }

  httplib::Server::Handler wrap(HttpHandler handler) {
    return
        [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
          HttpRequest request = to_request(req);
          for (size_t i = 1; i < req.matches.size(); ++i) request.params.push_back(req.matches[i]);
          respond(handler, request, res);
        };
  }

  // A POST with neither Content-Length nor chunked Transfer-Encoding has an empty body (RFC 9112
  // section 6.3), but httplib would try to read one until the connection closes and answer 400.
  // Such a request is routed here, before httplib reads anything, as a POST with an empty body;
  // the route's handler decides (":cancel" works, a route that needs a body names it).
  httplib::Server::HandlerResponse route_bodyless_post(const httplib::Request& req,
                                                       httplib::Response& res) {
    if (req.method != "POST" || req.has_header("Content-Length") ||
        req.has_header("Transfer-Encoding")) {
      return httplib::Server::HandlerResponse::Unhandled;  // httplib reads the body as usual
    }
    HttpRequest request = to_request(req);
    for (const auto& [pattern, handler] : post_routes) {
      std::smatch match;
      if (!std::regex_match(req.path, match, pattern)) continue;
      for (size_t i = 1; i < match.size(); ++i) request.params.push_back(match[i].str());
      respond(handler, request, res);
      return httplib::Server::HandlerResponse::Handled;
    }
    // No POST route: the error handler writes the usual 404 body.
    res.status = 404;
    return httplib::Server::HandlerResponse::Handled;
  }

  // POST routes in registration order (the same first-match order httplib uses), for
  // route_bodyless_post.
  std::vector<std::pair<std::regex, HttpHandler>> post_routes;
};

HttpServer::HttpServer(HttpServerOptions options, MetricsRegistry* metrics,
                       std::function<bool()> healthy)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->metrics = metrics;
  impl_->healthy = std::move(healthy);
  const HttpServerOptions& o = impl_->options;
  if (!o.tls_cert.empty() || !o.tls_key.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(o.tls_cert.c_str(), o.tls_key.c_str());
    impl_->tls_invalid = !ssl->is_valid();
    impl_->server = std::move(ssl);
  } else {
    impl_->server = std::make_unique<httplib::Server>();
  }
  if (metrics != nullptr) {
    auto family = metrics->add_counter("fp8rl_http_requests_total",
                                       "HTTP requests answered, by status code.", {"code"});
    if (family.ok()) impl_->requests = *family;
  }
  Impl* impl = impl_.get();
  const int threads = std::max(1, impl_->options.threads);
  impl_->server->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  impl_->server->set_payload_max_length(static_cast<size_t>(impl_->options.max_body_bytes));
  impl_->server->set_socket_options([impl](int fd) {
    set_listener_socket_options(fd);
    impl->listen_fd = fd;
  });
  impl_->server->set_pre_routing_handler(
      [impl](const httplib::Request& req, httplib::Response& res) {
        return impl->route_bodyless_post(req, res);
      });
  impl_->server->set_error_handler([impl](const httplib::Request& req, httplib::Response& res) {
    // Reached for statuses >= 400 that no handler produced: oversized bodies (413 from the
    // parser), unknown routes (404), malformed requests (400). A route's own error body stays.
    if (!res.body.empty()) return;
    std::string message;
    if (res.status == 413) {
      res.status = 400;
      message = absl::StrCat("body: request body exceeds the limit of ",
                             impl->options.max_body_bytes, " bytes");
    } else if (res.status == 404) {
      message = absl::StrCat("no route for ", req.method, " ", req.path);
    } else {
      message = absl::StrCat("bad request (HTTP ", res.status, ")");
    }
    res.set_content(nlohmann::json{{"error", message}}.dump(), "application/json");
    impl->count(res.status);
  });
  impl_->server->Get("/healthz", [impl](const httplib::Request&, httplib::Response& res) {
    const bool ok = !impl->healthy || impl->healthy();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? R"({"status":"ok"})" : R"({"status":"unavailable"})", "application/json");
    impl->count(res.status);
  });
  if (metrics != nullptr) {
    impl_->server->Get("/metrics", [impl](const httplib::Request&, httplib::Response& res) {
      res.set_content(impl->metrics->render(), std::string(kPrometheusContentType));
      impl->count(200);
    });
  }
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::get(const std::string& pattern, HttpHandler handler) {
  impl_->server->Get(pattern, impl_->wrap(std::move(handler)));
}

void HttpServer::set_guard(HttpGuard guard) { impl_->guard = std::move(guard); }

void HttpServer::post(const std::string& pattern, HttpHandler handler) {
  impl_->post_routes.emplace_back(std::regex(pattern), handler);
  impl_->server->Post(pattern, impl_->wrap(std::move(handler)));
}

absl::StatusOr<int> HttpServer::start() {
  if (impl_->started) return port_;
  if (impl_->tls_invalid) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tls-cert/--tls-key: cannot load the certificate '", impl_->options.tls_cert,
        "' with the key '", impl_->options.tls_key, "' (PEM files of one pair expected)"));
  }
  int port = impl_->options.port;
  if (port == 0) {
    port = impl_->server->bind_to_any_port(impl_->options.host);
    if (port < 0) port = 0;
  } else if (!impl_->server->bind_to_port(impl_->options.host, port)) {
    port = 0;
  }
  if (port <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("http: cannot bind ", impl_->options.host, ":", impl_->options.port));
  }
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, kListenBacklog);
  port_ = port;
  impl_->started = true;
  impl_->listen_returned = false;
  impl_->thread = std::thread([impl = impl_.get()] {
    impl->server->listen_after_bind();
    impl->listen_returned = true;
  });
  // httplib's stop() does nothing until the listen thread has marked the server running, so a
  // stop() right after start() would leave that thread in accept() and hang the join: wait.
  while (!impl_->server->is_running() && !impl_->listen_returned) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return port_;
}

void HttpServer::stop() {
  if (!impl_ || !impl_->started) return;
  impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->started = false;
}

}  // namespace fp8rl::service
