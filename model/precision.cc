// The KV-cache spelling of the shared precision parser.
#include "model/precision.h"

#include "absl/strings/str_cat.h"

namespace fp8rl::model {

absl::StatusOr<KvCacheDtype> parse_kv_cache_dtype(std::string_view name) {
  absl::StatusOr<Precision> p = parse_precision(name);
  if (p.ok()) return *p;
  return absl::InvalidArgumentError(absl::StrCat("unknown kv-cache dtype '", std::string(name),
                                                 "' (expected fp32, bf16 or fp8)"));
}

}  // namespace fp8rl::model
