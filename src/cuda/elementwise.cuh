// Internal: elementwise helpers of the CUDA backend.
#pragma once

#include "relpos/ops.hpp"

namespace relpos::cuda {

// Activation codes for kernels: 0 none, 1 ReLU, 2 SiLU.
inline int code(Act a) { return a == Act::ReLU ? 1 : a == Act::SiLU ? 2 : 0; }

__device__ __forceinline__ float act_fwd(float x, int act) {
  if (act == 1) return x > 0.0f ? x : 0.0f;
  if (act == 2) return x / (1.0f + __expf(-x));
  return x;
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
// y[i, j] += b[j] for a row-major (rows, cols) matrix
void add_row_bias(float* y, const float* b, std::int64_t rows, std::int64_t cols);
// out[j] = sum_i m[i, j]
void column_sums(const float* m, float* out, std::int64_t rows, std::int64_t cols);
}  // namespace relpos::cuda
