// Internal: elementwise helpers of the CUDA backend.
#pragma once

#include "relpos/ops.hpp"

namespace relpos::cuda {
void apply_activation_inplace(Tensor& t, Act act);
// y[i, j] += b[j] for a row-major (rows, cols) matrix
void add_row_bias(float* y, const float* b, std::int64_t rows, std::int64_t cols);
// out[j] = sum_i m[i, j]
void column_sums(const float* m, float* out, std::int64_t rows, std::int64_t cols);
}  // namespace relpos::cuda
