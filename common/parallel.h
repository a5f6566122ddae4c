// A small shared thread pool so every multithreaded CPU loop (quantize, GEMM scaling, the CPU
// model engine) splits work the same way and no module spawns threads of its own per call.
//
//   fp8rl::parallel_for(n, [&](int64_t begin, int64_t end) { for (i = begin..end) ... });
//
// Work [0, n) is cut into contiguous chunks of at least `grain` items; the pool's workers and the
// calling thread take chunks until none are left, and the call returns when all are done.
// A parallel_for issued from inside a chunk (nested) runs inline on the current thread, so
// nesting never deadlocks. Calls from several outside threads at once are served one at a time.
// If a chunk throws, the remaining chunks are skipped and the first exception is rethrown to the
// caller.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fp8rl {

// Threads to use by default: $FP8RL_NUM_THREADS when set to a positive integer, otherwise
// std::thread::hardware_concurrency() (at least 1).
int default_num_threads();

class ThreadPool {
 public:
  using RangeFn = std::function<void(int64_t begin, int64_t end)>;

  // num_threads counts the calling thread: a pool of 1 runs everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn over [0, n) in chunks of at least `grain` items (grain < 1 counts as 1).
  void parallel_for(int64_t n, const RangeFn& fn, int64_t grain = 1);

 private:
  struct Job;
  void worker_loop();
  static void run_chunks(Job& job);

  int num_threads_;
  std::vector<std::thread> workers_;  // set in the constructor, joined in the destructor
  // One parallel_for at a time (a second caller waits); taken before mu_.
  std::mutex submit_mu_;
  // Guards job_, generation_, active_workers_ and stop_.
  std::mutex mu_;
  // Waits for (workers): a new job (generation_ changed) or stop_. Notified by parallel_for()
  // and the destructor.
  std::condition_variable work_cv_;
  // Waits for (parallel_for()): active_workers_ == 0, every worker done with the current job.
  // Notified by the last worker to finish.
  std::condition_variable done_cv_;
  Job* job_ = nullptr;       // guarded by mu_
  uint64_t generation_ = 0;  // guarded by mu_; counts jobs, so a worker runs each once
  int active_workers_ = 0;   // guarded by mu_; workers still inside the current job
  bool stop_ = false;        // guarded by mu_
};

// The process-wide pool (default_num_threads() threads), created on first use.
ThreadPool& global_thread_pool();

// parallel_for on the global pool.
void parallel_for(int64_t n, const ThreadPool::RangeFn& fn, int64_t grain = 1);

}  // namespace fp8rl
