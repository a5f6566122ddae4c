// Lookups over the embedded console files (see assets.h).
#include "services/coordinator/console/assets.h"

namespace fp8rl::console {

const EmbeddedFile* find_embedded_file(std::string_view name) {
  for (const EmbeddedFile& file : embedded_files()) {
    if (file.name == name) return &file;
  }
  return nullptr;
}

std::string_view content_type_for(std::string_view name) {
  auto ends_with = [name](std::string_view ext) {
    return name.size() >= ext.size() && name.substr(name.size() - ext.size()) == ext;
  };
  if (ends_with(".html")) return "text/html; charset=utf-8";
  if (ends_with(".js")) return "text/javascript; charset=utf-8";
  if (ends_with(".css")) return "text/css; charset=utf-8";
  if (ends_with(".json")) return "application/json";
  return "application/octet-stream";
}

}  // namespace fp8rl::console
