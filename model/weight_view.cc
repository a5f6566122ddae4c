// WeightView construction and lookup.
#include "model/weight_view.h"

#include "absl/strings/str_cat.h"

namespace fp8rl::model {

absl::Status WeightView::add(TensorView t) {
  int64_t numel = 1;
  for (int64_t d : t.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("weight view: ", t.name, ": negative dim"));
    }
    numel *= d;
  }
  const int64_t want = numel * dtype_size(t.dtype);
  if (static_cast<int64_t>(t.bytes.size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight view: ", t.name, ": ", t.bytes.size(), " bytes, expected ", want));
  }
  if (!index_.emplace(t.name, tensors_.size()).second) {
    return absl::InvalidArgumentError(absl::StrCat("weight view: duplicate tensor '", t.name, "'"));
  }
  tensors_.push_back(std::move(t));
  return absl::OkStatus();
}

const TensorView* WeightView::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<WeightView> view_of(const WeightSet& set) {
  WeightView view;
  view.version = set.version;
  view.config_json = set.config_json;
  for (const NamedTensor& t : set.tensors) {
    if (absl::Status s = view.add({t.name, t.dtype, t.shape, t.bytes}); !s.ok()) return s;
  }
  return view;
}

}  // namespace fp8rl::model
