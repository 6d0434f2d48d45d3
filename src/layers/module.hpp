// Internal: what every layer of the network is. A module owns its parameters (and their
// gradients) and buffers, registered under timm's state_dict names, and offers
//   infer()    - evaluation with running statistics; const and safe to call from many threads,
//   forward()  - training: batch statistics, saves what backward() needs,
//   backward() - gradient of the input; sets the gradients of its parameters.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "relpos/attention_maps.hpp"
#include "relpos/network.hpp"
#include "relpos/ops.hpp"
#include "relpos/tensor.hpp"

namespace relpos {

struct Init;
class Quantizable;

class Module {
 public:
  virtual ~Module() = default;
  virtual void collect(const std::string& prefix, std::vector<ParamRef>& out) = 0;
  virtual Tensor infer(const Tensor& x) const = 0;
  // infer() that also appends what each attention layer inside computed to `maps` (explain
  // tools); `prefix` is the module's name with a trailing dot. Modules without attention infer.
  virtual Tensor infer_attention(const Tensor& x, const std::string& /*prefix*/,
                                 std::vector<AttentionMaps>& /*maps*/) const {
    return infer(x);
  }
  virtual Tensor forward(const Tensor& x) = 0;
  virtual Tensor backward(const Tensor& dy) = 0;
  // Random initial weights (timm's rules); layers without own weights to draw leave it empty.
  virtual void init(Init& /*init*/) {}
  // Called after the weights or device changed: refold batch norms, drop cached plans.
  virtual void prepare_inference() {}
  // Drops tensors saved for backward.
  virtual void release_saved() {}
  // The layers inside that can run in int8 (layers/int8_conv.hpp), in network order.
  virtual void quantizables(std::vector<Quantizable*>& /*out*/) {}
  // Output shape for an input shape, appending a row per layer to rows (if given).
  virtual Shape summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const = 0;
};

// Deterministic initialisers (timm's rules, see model/init.cpp).
struct Init {
  std::mt19937 rng;
  explicit Init(std::uint32_t seed) : rng(seed) {}
  void normal(Tensor& t, float std);
  void trunc_normal(Tensor& t, float std);  // redrawn outside [-2, 2], as timm's trunc_normal_
  static void constant(Tensor& t, float v) { t.fill(v); }
};

}  // namespace relpos
