// The console's routes (see console_routes.h).
#include "services/coordinator/console/console_routes.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "services/coordinator/console/assets.h"
#include "services/coordinator/console/chart_list.h"

namespace fp8rl::console {
namespace {

service::HttpResponse file_response(const EmbeddedFile& file) {
  return {200, std::string(file.body), std::string(content_type_for(file.name))};
}

}  // namespace

void add_console_routes(service::HttpServer& server) {
  server.get("/", [](const service::HttpRequest&) {
    return file_response(*find_embedded_file("index.html"));
  });
  server.get(R"(/console/([A-Za-z0-9_.-]+))", [](const service::HttpRequest& req) {
    if (req.params[0] == "charts.json") {
      absl::StatusOr<std::string> charts = chart_list_json();
      if (!charts.ok()) return service::json_error(500, std::string(charts.status().message()));
      return service::HttpResponse{200, *std::move(charts),
                                   std::string(content_type_for("charts.json"))};
    }
    const EmbeddedFile* file = find_embedded_file(req.params[0]);
    if (file == nullptr) {
      return service::json_error(404, absl::StrCat("no console file '", req.params[0], "'"));
    }
    return file_response(*file);
  });
}

}  // namespace fp8rl::console
