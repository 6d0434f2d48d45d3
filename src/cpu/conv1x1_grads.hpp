// Internal: the backward of a 1x1 convolution (stride 1 or 2, no padding, no groups) by relpos's own
// kernels (conv1x1_grad_kernels.hpp), over blocks of about 64 rows of its output gradient g. The
// caller makes each block's g: the batch norm's backward writes it into a buffer that stays in the
// cache (batchnorm.cpp), and conv2d_backward hands out rows of a dy that lies in memory
// (conv2d.cpp). The weight gradient is summed per thread over a static split of the blocks and the
// threads' sums added in thread order, so it is the same bits on every run with the same thread
// count. At stride 2 a block is whole output image rows: output row y reads input row 2y at every
// other pixel (gathered first), and the block writes the gradient of input rows 2y (zero at odd
// columns) and 2y + 1 (zero).
#pragma once

#include <cstdint>
#include <functional>

namespace relpos::cpu::conv1x1 {

struct GradShape {
  std::int64_t n, h, w;  // the convolution's input (n, ic, h, w)
  std::int64_t ic, oc;
  int stride;  // 1 or 2
};

// The rows of one block of g, rows [r0, r0 + count) of (n * oh * ow) x oc: either written into
// buffer (block_rows x oc floats, the calling thread's) and buffer returned, or a pointer to them
// elsewhere.
using BlockOfG = std::function<const float*(std::int64_t r0, std::int64_t count, float* buffer)>;

// A CPU with the kernels, channels in multiples of 16 and up to 256 x 256 (each thread's weight
// gradient then stays in its L2 cache), stride 1 or 2.
bool grads_fit(std::int64_t ic, std::int64_t oc, int stride);

// dw (oc x ic) = sum of g^T x over the rows; dx (n, h, w, ic) channels-last, or null for none.
// x: the convolution's input, channels-last; w: its (oc, ic, 1, 1) weights.
void grads(const GradShape& s, const BlockOfG& block_of_g, const float* x, const float* w, float* dw, float* dx);

}  // namespace relpos::cpu::conv1x1
