// Internal: building a Model from named tensors (weights files, checkpoints).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "relpos/model.hpp"

namespace relpos::detail {

// Every parameter and buffer of the network must be given exactly once (num_batches_tracked
// entries are ignored); errors name the tensor and the source.
void assign_tensors(Network& net, std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& source);

}  // namespace relpos::detail
