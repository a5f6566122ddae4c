// Evenly spaced picks per metric (see metrics_downsample.h).
#include "services/coordinator/metrics_downsample.h"

#include <map>
#include <string>

namespace fp8rl::coordinator {

std::vector<MetricsRow> downsample_metrics(const std::vector<MetricsRow>& rows,
                                           int64_t max_points) {
  if (max_points < 2) max_points = 2;
  // Indices (into `rows`) of the rows carrying each metric.
  std::map<std::string, std::vector<size_t>> carriers;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (const auto& [key, value] : rows[i].values) carriers[key].push_back(i);
  }
  bool thin = false;
  for (const auto& [key, indices] : carriers) {
    if (static_cast<int64_t>(indices.size()) > max_points) thin = true;
  }
  if (!thin) return rows;

  // kept[i]: the metrics picked from rows[i].
  std::vector<std::map<std::string, double>> kept(rows.size());
  for (const auto& [key, indices] : carriers) {
    const int64_t n = static_cast<int64_t>(indices.size());
    const int64_t picks = std::min(n, max_points);
    for (int64_t j = 0; j < picks; ++j) {
      // j-th of `picks` evenly spaced positions in [0, n-1], both ends included. Dense metrics
      // with the same rows get the same positions, so their picks share rows.
      const int64_t pos = picks == 1 ? 0 : (j * (n - 1) + (picks - 1) / 2) / (picks - 1);
      const size_t row = indices[static_cast<size_t>(pos)];
      kept[row][key] = rows[row].values.at(key);
    }
  }
  std::vector<MetricsRow> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (kept[i].empty()) continue;
    out.push_back({rows[i].step, std::move(kept[i]), rows[i].recorded_ms});
  }
  return out;
}

}  // namespace fp8rl::coordinator
