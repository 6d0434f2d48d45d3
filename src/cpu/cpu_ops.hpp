// Internal: the CPU backend (oneDNN, OpenMP and our attention kernels).
#pragma once

#include "relpos/attention_ops.hpp"
#include "core/ops_internal.hpp"
#include "relpos/ops.hpp"

namespace relpos::cpu {
#include "core/backend_ops.inc"
}  // namespace relpos::cpu
