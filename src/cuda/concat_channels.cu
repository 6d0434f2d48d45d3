// concat_channels on the GPU (twin of cpu/concat_channels.cpp): one thread per output float.
#include "cuda/cuda_common.hpp"
#include "cuda/cuda_ops.hpp"

namespace relpos::cuda {

namespace {
__global__ void concat_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                              std::int64_t total, std::int64_t ca, std::int64_t cb, std::int64_t h, std::int64_t w,
                              std::int64_t hb, std::int64_t wb, int stride) {
  const std::int64_t c = ca + cb;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t ch = i % c, p = i / c;  // p: output pixel (image, y, x)
    const std::int64_t x = p % w, y = (p / w) % h, img = p / (w * h);
    out[i] = ch < ca ? a[p * ca + ch] : b[((img * hb + y * stride) * wb + x * stride) * cb + (ch - ca)];
  }
}
}  // namespace

Tensor concat_channels(const Tensor& a_in, const Tensor& b_in, int b_stride) {
  require_cuda(a_in, "concat_channels");
  const Tensor a = a_in.channels_last(), b = b_in.channels_last();
  const std::int64_t n = a.dim(0), ca = a.dim(1), h = a.dim(2), w = a.dim(3), cb = b.dim(1);
  Tensor out({n, ca + cb, h, w}, Device::CUDA, Layout::ChannelsLast);
  const std::int64_t total = out.numel();
  if (total == 0) return out;
  concat_kernel<<<std::min<unsigned>(blocks_for(total), 8192), 256, 0, stream()>>>(
      a.data(), b.data(), out.data(), total, ca, cb, h, w, b.dim(2), b.dim(3), b_stride);
  RELPOS_CUDA_LAUNCHED();
  return out;
}

}  // namespace relpos::cuda
