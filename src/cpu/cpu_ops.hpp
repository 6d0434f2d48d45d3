// Internal: the CPU backend (oneDNN, OpenMP and our attention kernels).
#pragma once

#include "relpos/attention_ops.hpp"
#include "core/ops_internal.hpp"
#include "relpos/ops.hpp"

namespace relpos::cpu {
#include "core/backend_ops.inc"
// int8 inference (CPU only, no CUDA twin yet): src/cpu/conv2d_int8.cpp
Tensor conv2d_int8(const Tensor& x, const ops::Int8ConvWeights& w, const ops::ConvSpec& spec,
                   const ops::Epilogue& epilogue, OpCache* cache);
}  // namespace relpos::cpu
