// Fuzz target: a POST /v1/jobs body through the coordinator's REST handler (strict JSON parse,
// job-config schema, range limits, path roots, inline model config checks) into an in-memory job
// store. The answer must be 201 or a 4xx JSON error with a message, never a crash or a 5xx: bad
// input is the client's fault.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "services/coordinator/job_manager.h"
#include "services/coordinator/job_store.h"
#include "services/coordinator/rest_api.h"

namespace {

namespace stdfs = std::filesystem;

// Roots like a deployed coordinator's: data/, models/ with the tiny model config at
// configs/models/tiny.json (the seeds' model.init.config), datasets/ with a small train file.
const fp8rl::rl::JobPathRoots& roots() {
  static const fp8rl::rl::JobPathRoots* const kRoots = [] {
    const stdfs::path base =
        stdfs::temp_directory_path() / ("fp8rl-fuzz-rest-" + std::to_string(::getpid()));
    stdfs::create_directories(base / "data");
    stdfs::create_directories(base / "models/configs/models");
    stdfs::create_directories(base / "datasets");
    std::ofstream(base / "models/configs/models/tiny.json")
        << R"({"model_type": "llama", "vocab_size": 272, "hidden_size": 128,
               "intermediate_size": 352, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 512,
               "tie_word_embeddings": true, "bos_token_id": 256, "eos_token_id": 257})";
    std::ofstream(base / "datasets/train.jsonl") << R"({"prompt": "1+1=", "answer": "2"})"
                                                 << "\n";
    auto* r = new fp8rl::rl::JobPathRoots{(base / "data").string(), (base / "models").string(),
                                          (base / "datasets").string()};
    std::atexit([] {
      std::error_code ec;
      stdfs::remove_all(stdfs::path(roots().data_root).parent_path(), ec);
    });
    return r;
  }();
  return *kRoots;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto store = fp8rl::coordinator::JobStore::open(":memory:");
  if (!store.ok()) __builtin_trap();
  fp8rl::coordinator::JobManager jobs(store->get(), nullptr, nullptr, nullptr);
  jobs.set_path_roots(roots());
  fp8rl::service::HttpRequest req;
  req.method = "POST";
  req.path = "/v1/jobs";
  req.body.assign(reinterpret_cast<const char*>(data), size);
  const fp8rl::service::HttpResponse response = fp8rl::coordinator::submit_job_request(jobs, req);
  if (response.status != 201 && (response.status < 400 || response.status > 499)) __builtin_trap();
  const nlohmann::json body = nlohmann::json::parse(response.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) __builtin_trap();
  if (response.status != 201) {
    auto it = body.find("error");
    if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) __builtin_trap();
  }
  return 0;
}
