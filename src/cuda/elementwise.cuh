// Internal: elementwise helpers of the CUDA backend.
#pragma once

#include <algorithm>

#include "cuda/cuda_common.hpp"
#include "relpos/ops.hpp"

namespace relpos::cuda {

// A grid-stride loop over n elements, and a grid for it (at most 8192 blocks of 256 threads).
#define RELPOS_GRID_LOOP(i, n)                                                                    \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
inline unsigned grid_for(std::int64_t n) { return std::min<unsigned>(blocks_for(n), 8192); }

// Activation codes for kernels: 0 none, 1 ReLU, 2 SiLU.
inline int code(Act a) { return a == Act::ReLU ? 1 : a == Act::SiLU ? 2 : 0; }

// (a NaN becomes 0 through the ReLU, as through oneDNN's in the CPU's activation and add)
__device__ __forceinline__ float act_fwd(float x, int act) {
  if (act == 1) return x > 0.0f ? x : 0.0f;
  if (act == 2) return x / (1.0f + __expf(-x));
  return x;
}

// The same with a NaN kept, as the CPU's own batch-norm kernels keep it (and PyTorch's ReLU).
__device__ __forceinline__ float act_fwd_keep_nan(float x, int act) {
  if (act == 1) return x > 0.0f || isnan(x) ? x : 0.0f;
  return act_fwd(x, act);
}

__device__ __forceinline__ float act_grad(float x, int act) {
  if (act == 1) return x > 0.0f ? 1.0f : 0.0f;
  if (act == 2) {
    const float s = 1.0f / (1.0f + __expf(-x));
    return s * (1.0f + x * (1.0f - s));
  }
  return 1.0f;
}

void apply_activation_inplace(Tensor& t, Act act);
}  // namespace relpos::cuda
