// Internal: gradient-norm clipping (PyTorch's clip_grad_norm_, timm's --clip-grad with the default
// mode "norm"): when the L2 norm of all gradients together exceeds max_norm, every gradient is
// scaled by max_norm / (norm + 1e-6).
#pragma once

#include <vector>

#include "relpos/network.hpp"

namespace relpos::detail {

// Returns the norm before clipping. Gradients on the GPU are read and, when clipped, written back
// through host memory.
double clip_grad_norm(const std::vector<ParamRef>& params, double max_norm);

}  // namespace relpos::detail
