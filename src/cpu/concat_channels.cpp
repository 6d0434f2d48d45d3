// concat_channels on the CPU (relpos/ops.hpp): per output pixel, a's channels then b's, both rows
// of channels-last memory copied whole.
#include <cstring>

#include "cpu/cpu_ops.hpp"

namespace relpos::cpu {

Tensor concat_channels(const Tensor& a_in, const Tensor& b_in, int b_stride) {
  const Tensor a = a_in.channels_last(), b = b_in.channels_last();
  const std::int64_t n = a.dim(0), ca = a.dim(1), h = a.dim(2), w = a.dim(3);
  const std::int64_t cb = b.dim(1), hb = b.dim(2), wb = b.dim(3), c = ca + cb;
  Tensor out({n, c, h, w}, Device::CPU, Layout::ChannelsLast);
  const float* ap = a.data();
  const float* bp = b.data();
  float* op = out.data();
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t y = 0; y < h; ++y) {
      const float* arow = ap + (i * h + y) * w * ca;
      const float* brow = bp + ((i * hb + y * b_stride) * wb) * cb;
      float* orow = op + (i * h + y) * w * c;
      for (std::int64_t x = 0; x < w; ++x) {
        std::memcpy(orow + x * c, arow + x * ca, static_cast<std::size_t>(ca) * sizeof(float));
        std::memcpy(orow + x * c + ca, brow + x * b_stride * cb, static_cast<std::size_t>(cb) * sizeof(float));
      }
    }
  return out;
}

}  // namespace relpos::cpu
