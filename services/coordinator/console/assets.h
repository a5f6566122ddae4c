// The web console's static files (index.html, console.js, console.css, charts.json), compiled
// into the binary by embed_assets.cmake so that the console works offline, with no CDN and no
// files to install next to the coordinator.
#pragma once

#include <string_view>
#include <vector>

namespace fp8rl::console {

struct EmbeddedFile {
  std::string_view name;  // file name, e.g. "console.js"
  std::string_view body;  // the file's bytes
};

// Every console file, in the order CMakeLists.txt lists them (defined in the generated source).
const std::vector<EmbeddedFile>& embedded_files();

// The file called `name`, or nullptr.
const EmbeddedFile* find_embedded_file(std::string_view name);

// "text/html; charset=utf-8" etc. by extension; "application/octet-stream" when unknown.
std::string_view content_type_for(std::string_view name);

}  // namespace fp8rl::console
