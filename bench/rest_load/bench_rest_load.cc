// fp8rl-bench-rest-load: N concurrent clients drive a coordinator's REST API for a fixed time,
// each in a loop of: submit a job, get it, watch it (REST has no stream: the poll a REST client
// does, GET the job then its metrics rows), list jobs (?limit=50), cancel it. One new connection
// per request (like curl). Prints per-operation counts and p50/p99/max latency, then checks that
// no answer was a 5xx or a transport error and that no job was lost: every job a 201 answered
// for is in the full list, and every job whose cancel was answered 200 ended CANCELLED (or had
// already ended). Exit status 1 when a check fails. bench/rest_load/run.sh runs it for
// docs/perf.md.
//   fp8rl-bench-rest-load --url http://127.0.0.1:8080 --job job.json [--clients 200] [--seconds 60]
//                         [--wait-on-429 1]   (wait out Retry-After after a refusal)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace fp8rl {
namespace {

using Clock = std::chrono::steady_clock;

enum Op { kSubmit, kGet, kWatch, kList, kCancel, kOps };
constexpr const char* kOpNames[kOps] = {"submit", "get", "watch", "list", "cancel"};

// What one client saw; merged after the run.
struct ClientLog {
  std::vector<double> ms[kOps];     // latency of every request of each operation
  std::map<int, int64_t> statuses;  // HTTP status (0: transport error) -> count
  std::vector<std::string> submitted;
  std::vector<std::string> cancelled;  // cancel answered 200
  std::vector<std::string> errors;     // first few unexpected answers, for the report
};

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string job_json;
  int clients = 200;
  double seconds = 60;
  // --wait-on-429: after a 429 the client waits its Retry-After (times a uniform 0.5-1.5 jitter)
  // before its next request, as fp8rl's clients do; off by default (the worst case).
  bool wait_on_429 = false;
};

// One request on a fresh connection; returns the status (0 on a transport error) and body, and
// the Retry-After seconds of a 429 in *retry_after (0 otherwise).
std::pair<int, std::string> request(const Options& o, const std::string& method,
                                    const std::string& path, const std::string& body, double* ms,
                                    int* retry_after = nullptr) {
  httplib::Client client(o.host, o.port);
  client.set_connection_timeout(30);
  client.set_read_timeout(60);
  const auto start = Clock::now();
  httplib::Result r =
      method == "POST" ? client.Post(path, body, "application/json") : client.Get(path);
  *ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (!r) return {0, httplib::to_string(r.error())};
  if (retry_after != nullptr) {
    *retry_after = 0;
    if (r->status == 429 && !absl::SimpleAtoi(r->get_header_value("Retry-After"), retry_after)) {
      *retry_after = 1;
    }
  }
  return {r->status, r->body};
}

void run_client(const Options& o, Clock::time_point end, ClientLog* log) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  auto call = [&](Op op, const std::string& method, const std::string& path,
                  const std::string& body, int want) {
    double ms = 0;
    int retry_after = 0;
    auto [status, text] = request(o, method, path, body, &ms, &retry_after);
    if (o.wait_on_429 && status == 429) {
      std::this_thread::sleep_for(std::chrono::duration<double>(retry_after * jitter(rng)));
    }
    log->ms[op].push_back(ms);
    ++log->statuses[status];
    if (status != want && log->errors.size() < 5) {
      log->errors.push_back(
          absl::StrCat(kOpNames[op], " ", path, ": ", status, " ", text.substr(0, 200)));
    }
    return std::make_pair(status, text);
  };
  while (Clock::now() < end) {
    auto [status, text] = call(kSubmit, "POST", "/v1/jobs", o.job_json, 201);
    if (status != 201) continue;
    const std::string id = nlohmann::json::parse(text, nullptr, false).value("id", "");
    if (id.empty()) continue;
    log->submitted.push_back(id);
    call(kGet, "GET", "/v1/jobs/" + id, "", 200);
    {
      // The watch: the job, then its rows; both timed as one operation.
      double ms1 = 0, ms2 = 0;
      auto a = request(o, "GET", "/v1/jobs/" + id, "", &ms1);
      auto b = request(o, "GET", "/v1/jobs/" + id + "/metrics", "", &ms2);
      log->ms[kWatch].push_back(ms1 + ms2);
      ++log->statuses[a.first];
      ++log->statuses[b.first];
      if ((a.first != 200 || b.first != 200) && log->errors.size() < 5) {
        log->errors.push_back(absl::StrCat("watch ", id, ": ", a.first, " ", b.first));
      }
    }
    call(kList, "GET", "/v1/jobs?limit=50", "", 200);
    auto [cancel_status, _] = call(kCancel, "POST", "/v1/jobs/" + id + ":cancel", "", 200);
    if (cancel_status == 200) log->cancelled.push_back(id);
  }
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

int usage(const char* error) {
  std::fprintf(stderr,
               "fp8rl-bench-rest-load: %s\nusage: fp8rl-bench-rest-load --url http://HOST:PORT "
               "--job FILE.json [--clients N] [--seconds S] [--wait-on-429 0|1]\n",
               error);
  return 2;
}

int main_impl(int argc, char** argv) {
  Options o;
  std::string url, job_file;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(absl::StrCat(a, ": missing value").c_str());
    const std::string v = argv[++i];
    if (a == "--url") {
      url = v;
    } else if (a == "--job") {
      job_file = v;
    } else if (a == "--clients") {
      if (!absl::SimpleAtoi(v, &o.clients) || o.clients < 1 || o.clients > 2000)
        return usage("--clients: expected an integer in [1, 2000]");
    } else if (a == "--wait-on-429") {
      if (v != "0" && v != "1") return usage("--wait-on-429: expected 0 or 1");
      o.wait_on_429 = v == "1";
    } else if (a == "--seconds") {
      if (!absl::SimpleAtod(v, &o.seconds) || !(o.seconds > 0) || o.seconds > 3600)
        return usage("--seconds: expected a number in (0, 3600]");
    } else {
      return usage(absl::StrCat("unknown flag ", a).c_str());
    }
  }
  const std::string prefix = "http://";
  const size_t colon = url.rfind(':');
  if (url.rfind(prefix, 0) != 0 || colon < prefix.size() ||
      !absl::SimpleAtoi(url.substr(colon + 1), &o.port)) {
    return usage("--url: expected http://HOST:PORT");
  }
  o.host = url.substr(prefix.size(), colon - prefix.size());
  std::ifstream in(job_file);
  if (!in) return usage(absl::StrCat("--job: cannot read '", job_file, "'").c_str());
  std::stringstream text;
  text << in.rdbuf();
  o.job_json = text.str();
  if (!nlohmann::json::parse(o.job_json, nullptr, false).is_object())
    return usage("--job: not a JSON object");

  std::vector<ClientLog> logs(o.clients);
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  const auto end =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  for (int c = 0; c < o.clients; ++c) {
    threads.emplace_back(run_client, std::cref(o), end, &logs[c]);
  }
  for (std::thread& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();

  ClientLog all;
  for (ClientLog& l : logs) {
    for (int op = 0; op < kOps; ++op)
      all.ms[op].insert(all.ms[op].end(), l.ms[op].begin(), l.ms[op].end());
    for (auto [s, n] : l.statuses) all.statuses[s] += n;
    all.submitted.insert(all.submitted.end(), l.submitted.begin(), l.submitted.end());
    all.cancelled.insert(all.cancelled.end(), l.cancelled.begin(), l.cancelled.end());
    for (auto& e : l.errors) {
      if (all.errors.size() < 10) all.errors.push_back(e);
    }
  }
  int64_t requests = 0;
  for (auto [s, n] : all.statuses) requests += n;
  std::printf("%d clients, %.1f s, %lld requests (%.0f/s), %zu jobs submitted\n", o.clients, wall,
              static_cast<long long>(requests), static_cast<double>(requests) / wall,
              all.submitted.size());
  std::printf("%-8s %8s %10s %10s %10s\n", "op", "count", "p50 ms", "p99 ms", "max ms");
  for (int op = 0; op < kOps; ++op) {
    std::vector<double>& v = all.ms[op];
    const size_t n = v.size();
    const double p50 = percentile(v, 0.50), p99 = percentile(v, 0.99);
    std::printf("%-8s %8zu %10.1f %10.1f %10.1f\n", kOpNames[op], n, p50, p99,
                v.empty() ? 0.0 : v.back());
  }
  std::printf("statuses:");
  for (auto [s, n] : all.statuses) std::printf(" %d:%lld", s, static_cast<long long>(n));
  std::printf("  (0 = transport error)\n");
  for (const std::string& e : all.errors) std::printf("unexpected: %s\n", e.c_str());

  bool ok = true;
  int64_t bad = 0;
  for (auto [s, n] : all.statuses) {
    if (s == 0 || s >= 500) bad += n;
  }
  if (bad > 0) {
    std::printf("FAIL: %lld answers were 5xx or transport errors\n", static_cast<long long>(bad));
    ok = false;
  }
  if (all.submitted.empty()) {
    std::printf("FAIL: no job was accepted\n");
    ok = false;
  }

  // No job lost: every accepted job is listed; every cancelled one ended CANCELLED or had ended
  // (a RUNNING job stops at its next phase boundary: allow 60 s).
  std::map<std::string, std::string> state;
  int64_t lost = 0, not_cancelled = 0;
  const auto settle = Clock::now() + std::chrono::seconds(60);
  do {
    double ms = 0;
    auto [status, body] = request(o, "GET", "/v1/jobs", "", &ms);
    const nlohmann::json listed = nlohmann::json::parse(body, nullptr, false);
    if (status != 200 || !listed.contains("jobs")) {
      std::printf("FAIL: final GET /v1/jobs: %d\n", status);
      return 1;
    }
    state.clear();
    for (const auto& j : listed["jobs"]) state[j.value("id", "")] = j.value("state", "");
    lost = not_cancelled = 0;
    for (const std::string& id : all.submitted) lost += state.count(id) ? 0 : 1;
    for (const std::string& id : all.cancelled) {
      const std::string& s = state[id];
      if (s != "CANCELLED" && s != "SUCCEEDED" && s != "FAILED") ++not_cancelled;
    }
    if (not_cancelled > 0) std::this_thread::sleep_for(std::chrono::seconds(1));
  } while (not_cancelled > 0 && Clock::now() < settle);
  std::printf("final list: %zu jobs; lost %lld of %zu accepted; %lld of %zu cancelled not ended\n",
              state.size(), static_cast<long long>(lost), all.submitted.size(),
              static_cast<long long>(not_cancelled), all.cancelled.size());
  if (lost > 0 || not_cancelled > 0) ok = false;
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace fp8rl

int main(int argc, char** argv) { return fp8rl::main_impl(argc, argv); }
