// Linear layers and matrix products on the GPU (twin of cpu/linear.cpp), through cuBLAS; also the
// backend's row-major gemm() the attention ops use.
#include "cuda/cuda_common.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/elementwise.cuh"

namespace relpos::cuda {

namespace {

__global__ void row_bias_kernel(float* y, const float* b, std::int64_t rows, std::int64_t cols) {
  RELPOS_GRID_LOOP(i, rows * cols) y[i] += b[i % cols];
}
__global__ void col_sum_kernel(const float* m, float* out, std::int64_t rows, std::int64_t cols) {
  RELPOS_GRID_LOOP(j, cols) {
    float s = 0.0f;
    for (std::int64_t i = 0; i < rows; ++i) s += m[i * cols + j];
    out[j] = s;
  }
}


// y[i, j] += b[j] for a row-major (rows, cols) matrix
void add_row_bias(float* y, const float* b, std::int64_t rows, std::int64_t cols) {
  if (rows * cols == 0) return;
  row_bias_kernel<<<grid_for(rows * cols), 256, 0, stream()>>>(y, b, rows, cols);
  RELPOS_CUDA_LAUNCHED();
}

// out[j] = sum_i m[i, j]
void column_sums(const float* m, float* out, std::int64_t rows, std::int64_t cols) {
  if (cols == 0) return;
  col_sum_kernel<<<grid_for(cols), 256, 0, stream()>>>(m, out, rows, cols);
  RELPOS_CUDA_LAUNCHED();
}

}  // namespace

// Row-major C = alpha op(A) op(B) + beta C through column-major cuBLAS (C^T = op(B)^T op(A)^T).
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda,
          const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  cublasHandle_t h = context().cublas;
  RELPOS_CUBLAS_CHECK(cublasSetMathMode(h, tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  RELPOS_CUBLAS_CHECK(cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                  static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c, static_cast<int>(ldc)));
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor* b) {
  require_cuda(x, "linear");
  RELPOS_CHECK(x.ndim() == 2 && w.ndim() == 2 && x.dim(1) == w.dim(1), "linear: " << x.describe() << " vs " << w.describe());
  const std::int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  Tensor y({n, out}, Device::CUDA);
  gemm(false, true, n, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, y.data(), out);
  if (b) add_row_bias(y.data(), b->data(), n, out);
  return y;
}

ops::LinearGrads linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy) {
  const std::int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  ops::LinearGrads g;
  g.dx = Tensor({n, in}, Device::CUDA);
  g.dw = Tensor({out, in}, Device::CUDA);
  g.db = Tensor({out}, Device::CUDA);
  gemm(false, false, n, in, out, 1.0f, dy.data(), out, w.data(), in, 0.0f, g.dx.data(), in);
  gemm(true, false, out, in, n, 1.0f, dy.data(), out, x.data(), in, 0.0f, g.dw.data(), in);
  column_sums(dy.data(), g.db.data(), n, out);
  return g;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  require_cuda(a, "matmul");
  const std::int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const std::int64_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  RELPOS_CHECK(k == kb, "matmul: inner sizes " << k << " and " << kb << " differ");
  Tensor c({m, n}, Device::CUDA);
  gemm(ta, tb, m, n, k, 1.0f, a.data(), a.dim(1), b.data(), b.dim(1), 0.0f, c.data(), n);
  return c;
}

}  // namespace relpos::cuda
