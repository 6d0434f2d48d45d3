#include <cmath>

#include "io/json_reader.hpp"
#include "relpos/error.hpp"
#include "relpos/ops.hpp"
#include "relpos/optim.hpp"

namespace relpos {

namespace {
constexpr detail::EnumName<OptimizerKind> kOptimizerKinds[] = {{OptimizerKind::SGD, "sgd"},
                                                               {OptimizerKind::AdamW, "adamw"}};
}

std::string to_string(OptimizerKind k) { return detail::enum_name(k, kOptimizerKinds); }
OptimizerKind parse_optimizer_kind(const std::string& s) { return detail::parse_enum(s, kOptimizerKinds, "optimizer"); }

Optimizer::Optimizer(const OptimizerConfig& config, const std::vector<ParamRef>& params) : config_(config) {
  for (const ParamRef& p : params) {
    if (!p.grad) continue;  // buffers
    params_.push_back(p);
    slot1_.push_back(Tensor::zeros(p.value->shape(), p.value->device(), p.value->layout()));
    slot2_.push_back(config.kind == OptimizerKind::AdamW ? Tensor::zeros(p.value->shape(), p.value->device(), p.value->layout())
                                            : Tensor());
  }
}

void Optimizer::step(float lr) {
  ++steps_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamRef& p = params_[i];
    RELPOS_CHECK(p.grad->defined(), "optimizer: parameter " << p.name << " has no gradient (backward not run?)");
    const float wd = p.no_weight_decay ? 0.0f : config_.weight_decay;
    if (config_.kind == OptimizerKind::SGD)
      ops::sgd_update(*p.value, *p.grad, slot1_[i], lr, config_.momentum, config_.nesterov, wd, steps_ == 1);
    else
      ops::adamw_update(*p.value, *p.grad, slot1_[i], slot2_[i], lr, config_.beta1, config_.beta2, config_.eps, wd, steps_);
  }
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(params_[i].name + ".m1", slot1_[i]);
    if (slot2_[i].defined()) out.emplace_back(params_[i].name + ".m2", slot2_[i]);
  }
  return out;
}

void Optimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& state, long steps) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : state) by_name[name] = &t;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (int k = 1; k <= (slot2_[i].defined() ? 2 : 1); ++k) {
      const std::string key = params_[i].name + ".m" + std::to_string(k);
      auto it = by_name.find(key);
      RELPOS_CHECK(it != by_name.end(), "checkpoint lacks optimizer state '" << key << "'");
      (k == 1 ? slot1_[i] : slot2_[i]).copy_from(*it->second);
    }
  }
  steps_ = steps;
}

float LrSchedule::at(long step) const {
  if (step < warmup_steps) return warmup_lr + (lr - warmup_lr) * static_cast<float>(step) / static_cast<float>(warmup_steps);
  const long span = std::max(1L, total_steps - warmup_steps);
  const double t = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(span));
  return static_cast<float>(min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * t)));
}

}  // namespace relpos
