// Registration of the trainer worker's metric families (names from docs/metrics.md).
#include "services/trainer_worker/trainer_metrics.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace fp8rl::trainer {

absl::StatusOr<std::unique_ptr<TrainerMetrics>> TrainerMetrics::create(
    service::MetricsRegistry* registry, rl::StepMetricSchema schema) {
  if (absl::Status s = service::register_process_metrics(registry, "trainer"); !s.ok()) return s;

  auto m = std::make_unique<TrainerMetrics>();
  absl::Status status;
  auto counter = [&](const char* name, const char* help,
                     std::vector<std::string> labels) -> service::CounterFamily* {
    if (!status.ok()) return nullptr;
    absl::StatusOr<service::CounterFamily*> f =
        registry->add_counter(name, help, std::move(labels));
    if (!f.ok()) {
      status = f.status();
      return nullptr;
    }
    return *f;
  };
  auto gauge = [&](const char* name, const char* help,
                   std::vector<std::string> labels) -> service::GaugeFamily* {
    if (!status.ok()) return nullptr;
    absl::StatusOr<service::GaugeFamily*> f = registry->add_gauge(name, help, std::move(labels));
    if (!f.ok()) {
      status = f.status();
      return nullptr;
    }
    return *f;
  };
  m->steps = counter("fp8rl_trainer_steps_total", "Optimizer steps.", {"kind"});
  m->tokens = counter("fp8rl_trainer_tokens_total", "Training tokens processed.", {});
  m->loss = gauge("fp8rl_trainer_loss", "Last step's loss.", {});
  m->grad_norm = gauge("fp8rl_trainer_grad_norm", "Last step's gradient norm before clipping.", {});
  m->learning_rate = gauge("fp8rl_trainer_learning_rate", "Current learning rate.", {});
  m->policy_version = gauge("fp8rl_trainer_policy_version", "Last published weight version.", {});
  m->phase_seconds =
      gauge("fp8rl_trainer_phase_seconds", "Time of each phase in the last step.", {"phase"});
  m->is_weight = gauge(
      "fp8rl_trainer_is_weight",
      "IS weights of the last step: mean after truncation, min/max of the raw exp(prev - gen).",
      {"stat"});
  for (const rl::StepMetricDef& def : schema) {
    if (def.trainer_help.empty()) continue;
    const std::string name = absl::StrCat("fp8rl_trainer_", std::string(def.name));
    m->step_metrics.emplace(std::string(def.name),
                            gauge(name.c_str(), std::string(def.trainer_help).c_str(), {}));
  }
  m->recalibration_seconds =
      gauge("fp8rl_trainer_recalibration_seconds",
            "Re-quantization + KV calibration time of the last publish.", {});
  m->weight_scale_inv = gauge("fp8rl_trainer_weight_scale_inv",
                              "128x128 weight block scales of the last publish.", {"stat"});
  m->kv_scale =
      gauge("fp8rl_trainer_kv_scale", "KV-cache scales of the last publish.", {"tensor", "stat"});
  m->group_size = gauge("fp8rl_trainer_group_size",
                        "Trainers in this trainer's data-parallel group (1 when alone).", {});
  m->group_rank = gauge("fp8rl_trainer_group_rank", "This trainer's rank in its group.", {});
  m->all_reduce_seconds = gauge("fp8rl_trainer_all_reduce_seconds",
                                "Time in the last step's all-reduces (data-parallel group).", {});
  m->all_reduce_bytes = counter("fp8rl_trainer_all_reduce_bytes_total",
                                "Payload bytes this trainer all-reduced.", {});
  m->all_reduce_wait_seconds =
      gauge("fp8rl_trainer_all_reduce_wait_seconds",
            "Time the last step waited for gradient all-reduces after the backward.", {});
  if (!status.ok()) return status;
  return m;
}

void TrainerMetrics::record_step(const rl::MetricsValues& values) {
  for (const auto& [name, family] : step_metrics) {
    if (auto it = values.find(name); it != values.end()) family->get().set(it->second);
  }
}

}  // namespace fp8rl::trainer
