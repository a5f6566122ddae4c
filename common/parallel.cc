// The shared thread pool behind fp8rl::parallel_for (see parallel.h for the contract).
#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>

namespace fp8rl {
namespace {

// True on pool workers and on a caller while it runs chunks: nested calls then run inline.
thread_local bool tls_inside_pool = false;

// Chunks per thread: a few, so uneven chunks balance out without much scheduling overhead.
constexpr int64_t kChunksPerThread = 4;

}  // namespace

int default_num_threads() {
  if (const char* env = std::getenv("FP8RL_NUM_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != nullptr && *end == '\0' && v > 0 && v <= 4096) return static_cast<int>(v);
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

struct ThreadPool::Job {
  const RangeFn* fn = nullptr;
  int64_t n = 0;
  int64_t chunk = 1;
  int64_t num_chunks = 0;
  std::atomic<int64_t> next{0};     // next chunk to claim, lock-free
  std::atomic<bool> failed{false};  // set on the first exception: the other chunks are skipped
  std::mutex error_mu;              // guards error
  std::exception_ptr error;         // guarded by error_mu; the first exception thrown
};

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run_chunks(Job& job) {
  while (!job.failed.load(std::memory_order_relaxed)) {
    const int64_t c = job.next.fetch_add(1, std::memory_order_relaxed);
    if (c >= job.num_chunks) break;
    const int64_t begin = c * job.chunk;
    const int64_t end = std::min(job.n, begin + job.chunk);
    try {
      (*job.fn)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.error_mu);
      if (!job.error) job.error = std::current_exception();
      job.failed.store(true, std::memory_order_relaxed);
    }
  }
}

void ThreadPool::worker_loop() {
  tls_inside_pool = true;
  uint64_t seen = 0;
  for (;;) {
    Job* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    run_chunks(*job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_workers_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t target_chunks = static_cast<int64_t>(num_threads_) * kChunksPerThread;
  const int64_t chunk = std::max(grain, (n + target_chunks - 1) / target_chunks);
  const int64_t num_chunks = (n + chunk - 1) / chunk;
  if (num_threads_ == 1 || tls_inside_pool || num_chunks == 1) {
    fn(0, n);
    return;
  }

  std::lock_guard<std::mutex> submit(submit_mu_);
  Job job;
  job.fn = &fn;
  job.n = n;
  job.chunk = chunk;
  job.num_chunks = num_chunks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &job;
    active_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();

  tls_inside_pool = true;
  run_chunks(job);
  tls_inside_pool = false;

  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return active_workers_ == 0; });
    job_ = nullptr;
  }
  if (job.error) std::rethrow_exception(job.error);
}

ThreadPool& global_thread_pool() {
  static ThreadPool pool(default_num_threads());
  return pool;
}

void parallel_for(int64_t n, const ThreadPool::RangeFn& fn, int64_t grain) {
  global_thread_pool().parallel_for(n, fn, grain);
}

}  // namespace fp8rl
