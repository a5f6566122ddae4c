// Serves the web console on the coordinator's HTTP port: GET / (the page) and GET /console/NAME
// (its script, style sheet and chart list). The files carry no job data: the page reads the /v1
// API, with the caller's token when the API asks for one, so these routes need no auth.
#pragma once

#include "common/service/http_server.h"

namespace fp8rl::console {

void add_console_routes(service::HttpServer& server);

}  // namespace fp8rl::console
