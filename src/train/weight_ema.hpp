// Internal: an exponential moving average of a network's weights, as timm's ModelEmaV2: after
// every step, ema = decay * ema + (1 - decay) * value for every parameter and every buffer (the
// batch-norm running statistics too, so the averaged network evaluates with averaged statistics).
// The average is kept in host memory (on the GPU backend each update copies the weights to the
// host, like timm's --model-ema-force-cpu).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "relpos/network.hpp"

namespace relpos::detail {

class WeightEma {
 public:
  // Starts as a copy of the network's current weights.
  WeightEma(const Network& net, float decay);
  void update(const Network& net);
  // Writes the averaged weights into a network of the same config.
  void copy_to(Network& net) const;
  // The averages of net's tensors that have no gradient (the batch-norm running statistics).
  std::vector<Tensor*> statistics(const Network& net);
  float decay() const { return decay_; }
  // For checkpoints: (name, tensor) pairs under the network's names.
  const std::vector<std::pair<std::string, Tensor>>& state() const { return avg_; }
  // Every tensor of the network must be there (errors name the missing one and `source`).
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, const std::string& source);

 private:
  float decay_;
  std::vector<std::pair<std::string, Tensor>> avg_;  // host, in each parameter's layout
};

}  // namespace relpos::detail
