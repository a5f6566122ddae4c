// Server-side thinning of a job's metrics history, so that a chart of a long job (10,000 steps)
// downloads and draws a few hundred points per metric instead of every row
// (GET /v1/jobs/{id}/metrics?max_points=N, see docs/clients.md).
#pragma once

#include <cstdint>
#include <vector>

#include "services/coordinator/job_store.h"

namespace fp8rl::coordinator {

// Keeps at most `max_points` values of each metric (max_points >= 2): the rows that carry a
// metric are thinned on their own, to evenly spaced picks that always include its first and last
// row, so a sparse metric (val_accuracy, recorded on validation steps only) keeps its points
// even when the dense ones are thinned. A kept row lists only the metrics picked at its step;
// rows come back in step order. A history at or under the limit comes back unchanged.
// `rows` is the history in step order, as JobStore::get_metrics returns it.
std::vector<MetricsRow> downsample_metrics(const std::vector<MetricsRow>& rows, int64_t max_points);

}  // namespace fp8rl::coordinator
