// Pooling on the GPU (twin of cpu/pooling.cpp): max and average pooling through cuDNN (NHWC),
// global average pooling with our kernels.
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
    RELPOS_CUDNN_CHECK(cudnnSetPooling2dDescriptor(d, mode, CUDNN_PROPAGATE_NAN, s.kernel, s.kernel, s.pad, s.pad,
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

}  // namespace relpos::cuda
