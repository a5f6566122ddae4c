// ZeRO-3's unit gathers (see unit_gather.h).
#include "train/unit_gather.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "absl/strings/str_cat.h"
#include "train/data_parallel.h"

namespace fp8rl::train {
namespace {

// The name of unit `u` of a model of `layers` decoder layers in collective errors.
std::string unit_name(int64_t u, int64_t layers) {
  if (u == 0) return "embedding";
  if (u == layers + 1) return "final norm and lm_head";
  return absl::StrCat("layer ", u - 1);
}

// All-gathers one stream: this rank's `mine` into `all` (counts per rank); skipped when no rank
// has an element (the same decision on every rank: counts come from the cut alone).
template <typename T>
absl::Status gather_stream(Collectives& group, std::span<const T> mine,
                           const std::vector<int64_t>& counts, std::vector<T>* all,
                           const std::string& what) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  all->assign(static_cast<size_t>(total), T{});
  if (total == 0) return absl::OkStatus();
  return group.all_gather(mine, std::span<T>(*all), counts, what);
}

template <typename T>
std::span<const T> piece(const std::vector<T>& v, int64_t skip, int64_t take) {
  return std::span<const T>(v).subspan(static_cast<size_t>(skip), static_cast<size_t>(take));
}

}  // namespace

ShardedUnitWeights::ShardedUnitWeights(model::Model* model, ShardLayout layout, int rank)
    : model_(model), layout_(std::move(layout)), rank_(rank), thread_([this] { run(); }) {}

ShardedUnitWeights::~ShardedUnitWeights() {
  wait_prefetch();  // its collective runs on every rank: let it finish (or time out)
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ShardedUnitWeights::set_group(Collectives* group) {
  wait_prefetch();
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefetch_.reset();
  }
  group_ = group;
}

void ShardedUnitWeights::set_buckets(GradientBuckets* buckets) {
  if (buckets_ != nullptr) buckets_->set_order(nullptr);
  buckets_ = buckets;
  if (buckets_ != nullptr) buckets_->set_order(&order_);
}

void ShardedUnitWeights::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (prefetch_.has_value() && !prefetch_->running); });
    if (!prefetch_.has_value() || prefetch_->running) return;  // stop_ with nothing pending
    prefetch_->running = true;
    const int64_t ticket = prefetch_->ticket;
    const std::string what = prefetch_->what;
    const std::vector<std::pair<int64_t, int64_t>> ranges = prefetch_->ranges;
    lock.unlock();
    order_.wait_turn(ticket);
    absl::Status status;
    std::vector<model::Model::WorkingStreams> streams;
    for (const auto& [b, e] : ranges) {
      absl::StatusOr<model::Model::WorkingStreams> got = collect_range(b, e, what);
      if (!got.ok()) {
        status = got.status();
        break;
      }
      streams.push_back(*std::move(got));
    }
    order_.done();
    lock.lock();
    prefetch_->status = std::move(status);
    prefetch_->streams = std::move(streams);
    prefetch_->done = true;
    cv_.notify_all();
  }
}

void ShardedUnitWeights::wait_prefetch() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !prefetch_.has_value() || prefetch_->done; });
}

void ShardedUnitWeights::start_prefetch(int64_t unit) {
  Prefetch p;
  p.unit = unit;
  p.ticket = order_.take();
  p.what = absl::StrCat(unit_name(unit, model_->config().num_hidden_layers),
                        " weights all-gather (prefetch)");
  p.ranges = ranges(unit);
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefetch_ = std::move(p);
  }
  cv_.notify_all();
}

int64_t ShardedUnitWeights::next_unit(int64_t unit) const {
  const int64_t n = model_->config().num_hidden_layers;
  // A forward: 0, 1, ..., n + 1; a backward: n + 1, n, ..., 1 (engine::forward_unit_order,
  // backward_unit_order). The same calls on every rank give the same answers.
  if (unit == 0 || (unit <= n && last_acquired_ == unit - 1)) return unit + 1;
  if (unit == n + 1 && last_acquired_ == n) return -1;  // the end of a forward
  if (unit == n + 1 || last_acquired_ == unit + 1) return unit > 1 ? unit - 1 : -1;
  return -1;
}

std::vector<std::pair<int64_t, int64_t>> ShardedUnitWeights::ranges(int64_t unit) const {
  const int64_t n = model_->config().num_hidden_layers;
  std::vector<std::pair<int64_t, int64_t>> out = {engine::unit_range(model_->layout(), n, unit)};
  if (unit == n + 1 && model_->config().tie_word_embeddings) {
    out.push_back(engine::unit_range(model_->layout(), n, 0));  // the lm_head is the embedding
  }
  return out;
}

absl::Status ShardedUnitWeights::check_group() const {
  if (group_ == nullptr) {
    return absl::FailedPreconditionError(
        "trainer.shard params: the working weights are spread over a group this trainer is no "
        "longer in");
  }
  if (group_->size() != layout_.ranks() || group_->rank() != rank_) {
    return absl::FailedPreconditionError(
        absl::StrCat("trainer.shard params: the working weights hold the shard of rank ", rank_,
                     " of ", layout_.ranks(), ", and this trainer is now rank ", group_->rank(),
                     " of ", group_->size()));
  }
  return absl::OkStatus();
}

void ShardedUnitWeights::drain() {
  wait_prefetch();
  if (buckets_ != nullptr) buckets_->drain();
}

absl::Status ShardedUnitWeights::refresh(std::string_view what, bool fingerprint) {
  // A prefetch read the streams being replaced: it is done (every rank ran it) and dropped.
  wait_prefetch();
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefetch_.reset();
  }
  last_acquired_ = -1;
  absl::StatusOr<model::Model::WorkingStreams> mine =
      model_->encode_working(layout_.begin(rank_), layout_.end(rank_));
  if (!mine.ok()) return mine.status();
  mine_ = std::move(*mine);
  if (all_held_ == 0) {
    if (absl::Status s = model_->drop_working_range(0, model_->num_params()); !s.ok()) return s;
  }
  hash_ = 0;
  if (!fingerprint) return absl::OkStatus();
  if (absl::Status s = check_group(); !s.ok()) return s;
  // Each rank's stream hash, all-gathered: every rank then holds the same list, and the group's
  // weight check compares its hash (a rank missing from the gather fails it).
  const uint64_t own = working_weights_hash(mine_.codes, mine_.scales, mine_.bf16);
  uint8_t own_bytes[sizeof(uint64_t)];
  std::memcpy(own_bytes, &own, sizeof(own));
  std::vector<uint8_t> all(sizeof(uint64_t) * static_cast<size_t>(layout_.ranks()));
  const std::vector<int64_t> counts(static_cast<size_t>(layout_.ranks()), sizeof(uint64_t));
  drain();
  if (absl::Status s = group_->all_gather(std::span<const uint8_t>(own_bytes), std::span(all),
                                          counts, absl::StrCat(std::string(what), " (hashes)"));
      !s.ok()) {
    return s;
  }
  hash_ = working_weights_hash(all, {}, {});
  return absl::OkStatus();
}

absl::StatusOr<model::Model::WorkingStreams> ShardedUnitWeights::collect_range(
    int64_t begin, int64_t end, const std::string& what) const {
  if (absl::Status s = check_group(); !s.ok()) return s;
  // Rank r sends the part of its shard inside [begin, end): [max(begin, b_r), min(end, e_r)),
  // cut points on both sides (tensor starts or the shard's own cuts).
  std::vector<int64_t> codes, scales, bf16;
  model::Model::WorkingCounts skip, take;
  for (int r = 0; r < layout_.ranks(); ++r) {
    const int64_t pb = std::clamp(layout_.begin(r), begin, end);
    const int64_t pe = std::clamp(layout_.end(r), begin, end);
    absl::StatusOr<model::Model::WorkingCounts> n = model_->working_counts(pb, pe);
    if (!n.ok()) return n.status();
    codes.push_back(n->codes);
    scales.push_back(n->scales);
    bf16.push_back(n->bf16);
    if (r == rank_ && pe > pb) {
      // Where the piece starts in this rank's streams (none to send when the shard lies outside
      // the range).
      absl::StatusOr<model::Model::WorkingCounts> before =
          model_->working_counts(layout_.begin(r), pb);
      if (!before.ok()) return before.status();
      skip = *before;
      take = *n;
    }
  }
  model::Model::WorkingStreams all;
  if (absl::Status s = gather_stream(*group_, piece(mine_.codes, skip.codes, take.codes), codes,
                                     &all.codes, absl::StrCat(what, " (FP8 codes)"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = gather_stream(*group_, piece(mine_.scales, skip.scales, take.scales), scales,
                                     &all.scales, absl::StrCat(what, " (block scales)"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = gather_stream(*group_, piece(mine_.bf16, skip.bf16, take.bf16), bf16,
                                     &all.bf16, absl::StrCat(what, " (bf16)"));
      !s.ok()) {
    return s;
  }
  return all;
}

absl::Status ShardedUnitWeights::gather_range(int64_t begin, int64_t end, const std::string& what) {
  drain();
  absl::StatusOr<model::Model::WorkingStreams> all = collect_range(begin, end, what);
  if (!all.ok()) return all.status();
  return model_->install_working_range(*all, begin, end);
}

absl::Status ShardedUnitWeights::acquire(int64_t unit) {
  if (all_held_ > 0) return absl::OkStatus();
  ++acquired_;
  const int64_t next = next_unit(unit);
  last_acquired_ = unit;
  std::optional<Prefetch> ready;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (prefetch_.has_value() && prefetch_->unit == unit) {
      cv_.wait(lock, [&] { return prefetch_->done; });
      ready = std::move(prefetch_);
      prefetch_.reset();
    }
  }
  const std::vector<std::pair<int64_t, int64_t>> unit_ranges = ranges(unit);
  if (ready.has_value()) {
    ++prefetched_;
    if (!ready->status.ok()) return ready->status;
    for (size_t i = 0; i < unit_ranges.size(); ++i) {
      if (absl::Status s = model_->install_working_range(ready->streams[i], unit_ranges[i].first,
                                                         unit_ranges[i].second);
          !s.ok()) {
        return s;
      }
    }
  } else {
    // Not prefetched (the first unit of a pass): on this thread, after what is in flight; a
    // prefetch of another unit (a pass cut short by an error) is dropped.
    drain();
    {
      std::lock_guard<std::mutex> lock(mu_);
      prefetch_.reset();
    }
    const std::string what =
        absl::StrCat(unit_name(unit, model_->config().num_hidden_layers), " weights all-gather");
    for (const auto& [b, e] : unit_ranges) {
      if (absl::Status s = gather_range(b, e, what); !s.ok()) return s;
    }
  }
  // The unit the pass runs next is gathered while the caller computes this one.
  if (next >= 0) start_prefetch(next);
  return absl::OkStatus();
}

void ShardedUnitWeights::release(int64_t unit) {
  if (all_held_ > 0) return;
  // Whole tensors of the layout: cannot fail.
  for (const auto& [b, e] : ranges(unit)) model_->drop_working_range(b, e).IgnoreError();
}

absl::Status ShardedUnitWeights::idle_forward() {
  for (int64_t u : engine::forward_unit_order(model_->config().num_hidden_layers)) {
    if (absl::Status s = acquire(u); !s.ok()) return s;
    release(u);
  }
  return absl::OkStatus();
}

absl::Status ShardedUnitWeights::idle_backward(model::GradientSink* sink) {
  // The calls of engine::train_backward, in its order: the head, then the gradients from the
  // final norm on are final; each layer from the last, then its gradients are final; the
  // embedding's backward (no weights), then all are final.
  const int64_t n = model_->config().num_hidden_layers;
  const model::ParamLayout& layout = model_->layout();
  for (int64_t u : engine::backward_unit_order(n)) {
    if (absl::Status s = acquire(u); !s.ok()) return s;
    release(u);
    if (sink != nullptr) {
      sink->final_from(u == n + 1 ? layout.final_norm() : layout.layer(u - 1).input_norm);
    }
  }
  if (sink != nullptr) sink->final_from(0);
  return absl::OkStatus();
}

absl::Status ShardedUnitWeights::acquire_all(std::string_view what) {
  if (all_held_ > 0) {
    ++all_held_;
    return absl::OkStatus();
  }
  drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefetch_.reset();
  }
  if (absl::Status s =
          gather_range(0, model_->num_params(), absl::StrCat(std::string(what), " all-gather"));
      !s.ok()) {
    return s;
  }
  ++all_held_;
  return absl::OkStatus();
}

void ShardedUnitWeights::release_all() {
  if (all_held_ == 0 || --all_held_ > 0) return;
  model_->drop_working_range(0, model_->num_params()).IgnoreError();
}

int64_t ShardedUnitWeights::held_bytes() const {
  return static_cast<int64_t>(mine_.codes.size() + mine_.scales.size() * sizeof(float) +
                              mine_.bf16.size() * sizeof(uint16_t));
}

}  // namespace fp8rl::train
