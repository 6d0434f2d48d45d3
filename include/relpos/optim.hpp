// relpos: optimizers (SGD with momentum / Nesterov, AdamW; PyTorch's update rules) and the
// warmup + cosine learning-rate schedule. Weight decay skips parameters marked no_weight_decay
// (biases, norm parameters, position tables), as timm does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "relpos/network.hpp"

namespace relpos {

enum class OptimizerKind : std::uint8_t { SGD, AdamW };
std::string to_string(OptimizerKind k);              // "sgd" | "adamw"
OptimizerKind parse_optimizer_kind(const std::string& s);  // throws relpos::Error on other names

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::SGD;
  float momentum = 0.9f;     // SGD
  bool nesterov = true;      // SGD
  float weight_decay = 5e-5f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // AdamW
};

class Optimizer {
 public:
  Optimizer(const OptimizerConfig& config, const std::vector<ParamRef>& params);
  // One update of every parameter that has a gradient, at learning rate lr.
  void step(float lr);
  const OptimizerConfig& config() const { return config_; }
  long steps() const { return steps_; }
  // State for checkpoints: (name, tensor) pairs, and the step count.
  std::vector<std::pair<std::string, Tensor>> state() const;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, long steps);

 private:
  OptimizerConfig config_;
  std::vector<ParamRef> params_;
  std::vector<Tensor> slot1_, slot2_;  // SGD: momentum buffer; AdamW: first and second moments
  long steps_ = 0;
};

// Linear warmup from warmup_lr to lr over warmup_steps, then cosine decay to min_lr at total_steps.
struct LrSchedule {
  float lr = 0.1f;
  float min_lr = 0.0f;
  float warmup_lr = 0.0f;
  long warmup_steps = 0;
  long total_steps = 1;
  float at(long step) const;
};

}  // namespace relpos
