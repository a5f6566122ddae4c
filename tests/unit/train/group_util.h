// Trainer groups of threads in one process for the train/ tests: run a function on every rank at
// once and form a Gloo group over loopback through an in-process store.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "train/collectives.h"

namespace fp8rl::train::test_group {

// Runs fn(rank) on `size` threads and returns each rank's result.
template <typename F>
auto on_ranks(int size, F fn) {
  using R = decltype(fn(0));
  std::vector<R> out(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { out[r] = fn(r); });
  for (std::thread& t : threads) t.join();
  return out;
}

inline GroupOptions group_options(int rank, int size, const std::string& prefix,
                                  int timeout_ms = 20000) {
  GroupOptions o;
  o.rank = rank;
  o.size = size;
  o.prefix = prefix;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  return o;
}

// A Gloo group of `size` ranks (null entries, with a test failure, where forming failed).
inline std::vector<std::unique_ptr<Collectives>> make_group(int size, const std::string& prefix,
                                                            int timeout_ms = 20000) {
  auto store = make_memory_store();
  return on_ranks(size, [&](int r) -> std::unique_ptr<Collectives> {
    absl::StatusOr<std::unique_ptr<Collectives>> g =
        make_gloo_collectives(store, group_options(r, size, prefix, timeout_ms));
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? std::move(*g) : nullptr;
  });
}

}  // namespace fp8rl::train::test_group
