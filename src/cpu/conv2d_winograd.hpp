// Internal: 3x3 stride-1 convolutions for inference through Winograd's minimal filtering
// F(4x4, 3x3) (Lavin and Gray, 2015): each 4x4 output tile costs 36 multiply-adds per input and
// output channel instead of 144. The input tiles (6x6) and the kernels are transformed, 36
// independent matrix products run over the channels, and the products are transformed back to
// the output, with the bias and activation applied there. Activations are channels-last (nhwc).
//
// Built with AVX2 and FMA (CMakeLists.txt sets the flags for conv2d_winograd.cpp); conv2d()
// calls it only where the CPU has them (available()). tools/bench/README.md has the measurements
// and the accuracy against the direct convolution; RELPOS_WINOGRAD=0 turns it off (oneDNN's direct
// convolution then runs, as for every other shape).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "relpos/ops.hpp"

namespace relpos::cpu::winograd {

// The CPU runs the kernels (cpu_features.hpp: AVX2 and FMA, RELPOS_SIMD not "generic"), and
// RELPOS_WINOGRAD is not set to 0.
bool available();

// Whether a convolution suits these kernels: 3x3, stride 1, padding 1, no groups, channel counts
// multiples of 8 with at most 2^20 kernels, no activation but ReLU.
bool suits(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kh, std::int64_t kw, int stride,
           int pad, int groups, Act act);

// The transformed kernels, packed for the matrix products: [36][out_pad / 16][in][16], with the
// output channels padded with zeros to a multiple of 16; and a copy of the bias.
struct Weights {
  std::int64_t in = 0, out = 0, out_pad = 0;
  std::vector<float> u;
  std::vector<float> bias;  // out values, zeros without a bias
};

// w: (out, in, 3, 3) contiguous; bias: out values or null. With `turned`, w is a forward
// convolution's (in, out, 3, 3) kernels and the result convolves its output gradient into its input
// gradient: the kernels turned by 180 degrees with input and output channels swapped.
std::shared_ptr<Weights> transform_weights(const float* w, std::int64_t out, std::int64_t in, const float* bias,
                                           bool turned);

// y = act(conv(x, w) + bias), x (n, h, w, in) and y (n, h, w, out) both channels-last, on
// omp_get_max_threads() threads.
void conv3x3(const float* x, std::int64_t n, std::int64_t h, std::int64_t w, const Weights& wt, Act act, float* y);

// The weight gradient of the same convolution: dw (out, in, 3, 3) from x (n, h, w, in) and the
// output gradient dy (n, h, w, out), both channels-last. With Y = A^T [(G g G^T) (.) (B^T d B)] A,
// the gradient of each 3x3 kernel is G^T [sum over tiles of (A dY A^T) (.) (B^T d B)] G: 36
// products over the tiles, then one small transform per (out, in) pair.
void conv3x3_weight_grad(const float* x, const float* dy, std::int64_t n, std::int64_t h, std::int64_t w,
                         std::int64_t in, std::int64_t out, float* dw);

}  // namespace relpos::cpu::winograd
