// Internal: 3x3 convolutions of inputs with few channels (an RGB image into a network's stem) on
// AVX2, forward and weight gradient. oneDNN 2.6 runs these shapes on AVX2 in its blocked layout, with reorders on
// both sides (the input into it, the output out of it): botnet26t_256's 3 -> 24 stride-2 stem
// convolution took 0.29 ms (hot caches) to 0.72 ms (cold) at batch 1 and 3.1 ms at batch 8 on a
// 2-vCPU EPYC; these kernels 0.23 and 1.6 ms (tools/bench/README.md). For each output row, the
// input rows under it are copied planar with zero borders from the input as it lies (planar NCHW or
// channels-last), and each pixel's 3 x 3 x in values are read from that copy and multiplied by the
// kernels, packed [in x 3 x 3][out], four pixels at a time with the sums in registers; bias and ReLU
// are applied before the channels-last store. The weight gradient keeps each input row's three taps
// x the output channels in registers across an output row's pixels; on the Fashion-MNIST BoTNet's
// 1 -> 32 stem at batch 128 it took the stem's backward from 5.9 to 0.7 ms a step, where oneDNN's
// AVX2 weight gradient ran at 7 GMAC/s plus its reorders (tools/bench/README.md).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "relpos/ops.hpp"

namespace relpos::cpu::narrow_input {

// 3x3, padding 1, stride 1 or 2, no groups, at most 4 input channels, 8, 16, 24 or 32 output
// channels, no activation but ReLU; a CPU with AVX2 and FMA and without the AVX-512 kernels (where
// they run, oneDNN's channels-last kernels have no reorders and stay, unmeasured against these);
// RELPOS_WINOGRAD=0 (which turns off relpos's own convolution kernels) turns these off too.
bool suits(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kh, std::int64_t kw, int stride,
           int pad, int groups, Act act);

struct Weights {
  std::int64_t in = 0, out = 0;
  std::vector<float> w;     // [in * 9][out]
  std::vector<float> bias;  // out values, zeros without a bias
};
// w: (out, in, 3, 3) contiguous; bias: out values or null.
std::shared_ptr<Weights> pack(const float* w, std::int64_t out, std::int64_t in, const float* bias);

// Where the input's elements lie: (b, c, y, x) at b * sb + c * sc + y * sy + x * sx.
struct InputView {
  const float* data;
  std::int64_t n, h, w, sb, sc, sy, sx;
};

// y = act(conv(x, w) + bias) into y (n, oh, ow, out) channels-last, on omp_get_max_threads() threads.
void conv3x3(const InputView& x, int stride, const Weights& wt, Act act, float* y);

// The weight gradient dw (out, in, 3, 3) contiguous of that convolution, from its input x and the
// gradient dy (n, oh, ow, out) channels-last of its output. Each thread sums a whole number of
// output rows (a static split), and the threads' sums are added in thread order: the same bits on
// every run with the same thread count.
void weight_grad(const InputView& x, int stride, const float* dy, std::int64_t in, std::int64_t out, float* dw);

// ---- between conv2d_narrow_input.cpp and the AVX2 build of the kernels ----
constexpr int kMaxIn = 4;
struct PackedKernels {
  const float* w;
  const float* bias;
  std::int64_t in, out;
};
void conv3x3_avx2(const InputView& x, int stride, const PackedKernels& wt, Act act, float* y);
// Adds the weight gradient's products for output rows [r0, r1) (r = image * oh + output row) to
// sums [in * 9][out]; rows: scratch of ow * stride + 2 floats.
void weight_grad_rows_avx2(const InputView& x, int stride, const float* dy, std::int64_t in, std::int64_t out,
                           std::int64_t r0, std::int64_t r1, float* rows, float* sums);

}  // namespace relpos::cpu::narrow_input
