// SQLite-backed job store (see job_store.h). One connection guarded by a mutex; every write is
// a single statement, so a crash never leaves a half-updated job.
#include "services/coordinator/job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <random>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace fp8rl::coordinator {
namespace {

constexpr JobState kAllStates[] = {JobState::kQueued, JobState::kRunning, JobState::kSucceeded,
                                   JobState::kFailed, JobState::kCancelled};

// A prepared statement with typed binds; finalized on destruction.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    status_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status ok() const {
    if (status_ == SQLITE_OK) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("job store: ", sqlite3_errmsg(db_)));
  }
  void bind(int index, const std::string& value) {
    sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  }
  void bind(int index, int64_t value) { sqlite3_bind_int64(stmt_, index, value); }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int step() { return sqlite3_step(stmt_); }
  absl::Status run() {
    if (absl::Status s = ok(); !s.ok()) return s;
    const int rc = step();
    if (rc == SQLITE_DONE || rc == SQLITE_ROW) return absl::OkStatus();
    switch (rc & 0xff) {  // the primary result code
      case SQLITE_FULL:
      case SQLITE_READONLY:
      case SQLITE_IOERR:
      case SQLITE_BUSY:
      case SQLITE_LOCKED:
        // The storage under the store refused the write (a full or read-only disk, an I/O
        // error, a lock held too long): nothing was written, and the same call can succeed once
        // that is fixed, so callers see UNAVAILABLE (HTTP 503), not an internal error.
        return absl::UnavailableError(absl::StrCat("job store: ", sqlite3_errmsg(db_),
                                                   " (nothing was written)", system_error()));
      default:
        return absl::InternalError(absl::StrCat("job store: ", sqlite3_errmsg(db_)));
    }
  }
  std::string text(int column) const {
    const auto* p = sqlite3_column_text(stmt_, column);
    return p == nullptr ? std::string()
                        : std::string(reinterpret_cast<const char*>(p),
                                      static_cast<size_t>(sqlite3_column_bytes(stmt_, column)));
  }
  int64_t integer(int column) const { return sqlite3_column_int64(stmt_, column); }
  int changes() const { return sqlite3_changes(db_); }
  // ": <why>" when the storage says why it refused a write, which SQLite's own text ("disk I/O
  // error") does not: the OS error of the failed call when SQLite kept it, else what the
  // database's folder answers now (a file system that an I/O error turned read-only still shows
  // "rw" in statvfs, so a probe file is created and removed); "" when neither tells.
  std::string system_error() const {
    auto text = [](int err) {
      return absl::StrCat(": ", std::error_code(err, std::generic_category()).message());
    };
    if (const int err = sqlite3_system_errno(db_); err != 0) return text(err);
    const char* file = sqlite3_db_filename(db_, "main");
    if (file == nullptr || *file == '\0') return "";  // in memory
    const std::filesystem::path folder = std::filesystem::path(file).parent_path();
    struct statvfs fs;
    if (statvfs(folder.empty() ? "." : folder.c_str(), &fs) == 0) {
      if ((fs.f_flag & ST_RDONLY) != 0) return text(EROFS);
      if (fs.f_bavail == 0) return text(ENOSPC);
    }
    const std::string probe = absl::StrCat(file, ".probe.", static_cast<long>(::getpid()));
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return text(errno);
    ::close(fd);
    ::unlink(probe.c_str());
    return "";
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int status_ = SQLITE_OK;
};

constexpr const char* kJobColumns =
    "id, state, config_json, step, total_steps, error, resume, checkpoint, checkpoint_step, "
    "created_ms, updated_ms";

JobRecord read_job(const Statement& s) {
  JobRecord job;
  job.id = s.text(0);
  job.state = parse_job_state(s.text(1)).value_or(JobState::kFailed);
  job.config_json = s.text(2);
  job.step = s.integer(3);
  job.total_steps = s.integer(4);
  job.error = s.text(5);
  job.resume = s.integer(6) != 0;
  job.checkpoint = s.text(7);
  job.checkpoint_step = s.integer(8);
  job.created_ms = s.integer(9);
  job.updated_ms = s.integer(10);
  return job;
}

absl::Status not_found(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
}

std::string new_job_id() {
  static std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("job-%d-%06x", now_unix_ms(), rng() & 0xFFFFFF);
}

MetricsRow read_metrics(const Statement& s) {
  MetricsRow row;
  row.step = s.integer(0);
  row.recorded_ms = s.integer(2);
  const auto json = nlohmann::json::parse(s.text(1), nullptr, /*allow_exceptions=*/false);
  if (json.is_object()) {
    for (const auto& [key, value] : json.items()) {
      if (value.is_number()) row.values[key] = value.get<double>();
    }
  }
  return row;
}

}  // namespace

int64_t now_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string_view job_state_name(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "FAILED";
}

absl::StatusOr<JobState> parse_job_state(std::string_view name) {
  for (JobState state : kAllStates) {
    if (job_state_name(state) == name) return state;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("state: must be one of QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED; got '",
                   std::string(name), "'"));
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string message = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("job store: cannot open '", path, "': ", message));
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<JobStore> store(new JobStore(db));
  for (const char* sql : {
           "PRAGMA journal_mode=WAL",
           "PRAGMA synchronous=FULL",  // a commit is on disk before the call returns
           "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL, "
           "config_json TEXT NOT NULL, step INTEGER NOT NULL DEFAULT 0, total_steps INTEGER NOT "
           "NULL, error TEXT NOT NULL DEFAULT '', resume INTEGER NOT NULL DEFAULT 0, checkpoint "
           "TEXT NOT NULL DEFAULT '', checkpoint_step INTEGER NOT NULL DEFAULT 0, created_ms "
           "INTEGER NOT NULL, updated_ms INTEGER NOT NULL)",
           "CREATE TABLE IF NOT EXISTS metrics (job_id TEXT NOT NULL, step INTEGER NOT NULL, "
           "metrics_json TEXT NOT NULL, recorded_ms INTEGER NOT NULL, PRIMARY KEY (job_id, step))",
           "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT "
           "NOT NULL, kind TEXT NOT NULL, message TEXT NOT NULL, recorded_ms INTEGER NOT NULL)",
           "CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id, seq)",
           "UPDATE jobs SET resume = 1 WHERE state = 'RUNNING'",
       }) {
    if (absl::Status s = store->exec(sql); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("job store '", path, "': ", s.message()));
    }
  }
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::exec(const std::string& sql) {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
    std::string message = error != nullptr ? error : "unknown error";
    sqlite3_free(error);
    return absl::InternalError(message);
  }
  return absl::OkStatus();
}

absl::StatusOr<JobRecord> JobStore::create_job(const std::string& config_json,
                                               int64_t total_steps) {
  std::lock_guard<std::mutex> lock(mu_);
  JobRecord job;
  job.id = new_job_id();
  job.config_json = config_json;
  job.total_steps = total_steps;
  job.created_ms = job.updated_ms = now_unix_ms();
  Statement s(db_,
              "INSERT INTO jobs (id, state, config_json, total_steps, created_ms, updated_ms) "
              "VALUES (?, 'QUEUED', ?, ?, ?, ?)");
  s.bind(1, job.id);
  s.bind(2, config_json);
  s.bind(3, total_steps);
  s.bind(4, job.created_ms);
  s.bind(5, job.updated_ms);
  if (absl::Status st = s.run(); !st.ok()) return st;
  return job;
}

absl::StatusOr<JobRecord> JobStore::get_job(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_, absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id = ?").c_str());
  if (absl::Status st = s.ok(); !st.ok()) return st;
  s.bind(1, id);
  if (s.step() != SQLITE_ROW) return not_found(id);
  return read_job(s);
}

absl::StatusOr<std::vector<JobRecord>> JobStore::list_jobs(std::optional<JobState> state,
                                                           int64_t limit) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sql =
      absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE (? = '' OR state = ?) ",
                   "ORDER BY created_ms DESC, id DESC LIMIT ?");
  Statement s(db_, sql.c_str());
  if (absl::Status st = s.ok(); !st.ok()) return st;
  const std::string name = state ? std::string(job_state_name(*state)) : "";
  s.bind(1, name);
  s.bind(2, name);
  s.bind(3, limit > 0 ? limit : int64_t{-1});
  std::vector<JobRecord> jobs;
  while (s.step() == SQLITE_ROW) jobs.push_back(read_job(s));
  return jobs;
}

absl::StatusOr<std::optional<JobRecord>> JobStore::next_runnable() const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sql =
      absl::StrCat("SELECT ", kJobColumns,
                   " FROM jobs WHERE (state = 'RUNNING' AND resume = 1) OR state = 'QUEUED' "
                   "ORDER BY (state = 'RUNNING') DESC, created_ms ASC, id ASC LIMIT 1");
  Statement s(db_, sql.c_str());
  if (absl::Status st = s.ok(); !st.ok()) return st;
  if (s.step() != SQLITE_ROW) return std::optional<JobRecord>();
  return std::optional<JobRecord>(read_job(s));
}

absl::Status JobStore::set_state(const std::string& id, JobState state, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_,
              "UPDATE jobs SET state = ?, error = ?, resume = CASE WHEN ? = 'RUNNING' THEN resume "
              "ELSE 0 END, updated_ms = ? WHERE id = ?");
  const std::string name(job_state_name(state));
  s.bind(1, name);
  s.bind(2, error);
  s.bind(3, name);
  s.bind(4, now_unix_ms());
  s.bind(5, id);
  if (absl::Status st = s.run(); !st.ok()) return st;
  return s.changes() == 0 ? not_found(id) : absl::OkStatus();
}

absl::StatusOr<JobRecord> JobStore::cancel_if_queued(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Statement s(db_,
                "UPDATE jobs SET state = 'CANCELLED', error = 'cancelled by user', updated_ms = ? "
                "WHERE id = ? AND state = 'QUEUED'");
    s.bind(1, now_unix_ms());
    s.bind(2, id);
    if (absl::Status st = s.run(); !st.ok()) return st;
  }
  absl::StatusOr<JobRecord> job = get_job(id);
  if (!job.ok()) return job.status();
  if (job->state != JobState::kCancelled && is_terminal(job->state)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", id, "' already ended (", std::string(job_state_name(job->state)), ")"));
  }
  return job;
}

absl::Status JobStore::set_step(const std::string& id, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_, "UPDATE jobs SET step = ?, updated_ms = ? WHERE id = ?");
  s.bind(1, step);
  s.bind(2, now_unix_ms());
  s.bind(3, id);
  if (absl::Status st = s.run(); !st.ok()) return st;
  return s.changes() == 0 ? not_found(id) : absl::OkStatus();
}

absl::Status JobStore::set_checkpoint(const std::string& id, const std::string& path,
                                      int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_,
              "UPDATE jobs SET checkpoint = ?, checkpoint_step = ?, updated_ms = ? WHERE id = ?");
  s.bind(1, path);
  s.bind(2, step);
  s.bind(3, now_unix_ms());
  s.bind(4, id);
  if (absl::Status st = s.run(); !st.ok()) return st;
  return s.changes() == 0 ? not_found(id) : absl::OkStatus();
}

absl::Status JobStore::clear_resume(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_, "UPDATE jobs SET resume = 0 WHERE id = ?");
  s.bind(1, id);
  if (absl::Status st = s.run(); !st.ok()) return st;
  return s.changes() == 0 ? not_found(id) : absl::OkStatus();
}

absl::Status JobStore::put_metrics(const std::string& id, int64_t step,
                                   const std::map<std::string, double>& values) {
  nlohmann::json json = nlohmann::json::object();
  for (const auto& [key, value] : values) json[key] = value;
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_,
              "INSERT OR REPLACE INTO metrics (job_id, step, metrics_json, recorded_ms) "
              "VALUES (?, ?, ?, ?)");
  s.bind(1, id);
  s.bind(2, step);
  s.bind(3, json.dump());
  s.bind(4, now_unix_ms());
  return s.run();
}

absl::Status JobStore::delete_metrics_after(const std::string& id, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_, "DELETE FROM metrics WHERE job_id = ? AND step > ?");
  s.bind(1, id);
  s.bind(2, step);
  return s.run();
}

absl::StatusOr<std::vector<MetricsRow>> JobStore::get_metrics(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_,
              "SELECT step, metrics_json, recorded_ms FROM metrics WHERE job_id = ? "
              "ORDER BY step ASC");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  s.bind(1, id);
  std::vector<MetricsRow> rows;
  while (s.step() == SQLITE_ROW) rows.push_back(read_metrics(s));
  return rows;
}

absl::StatusOr<std::optional<MetricsRow>> JobStore::latest_metrics(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_,
              "SELECT step, metrics_json, recorded_ms FROM metrics WHERE job_id = ? "
              "ORDER BY step DESC LIMIT 1");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  s.bind(1, id);
  if (s.step() != SQLITE_ROW) return std::optional<MetricsRow>();
  return std::optional<MetricsRow>(read_metrics(s));
}

absl::StatusOr<JobStore::MetricsFingerprint> JobStore::metrics_fingerprint(
    const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(
      db_,
      "SELECT COUNT(*), COALESCE(MAX(step), -1), COALESCE(MAX(recorded_ms), 0) FROM metrics "
      "WHERE job_id = ?");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  s.bind(1, id);
  MetricsFingerprint out;
  if (s.step() == SQLITE_ROW) {
    out.rows = s.integer(0);
    out.max_step = s.integer(1);
    out.max_recorded_ms = s.integer(2);
  }
  return out;
}

absl::Status JobStore::add_event(const std::string& id, std::string_view kind,
                                 std::string_view message) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_, "INSERT INTO events (job_id, kind, message, recorded_ms) VALUES (?, ?, ?, ?)");
  s.bind(1, id);
  s.bind(2, std::string(kind));
  s.bind(3, std::string(message));
  s.bind(4, now_unix_ms());
  return s.run();
}

absl::StatusOr<std::vector<JobEvent>> JobStore::get_events(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_,
              "SELECT kind, message, recorded_ms FROM events WHERE job_id = ? ORDER BY seq ASC");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  s.bind(1, id);
  std::vector<JobEvent> events;
  while (s.step() == SQLITE_ROW) events.push_back({s.text(0), s.text(1), s.integer(2)});
  return events;
}

absl::StatusOr<std::map<JobState, int64_t>> JobStore::count_by_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<JobState, int64_t> counts;
  for (JobState state : kAllStates) counts[state] = 0;
  Statement s(db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  while (s.step() == SQLITE_ROW) {
    if (auto state = parse_job_state(s.text(0)); state.ok()) counts[*state] = s.integer(1);
  }
  return counts;
}

}  // namespace fp8rl::coordinator
