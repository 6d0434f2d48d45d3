// Pooling (cuDNN), global average pooling (our kernels), linear layers and
// matrix products (cuBLAS), softmax and cross-entropy (on the host: they act on small logits).
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "cuda/cuda_common.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/elementwise.cuh"

namespace relpos::cuda {

namespace {

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(int n, int c, int h, int w) {
    RELPOS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    RELPOS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, n, c, h, w));
  }
  explicit TensorDesc(const Tensor& t)
      : TensorDesc(static_cast<int>(t.dim(0)), static_cast<int>(t.dim(1)), static_cast<int>(t.dim(2)),
                   static_cast<int>(t.dim(3))) {}
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

void check4(const Tensor& x, const char* what) {
  require_cuda(x, what);
  RELPOS_CHECK(x.ndim() == 4, what << ": input must be (N, C, H, W), got " << x.describe());
}

struct PoolDesc {
  cudnnPoolingDescriptor_t d = nullptr;
  explicit PoolDesc(const ops::PoolSpec& s) {
    RELPOS_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&d));
    const auto mode = s.kind == ops::PoolKind::Max ? CUDNN_POOLING_MAX_DETERMINISTIC
                                                   : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    RELPOS_CUDNN_CHECK(cudnnSetPooling2dDescriptor(d, mode, CUDNN_NOT_PROPAGATE_NAN, s.kernel, s.kernel, s.pad, s.pad,
                                                   s.stride, s.stride));
  }
  ~PoolDesc() { cudnnDestroyPoolingDescriptor(d); }
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
};

Shape pooled_shape(const Tensor& x, const ops::PoolSpec& s) {
  const std::int64_t oh = (x.dim(2) + 2 * s.pad - s.kernel) / s.stride + 1, ow = (x.dim(3) + 2 * s.pad - s.kernel) / s.stride + 1;
  RELPOS_CHECK(oh > 0 && ow > 0, "pool2d: input " << to_string(x.shape()) << " smaller than the window");
  return {x.dim(0), x.dim(1), oh, ow};
}
}  // namespace

Tensor pool2d(const Tensor& x_in, const ops::PoolSpec& spec) {
  check4(x_in, "pool2d");
  const Tensor x = x_in.channels_last();
  PoolDesc pd(spec);
  Tensor y(pooled_shape(x, spec), Device::CUDA, Layout::ChannelsLast);
  TensorDesc xd(x), yd(y);
  const float one = 1.0f, zero = 0.0f;
  RELPOS_CUDNN_CHECK(cudnnPoolingForward(context().cudnn, pd.d, &one, xd.d, x.data(), &zero, yd.d, y.data()));
  return y;
}

Tensor pool2d_backward(const Tensor& x_in, const Tensor& dy_in, const ops::PoolSpec& spec) {
  check4(x_in, "pool2d backward");
  const Tensor x = x_in.channels_last();
  const Tensor dy = dy_in.channels_last();
  const Tensor y = cuda::pool2d(x, spec);  // cuDNN's backward wants the forward output
  RELPOS_CHECK(dy.shape() == y.shape(), "pool2d backward: gradient " << dy.describe());
  PoolDesc pd(spec);
  TensorDesc xd(x), yd(y);
  Tensor dx(x.shape(), Device::CUDA, Layout::ChannelsLast);
  const float one = 1.0f, zero = 0.0f;
  RELPOS_CUDNN_CHECK(cudnnPoolingBackward(context().cudnn, pd.d, &one, yd.d, y.data(), yd.d, dy.data(), xd.d, x.data(),
                                          &zero, xd.d, dx.data()));
  return dx;
}

namespace {
// One block per image; threads stride over channels (contiguous in NHWC).
__global__ void gap_kernel(const float* x, float* y, std::int64_t c, std::int64_t hw) {
  const std::int64_t b = blockIdx.x;
  for (std::int64_t ch = threadIdx.x; ch < c; ch += blockDim.x) {
    float s = 0.0f;
    for (std::int64_t p = 0; p < hw; ++p) s += x[(b * hw + p) * c + ch];
    y[b * c + ch] = s / static_cast<float>(hw);
  }
}
__global__ void gap_back_kernel(const float* dy, float* dx, std::int64_t n, std::int64_t c, std::int64_t hw) {
  const std::int64_t total = n * hw * c;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t ch = i % c, b = i / (hw * c);
    dx[i] = dy[b * c + ch] / static_cast<float>(hw);
  }
}
}  // namespace

Tensor global_avg_pool(const Tensor& x_in) {
  check4(x_in, "global average pool");
  const Tensor x = x_in.channels_last();
  Tensor y({x.dim(0), x.dim(1)}, Device::CUDA);
  gap_kernel<<<static_cast<unsigned>(x.dim(0)), 256, 0, stream()>>>(x.data(), y.data(), x.dim(1), x.dim(2) * x.dim(3));
  RELPOS_CUDA_LAUNCHED();
  return y;
}

Tensor global_avg_pool_backward(const Tensor& dy, const Shape& s) {
  require_cuda(dy, "global average pool backward");
  Tensor dx(s, Device::CUDA, Layout::ChannelsLast);
  const std::int64_t total = s[0] * s[1] * s[2] * s[3];
  gap_back_kernel<<<std::min<unsigned>(blocks_for(total), 8192), 256, 0, stream()>>>(dy.data(), dx.data(), s[0], s[1],
                                                                                      s[2] * s[3]);
  RELPOS_CUDA_LAUNCHED();
  return dx;
}

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

Tensor softmax(const Tensor& x) { return cpu::softmax(x.to(Device::CPU)).to(Device::CUDA); }

ops::CrossEntropy cross_entropy(const Tensor& logits, const std::vector<int>& labels, float smoothing) {
  return cpu::cross_entropy(logits, labels, smoothing);  // copies the logits to the host and dlogits back
}

}  // namespace relpos::cuda
