// JobService client, job-config preparation and the text views of jobs for the fp8rl CLI.
#include "tools/fp8rl/job_client.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fs.h"
#include "common/service/grpc_server.h"
#include "rl/job_config.h"
#include "rl/step_metric_schema.h"

namespace fp8rl::cli {
namespace {

constexpr auto kCallTimeout = std::chrono::seconds(30);

void set_deadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
}

// Phases in loop order; other time_*_seconds keys are appended alphabetically.
const char* const kPhaseOrder[] = {"sft",     "generate", "score",    "train",
                                   "publish", "sync",     "validate", "checkpoint"};

std::vector<std::string> phases_of(const std::vector<v1::StepMetrics>& rows) {
  std::set<std::string> found;
  for (const v1::StepMetrics& row : rows) {
    for (const auto& [key, value] : row.values()) {
      if (key.starts_with("time_") && key.ends_with("_seconds") && key != "time_step_seconds") {
        found.insert(key.substr(5, key.size() - 13));
      }
    }
  }
  std::vector<std::string> out;
  for (const char* p : kPhaseOrder) {
    if (found.erase(p) > 0) out.push_back(p);
  }
  out.insert(out.end(), found.begin(), found.end());
  return out;
}

const double* find_value(const v1::StepMetrics& row, const std::string& key) {
  auto it = row.values().find(key);
  return it == row.values().end() ? nullptr : &it->second;
}

std::string format_time_ms(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

// Mean of `key` over the RL steps (step >= 1) that have it; NaN when none.
double mean_over_steps(const std::vector<v1::StepMetrics>& rows, const std::string& key) {
  double sum = 0.0;
  int n = 0;
  for (const v1::StepMetrics& row : rows) {
    if (row.step() < 1) continue;
    if (const double* v = find_value(row, key)) {
      sum += *v;
      ++n;
    }
  }
  return n == 0 ? std::nan("") : sum / n;
}

// The server's push-back (grpc-retry-pushback-ms trailing metadata), when it sent one.
std::optional<std::chrono::milliseconds> pushback_of(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find("grpc-retry-pushback-ms");
  if (it == trailers.end()) return std::nullopt;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &ms) || ms < 0) {
    return std::nullopt;
  }
  return std::chrono::milliseconds(ms);
}

}  // namespace

std::chrono::milliseconds retry_delay(const RetryPolicy& policy, int retry,
                                      std::optional<std::chrono::milliseconds> hint, double u) {
  double backoff = static_cast<double>(policy.initial_backoff.count());
  for (int i = 1; i < retry && backoff < policy.max_backoff.count(); ++i) backoff *= 2;
  backoff = std::min(backoff, static_cast<double>(policy.max_backoff.count()));
  const auto jittered =
      std::chrono::milliseconds(static_cast<int64_t>(backoff / 2 + u * (backoff / 2)));
  return hint.has_value() ? std::max(jittered, *hint) : jittered;
}

// ---------------------------------------------------------------------------------------------
// JobClient

JobClient::JobClient(std::string address, std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      channel_(std::move(channel)),
      stub_(v1::JobService::NewStub(channel_)) {}

absl::StatusOr<service::ClientSecurity> cli_security(const Args* args) {
  auto setting = [&](const char* flag, const char* env) -> std::string {
    if (args != nullptr) {
      if (std::optional<std::string> v = args->get(flag)) return *v;
    }
    const char* value = std::getenv(env);
    return value != nullptr ? value : "";
  };
  std::string token;
  if (std::optional<std::string> file = args != nullptr ? args->get("token-file") : std::nullopt) {
    absl::StatusOr<std::string> t = service::read_token_file(*file, "--token-file");
    if (!t.ok()) return t.status();
    token = *t;
  } else if (const char* env = std::getenv("FP8RL_TOKEN"); env != nullptr && *env != '\0') {
    token = env;
    if (token.find_first_of(" \t\r\n") != std::string::npos) {
      return absl::InvalidArgumentError("FP8RL_TOKEN: a token has no whitespace");
    }
  }
  service::TlsFiles tls{setting("tls-cert", "FP8RL_TLS_CERT"), setting("tls-key", "FP8RL_TLS_KEY"),
                        setting("tls-ca", "FP8RL_TLS_CA")};
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert/--tls-key (or FP8RL_TLS_CERT/FP8RL_TLS_KEY): give both or neither");
  }
  return service::client_security(tls, std::move(token));
}

absl::StatusOr<std::unique_ptr<JobClient>> JobClient::connect(
    const std::string& address, std::chrono::milliseconds timeout,
    const service::ClientSecurity& security) {
  const size_t colon = address.rfind(':');
  if (address.empty() || colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator: expected host:port, got '", address, "'"));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  service::set_reconnect_backoff(&args);  // a restarted coordinator is seen within ~2 s
  std::shared_ptr<grpc::Channel> channel = service::make_channel(address, args, security);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + timeout)) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the coordinator at ", address, " (no answer within ",
        absl::StrFormat("%.1f", timeout.count() / 1000.0),
        " s); is it running? start one with `fp8rl up` or pass --coordinator HOST:PORT",
        security.tls ? "; with TLS, check that --tls-ca signed its certificate" : ""));
  }
  return std::unique_ptr<JobClient>(new JobClient(address, std::move(channel)));
}

absl::Status JobClient::to_status(const grpc::Status& status, const std::string& what) const {
  if (status.ok()) return absl::OkStatus();
  const absl::StatusCode code = static_cast<absl::StatusCode>(status.error_code());
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(
          absl::StrCat("cannot reach the coordinator at ", address_, ": ", status.error_message()));
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::UnauthenticatedError(absl::StrCat(
          what, ": the coordinator at ", address_, " refused: ", status.error_message(),
          " (set FP8RL_TOKEN or pass --token-file FILE)"));
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return absl::ResourceExhaustedError(absl::StrCat(what, ": the coordinator at ", address_,
                                                       " refused: ", status.error_message()));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": the coordinator at ", address_, " did not answer in time"));
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return absl::Status(code, status.error_message());
    default:
      return absl::Status(code, absl::StrCat(what, ": ", status.error_message()));
  }
}

grpc::Status JobClient::with_retries(
    const char* what, bool idempotent,
    const std::function<grpc::Status(grpc::ClientContext&)>& call) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int tries = 1;; ++tries) {
    grpc::ClientContext context;
    set_deadline(context);
    const grpc::Status s = call(context);
    const bool overloaded = s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    const bool unavailable = idempotent && s.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (!overloaded && !unavailable) return s;
    const int limit = overloaded ? retry_.max_tries : retry_.max_unavailable_tries;
    const std::chrono::milliseconds delay =
        retry_delay(retry_, tries, pushback_of(context), uniform(rng));
    const auto elapsed = Clock::now() - start;
    if (tries >= limit || elapsed + delay > retry_.budget) {
      return grpc::Status(s.error_code(),
                          absl::StrFormat("%s; gave up after %d tries in %.1f s", s.error_message(),
                                          tries, std::chrono::duration<double>(elapsed).count()));
    }
    std::fprintf(stderr, "fp8rl: %s: %s (%s); retrying in %.1f s (try %d of %d)\n", what,
                 overloaded ? "coordinator overloaded" : "coordinator unavailable",
                 s.error_message().c_str(), delay.count() / 1000.0, tries + 1, limit);
    std::this_thread::sleep_for(delay);
  }
}

absl::StatusOr<v1::Job> JobClient::submit(const std::string& config) {
  v1::SubmitJobRequest request;
  request.set_config(config);
  v1::SubmitJobResponse response;
  grpc::Status s = with_retries("SubmitJob", false, [&](grpc::ClientContext& context) {
    response.Clear();
    return stub_->SubmitJob(&context, request, &response);
  });
  if (!s.ok()) return to_status(s, "SubmitJob");
  return response.job();
}

absl::StatusOr<v1::Job> JobClient::get(const std::string& id) {
  v1::GetJobRequest request;
  request.set_id(id);
  v1::Job job;
  grpc::Status s = with_retries("GetJob", true, [&](grpc::ClientContext& context) {
    job.Clear();
    return stub_->GetJob(&context, request, &job);
  });
  if (!s.ok()) return to_status(s, "GetJob");
  return job;
}

absl::StatusOr<std::vector<v1::Job>> JobClient::list(v1::JobState state, int limit) {
  v1::ListJobsRequest request;
  request.set_state(state);
  request.set_limit(limit);
  v1::ListJobsResponse response;
  grpc::Status s = with_retries("ListJobs", true, [&](grpc::ClientContext& context) {
    response.Clear();
    return stub_->ListJobs(&context, request, &response);
  });
  if (!s.ok()) return to_status(s, "ListJobs");
  return std::vector<v1::Job>(response.jobs().begin(), response.jobs().end());
}

absl::StatusOr<v1::Job> JobClient::cancel(const std::string& id) {
  v1::CancelJobRequest request;
  request.set_id(id);
  v1::CancelJobResponse response;
  grpc::Status s = with_retries("CancelJob", true, [&](grpc::ClientContext& context) {
    response.Clear();
    return stub_->CancelJob(&context, request, &response);
  });
  if (!s.ok()) return to_status(s, "CancelJob");
  return response.job();
}

absl::StatusOr<std::vector<v1::StepMetrics>> JobClient::metrics(const std::string& id) {
  v1::GetJobMetricsRequest request;
  request.set_id(id);
  v1::GetJobMetricsResponse response;
  grpc::Status s = with_retries("GetJobMetrics", true, [&](grpc::ClientContext& context) {
    response.Clear();
    return stub_->GetJobMetrics(&context, request, &response);
  });
  if (!s.ok()) return to_status(s, "GetJobMetrics");
  std::vector<v1::StepMetrics> rows(response.steps().begin(), response.steps().end());
  std::sort(rows.begin(), rows.end(),
            [](const v1::StepMetrics& a, const v1::StepMetrics& b) { return a.step() < b.step(); });
  return rows;
}

absl::StatusOr<std::vector<v1::JobFaultEvent>> JobClient::events(const std::string& id) {
  v1::GetJobEventsRequest request;
  request.set_id(id);
  v1::GetJobEventsResponse response;
  grpc::Status s = with_retries("GetJobEvents", true, [&](grpc::ClientContext& context) {
    response.Clear();
    return stub_->GetJobEvents(&context, request, &response);
  });
  if (!s.ok()) return to_status(s, "GetJobEvents");
  return std::vector<v1::JobFaultEvent>(response.events().begin(), response.events().end());
}

absl::Status JobClient::watch(const std::string& id,
                              const std::function<bool(const v1::Job&)>& on_event) {
  using Clock = std::chrono::steady_clock;
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  // A refused (RESOURCE_EXHAUSTED) or broken (UNAVAILABLE) stream is opened again under retry_;
  // the tries and the time budget count from the last event received, so a watch of a long job
  // survives one coordinator restart after another. The new stream starts with the job as it is
  // now, so `on_event` may see the same state twice.
  auto since = Clock::now();
  for (int tries = 1;; ++tries) {
    grpc::ClientContext context;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      if (watch_stopped_) return absl::CancelledError("watch stopped");
      watch_context_ = &context;
    }
    v1::WatchJobRequest request;
    request.set_id(id);
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);
    v1::JobEvent event;
    bool terminal = false;
    bool stopped_by_caller = false;
    bool got_event = false;
    while (reader->Read(&event)) {
      got_event = true;
      if (!on_event(event.job())) {
        stopped_by_caller = true;
        context.TryCancel();
        break;
      }
      if (is_terminal(event.job().state())) {
        terminal = true;
        break;
      }
    }
    if (!terminal && !stopped_by_caller) {
      // Drain so Finish() reports the stream's real status.
      while (reader->Read(&event)) {
      }
    }
    grpc::Status s = reader->Finish();
    bool stopped;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      watch_context_ = nullptr;
      stopped = watch_stopped_;
    }
    if (terminal || stopped_by_caller) return absl::OkStatus();
    if (stopped) return absl::CancelledError("watch stopped");
    if (got_event) {
      tries = 1;
      since = Clock::now();
    }
    // A stream the server ended cleanly before the job did (a coordinator shutting down) is
    // treated as unavailable.
    const bool ended_early = s.ok();
    const bool overloaded = s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    const bool unavailable = ended_early || s.error_code() == grpc::StatusCode::UNAVAILABLE;
    const std::string message = ended_early ? absl::StrCat("the coordinator at ", address_,
                                                           " ended the watch before the job ended")
                                            : s.error_message();
    if (!overloaded && !unavailable) return to_status(s, "WatchJob");
    const int limit = overloaded ? retry_.max_tries : retry_.max_unavailable_tries;
    const std::chrono::milliseconds delay =
        retry_delay(retry_, tries, pushback_of(context), uniform(rng));
    const auto elapsed = Clock::now() - since;
    if (tries >= limit || elapsed + delay > retry_.budget) {
      const std::string gave_up =
          absl::StrFormat("%s; gave up after %d tries in %.1f s", message, tries,
                          std::chrono::duration<double>(elapsed).count());
      if (ended_early) return absl::UnavailableError(gave_up);
      return to_status(grpc::Status(s.error_code(), gave_up), "WatchJob");
    }
    std::fprintf(stderr, "fp8rl: WatchJob: %s (%s); retrying in %.1f s (try %d of %d)\n",
                 overloaded ? "coordinator overloaded" : "coordinator unavailable", message.c_str(),
                 delay.count() / 1000.0, tries + 1, limit);
    // Sleep in slices so stop_watch() ends the wait at once.
    const auto wake = Clock::now() + delay;
    while (Clock::now() < wake) {
      {
        std::lock_guard<std::mutex> lock(watch_mu_);
        if (watch_stopped_) return absl::CancelledError("watch stopped");
      }
      std::this_thread::sleep_for(
          std::min<Clock::duration>(std::chrono::milliseconds(50), wake - Clock::now()));
    }
  }
}

void JobClient::stop_watch() {
  std::lock_guard<std::mutex> lock(watch_mu_);
  watch_stopped_ = true;
  if (watch_context_ != nullptr) watch_context_->TryCancel();
}

// ---------------------------------------------------------------------------------------------
// ProgressPrinter

void ProgressPrinter::print_progress(const v1::JobProgress& progress) {
  const std::string& phase = progress.phase();
  if (phase.empty()) return;
  bool print = phase != last_phase_;
  if (phase == "sft") {
    // The start, every tenth of the SFT steps and the last one.
    const int64_t every = std::max<int64_t>(1, progress.total() / 10);
    print = progress.done() > last_sft_printed_ &&
            (progress.done() == 0 || progress.done() == progress.total() ||
             progress.done() / every > std::max<int64_t>(last_sft_printed_, 0) / every);
    if (print) last_sft_printed_ = progress.done();
  }
  last_phase_ = phase;
  if (!print) return;
  const std::string line = format_progress_line(progress);
  if (line.empty()) return;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

absl::Status ProgressPrinter::update(const v1::Job& job) {
  if (job.has_progress()) print_progress(job.progress());
  const std::string key = absl::StrCat(
      job.state(), "/", job.step(), "/", job.latest_metrics().step(), "/",
      job.latest_metrics().recorded_unix_ms(), "/", job.latest_metrics().values_size());
  if (key == last_key_) return absl::OkStatus();
  last_key_ = key;
  if (job.latest_metrics().values().empty() && !is_terminal(job.state())) return absl::OkStatus();
  return fetch_and_print(job.id(), job.total_steps());
}

absl::Status ProgressPrinter::finish(const std::string& job_id, int64_t total_steps) {
  return fetch_and_print(job_id, total_steps);
}

absl::Status ProgressPrinter::fetch_and_print(const std::string& job_id, int64_t total_steps) {
  absl::StatusOr<std::vector<v1::StepMetrics>> rows = client_->metrics(job_id);
  if (!rows.ok()) return rows.status();
  rows_ = std::move(*rows);
  for (const v1::StepMetrics& row : rows_) {
    if (row.step() <= printed_through_) continue;
    std::fprintf(out_, "%s\n", format_step_line(row, total_steps).c_str());
    printed_through_ = row.step();
  }
  std::fflush(out_);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Job configs

absl::StatusOr<std::string> prepare_job_config(const std::string& path,
                                               const std::string& working_dir) {
  namespace fs = std::filesystem;
  absl::StatusOr<std::string> text = read_text_file(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat("cannot read job config '", path,
                                                           "': ", text.status().message()));
  }
  std::vector<std::string> warnings;
  absl::StatusOr<rl::JobConfig> config = rl::parse_job_config(*text, &warnings);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  for (const std::string& w : warnings)
    std::fprintf(stderr, "warning: %s: %s\n", path.c_str(), w.c_str());
  const std::string config_dir = fs::absolute(fs::path(path)).parent_path().string();
  rl::JobConfig from_cwd = *config;
  rl::JobConfig from_dir = *config;
  rl::resolve_paths(from_cwd, working_dir);
  rl::resolve_paths(from_dir, config_dir);
  struct Input {
    const char* field;
    const std::string* original;
    std::string* out;
    const std::string* cwd_candidate;
    const std::string* dir_candidate;
  };
  rl::JobConfig result = from_cwd;  // checkpoint.dir (an output) stays relative to working_dir
  const Input inputs[] = {
      {"model.checkpoint", &config->model.checkpoint, &result.model.checkpoint,
       &from_cwd.model.checkpoint, &from_dir.model.checkpoint},
      {"model.init.config", &config->model.init_config_path, &result.model.init_config_path,
       &from_cwd.model.init_config_path, &from_dir.model.init_config_path},
      {"task.params.train_path", &config->task.train_path, &result.task.train_path,
       &from_cwd.task.train_path, &from_dir.task.train_path},
      {"task.params.val_path", &config->task.val_path, &result.task.val_path,
       &from_cwd.task.val_path, &from_dir.task.val_path},
  };
  for (const Input& in : inputs) {
    if (in.original->empty() || fs::path(*in.original).is_absolute()) continue;
    std::error_code ec;
    if (fs::exists(*in.cwd_candidate, ec)) {
      *in.out = *in.cwd_candidate;
    } else if (fs::exists(*in.dir_candidate, ec)) {
      *in.out = *in.dir_candidate;
    } else {
      return absl::NotFoundError(
          absl::StrCat(path, ": ", in.field, ": '", *in.original, "' not found in ", working_dir,
                       " or in ", config_dir,
                       " (relative paths are looked up in the working directory, then in the "
                       "config's folder)"));
    }
  }
  return rl::job_config_to_json(result).dump();
}

// ---------------------------------------------------------------------------------------------
// Text views

std::string job_state_name(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_QUEUED:
      return "QUEUED";
    case v1::JOB_STATE_RUNNING:
      return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED:
      return "SUCCEEDED";
    case v1::JOB_STATE_FAILED:
      return "FAILED";
    case v1::JOB_STATE_CANCELLED:
      return "CANCELLED";
    default:
      return "UNSPECIFIED";
  }
}

bool is_terminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

absl::StatusOr<v1::JobState> parse_job_state(const std::string& text) {
  std::string upper = absl::AsciiStrToUpper(text);
  if (upper.starts_with("JOB_STATE_")) upper = upper.substr(10);
  for (v1::JobState s : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
                         v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    if (upper == job_state_name(s)) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--state: must be one of queued, running, succeeded, failed, cancelled, got '", text, "'"));
}

std::string format_job_details(const v1::Job& job) {
  std::string out;
  absl::StrAppend(&out, "id:       ", job.id(), "\n");
  absl::StrAppend(&out, "state:    ", job_state_name(job.state()), "\n");
  absl::StrAppend(&out, "step:     ", job.step(), "/", job.total_steps(), "\n");
  absl::StrAppend(&out, "created:  ", format_time_ms(job.created_unix_ms()), "\n");
  absl::StrAppend(&out, "updated:  ", format_time_ms(job.updated_unix_ms()), "\n");
  if (!job.error().empty()) absl::StrAppend(&out, "error:    ", job.error(), "\n");
  if (job.has_progress() && !job.progress().phase().empty()) {
    const v1::JobProgress& p = job.progress();
    absl::StrAppend(&out, "phase:    ", p.phase());
    if (p.total() > 0) absl::StrAppend(&out, " ", p.done(), "/", p.total());
    if (!p.detail().empty()) absl::StrAppend(&out, " (", p.detail(), ")");
    absl::StrAppend(&out, "\n");
  }
  if (job.has_latest_metrics() && !job.latest_metrics().values().empty()) {
    absl::StrAppend(&out, "metrics at step ", job.latest_metrics().step(), ":\n");
    std::map<std::string, double> sorted(job.latest_metrics().values().begin(),
                                         job.latest_metrics().values().end());
    for (const auto& [key, value] : sorted) {
      absl::StrAppend(&out, absl::StrFormat("  %-28s %.6g\n", key, value));
    }
  }
  return out;
}

std::string format_job_events(const std::vector<v1::JobFaultEvent>& events) {
  if (events.empty()) return "";
  std::string out = "events:\n";
  for (const v1::JobFaultEvent& e : events) {
    absl::StrAppend(&out, "  ", format_time_ms(e.recorded_unix_ms()), "  ", e.kind(), ": ",
                    e.message(), "\n");
  }
  return out;
}

std::string format_job_table(const std::vector<v1::Job>& jobs) {
  std::string out =
      absl::StrFormat("%-36s %-10s %-9s %-21s %s\n", "ID", "STATE", "STEP", "CREATED", "ERROR");
  for (const v1::Job& job : jobs) {
    absl::StrAppend(
        &out, absl::StrFormat("%-36s %-10s %-9s %-21s %s\n", job.id(), job_state_name(job.state()),
                              absl::StrCat(job.step(), "/", job.total_steps()),
                              format_time_ms(job.created_unix_ms()), job.error()));
  }
  if (jobs.empty()) absl::StrAppend(&out, "(no jobs)\n");
  return out;
}

std::string format_progress_line(const v1::JobProgress& p) {
  const std::string& phase = p.phase();
  if (phase == "sft") {
    const int width = static_cast<int>(std::to_string(std::max<int64_t>(p.total(), 1)).size());
    std::string out = absl::StrFormat("sft  %*d/%d", width, p.done(), p.total());
    if (!p.detail().empty()) absl::StrAppend(&out, "  ", p.detail());
    return out;
  }
  if (phase == "waiting_for_trainer") return "waiting for a trainer";
  if (phase == "initializing") return "initializing the policy on the trainer";
  if (phase == "loading_checkpoint") return absl::StrCat("resuming from checkpoint ", p.detail());
  if (phase == "syncing_weights") return "publishing the weights to the generation workers";
  if (phase == "validating") return "validating the starting policy";
  if (phase == "trainer_lost") return absl::StrCat("trainer lost: ", p.detail());
  if (phase == "rl") return "";
  return absl::StrCat(phase, p.total() > 0 ? absl::StrCat(" ", p.done(), "/", p.total()) : "",
                      p.detail().empty() ? "" : absl::StrCat("  ", p.detail()));
}

std::string format_step_line(const v1::StepMetrics& row, int64_t total_steps) {
  const int width = static_cast<int>(std::to_string(std::max<int64_t>(total_steps, 1)).size());
  std::string out = absl::StrFormat("step %*d/%d", width, row.step(), total_steps);
  auto add_fixed = [&](const char* label, const std::string& key, int precision) {
    if (const double* v = find_value(row, key)) {
      absl::StrAppend(&out, "  ", label, " ", absl::StrFormat("%.*f", precision, *v));
    }
  };
  if (row.step() == 0) absl::StrAppend(&out, "  before RL:");
  add_fixed("reward", "reward_mean", 3);
  add_fixed("val_acc", "val_accuracy", 3);
  add_fixed("mult_prob_err", "token_mult_prob_error", 4);
  add_fixed("is_ratio", "sampling_importance_ratio", 4);
  std::string phases;
  for (const std::string& phase : phases_of({row})) {
    if (const double* v = find_value(row, absl::StrCat("time_", phase, "_seconds"))) {
      absl::StrAppend(&phases, phases.empty() ? "" : " ", phase, " ", absl::StrFormat("%.2fs", *v));
    }
  }
  if (!phases.empty()) absl::StrAppend(&out, "  | ", phases);
  if (const double* v = find_value(row, "time_step_seconds")) {
    absl::StrAppend(&out, absl::StrFormat("  | step %.2fs", *v));
  }
  return out;
}

std::string format_summary(const v1::Job& job, const std::vector<v1::StepMetrics>& rows,
                           double wall_seconds) {
  std::string out = absl::StrCat("=== job ", job.id(), ": ", job_state_name(job.state()));
  absl::StrAppend(&out, " after ", job.step(), "/", job.total_steps(), " steps ===\n");
  if (!job.error().empty()) absl::StrAppend(&out, "error:               ", job.error(), "\n");

  // Accuracy: row 0 is the starting policy; "after" is the last evaluated RL step.
  const v1::StepMetrics* before = nullptr;
  const v1::StepMetrics* after = nullptr;
  const v1::StepMetrics* best = nullptr;
  for (const v1::StepMetrics& row : rows) {
    const double* acc = find_value(row, "val_accuracy");
    if (acc == nullptr) continue;
    if (row.step() == 0) before = &row;
    if (row.step() > 0) after = &row;
    if (best == nullptr || *acc > *find_value(*best, "val_accuracy")) best = &row;
  }
  auto acc_text = [](const v1::StepMetrics* row) {
    return row == nullptr
               ? std::string("n/a")
               : absl::StrFormat("%.3f (step %d)", *find_value(*row, "val_accuracy"), row->step());
  };
  absl::StrAppend(&out, "val accuracy before: ", acc_text(before), "\n");
  absl::StrAppend(&out, "val accuracy after:  ", acc_text(after), "\n");
  absl::StrAppend(&out, "val accuracy best:   ", acc_text(best), "\n");
  if (before != nullptr && after != nullptr) {
    absl::StrAppend(&out, absl::StrFormat("accuracy change:     %+.3f\n",
                                          *find_value(*after, "val_accuracy") -
                                              *find_value(*before, "val_accuracy")));
  }

  // The step metrics with a summary (rl/step_metric_schema.h: the mismatch metrics of
  // docs/design/mismatch.md), folded over the RL steps.
  std::string mismatch;
  for (const rl::StepMetricDef& def : rl::kStepMetrics) {
    const std::string key(def.name);
    double value = std::nan("");
    switch (def.summary) {
      case rl::StepSummary::kNone:
        continue;
      case rl::StepSummary::kMean:
        value = mean_over_steps(rows, key);
        break;
      case rl::StepSummary::kMin:
      case rl::StepSummary::kMax:
        for (const v1::StepMetrics& row : rows) {
          const double* v = find_value(row, key);
          if (v == nullptr) continue;
          value = std::isnan(value)                      ? *v
                  : def.summary == rl::StepSummary::kMin ? std::min(value, *v)
                                                         : std::max(value, *v);
        }
        break;
    }
    if (!std::isnan(value)) {
      absl::StrAppend(&mismatch, absl::StrFormat("  %-26s %.6f\n", key, value));
    }
  }
  if (!mismatch.empty()) {
    absl::StrAppend(&out, "mismatch (mean over RL steps; min/max for probs ratio):\n", mismatch);
  }

  // Time split by phase, summed over every row.
  std::vector<std::pair<std::string, double>> split;
  double phase_total = 0.0;
  for (const std::string& phase : phases_of(rows)) {
    double sum = 0.0;
    for (const v1::StepMetrics& row : rows) {
      if (const double* v = find_value(row, absl::StrCat("time_", phase, "_seconds"))) sum += *v;
    }
    split.emplace_back(phase, sum);
    phase_total += sum;
  }
  if (!split.empty()) {
    absl::StrAppend(&out, "time by phase:\n");
    for (const auto& [phase, secs] : split) {
      absl::StrAppend(&out, absl::StrFormat("  %-12s %9.2f s  %5.1f%%\n", phase, secs,
                                            phase_total > 0 ? 100.0 * secs / phase_total : 0.0));
    }
  }
  absl::StrAppend(&out, absl::StrFormat("total time:          %.1f s (%d metric rows)\n",
                                        wall_seconds, rows.size()));
  return out;
}

}  // namespace fp8rl::cli
