// Internal: how calibration (src/quant/) sees the inputs of the quantizable layers. While an
// observer is set on a thread, every quantizable layer that runs in float32 on that thread hands
// it its input before computing.
#pragma once

#include <string>

#include "relpos/tensor.hpp"

namespace relpos::detail {

class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  virtual void observe(const std::string& layer, const Tensor& input) = 0;
};

// For the calling thread; nullptr stops observing.
void set_activation_observer(ActivationObserver* observer);
// The layers' side: hands x to the calling thread's observer, if any.
void observe_input(const std::string& layer, const Tensor& x);
// Whether the calling thread has an observer (layers that would merge their inputs keep them apart).
bool observing();

}  // namespace relpos::detail
