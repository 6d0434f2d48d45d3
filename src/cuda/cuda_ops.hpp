// Internal: the CUDA backend (cuDNN, cuBLAS and our kernels): the same contract as the CPU one.
#pragma once

#include "relpos/attention_ops.hpp"
#include "core/ops_internal.hpp"
#include "relpos/ops.hpp"

namespace relpos::cuda {
#include "core/backend_ops.inc"
}  // namespace relpos::cuda
