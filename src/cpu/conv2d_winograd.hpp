// Internal: 3x3 stride-1 convolutions for inference through Winograd's minimal filtering
// F(4x4, 3x3) (Lavin and Gray, 2015): each 4x4 output tile costs 36 multiply-adds per input and
// output channel instead of 144. The input tiles (6x6) and the kernels are transformed, 36
// independent matrix products run over the channels, and the products are transformed back to
// the output, with the bias and activation applied there. Activations are channels-last (nhwc).
//
// The kernels are written once for a number of float lanes (conv2d_winograd_kernels.inc) and built
// twice: with AVX2 + FMA, 8 lanes (conv2d_winograd_avx2.cpp), and with AVX-512, 16 lanes
// (conv2d_winograd_avx512.cpp). conv2d() calls them only where the CPU has AVX2 and FMA
// (available()); the AVX-512 build runs where the CPU has AVX-512 (cpu_features.hpp) and both channel
// counts are multiples of 16 (in the forward, input channels in multiples of 8).
// tools/bench/README.md has the measurements and the accuracy against the direct convolution;
// RELPOS_WINOGRAD=0 turns them off (oneDNN's direct convolution then runs, as for every other
// shape), RELPOS_SIMD=avx2 keeps the AVX2 build.
#pragma once

#include <cstddef>
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
// In training (the kernels transformed at every call), for a convolution that suits them: whether
// they beat oneDNN's for the forward and input gradient (weight_grad false) or the weight gradient
// of n images of h x w (conv2d.cpp has the measurements).
bool suits_training(std::int64_t in_channels, std::int64_t out_channels, std::int64_t n, std::int64_t h,
                    std::int64_t w, bool weight_grad);

// The transformed kernels, packed for the matrix products: [36][out_pad / cols][in][cols], with
// the output channels padded with zeros to a multiple of cols (twice the lanes of the build that
// runs them); and a copy of the bias.
struct Weights {
  std::int64_t in = 0, out = 0, out_pad = 0;
  int lanes = 8;   // 8: the AVX2 build runs them, 16: the AVX-512 build
  int stride = 1;  // 2: transformed for conv3x3_s2
  std::shared_ptr<float> u;  // kPos * out_pad * in floats, in huge-page arena memory (core/huge_page_arena.hpp)
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

// Stride 2 (inference): 3x3, stride 2, padding 1, x (n, h, w, in) and y (n, (h - 1) / 2 + 1,
// (w - 1) / 2 + 1, out), both channels-last. Each 4x4 output tile's 9x9 input tile splits by the
// parity of its rows and columns into four correlations with 2x2, 2x1, 1x2 and 1x1 kernels, run
// through F(4x4, 2x2), F(4, 2) and none: 81 multiply-adds per tile and channel pair instead of 144
// (conv2d_winograd_kernels.inc has the transforms). suits_stride2() says where it runs.
bool suits_stride2(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kh, std::int64_t kw, int stride,
                   int pad, int groups, Act act);
std::shared_ptr<Weights> transform_weights_s2(const float* w, std::int64_t out, std::int64_t in, const float* bias);
void conv3x3_s2(const float* x, std::int64_t n, std::int64_t h, std::int64_t w, const Weights& wt, Act act, float* y);

// The weight gradient of the same convolution: dw (out, in, 3, 3) from x (n, h, w, in) and the
// output gradient dy (n, h, w, out), both channels-last. With Y = A^T [(G g G^T) (.) (B^T d B)] A,
// the gradient of each 3x3 kernel is G^T [sum over tiles of (A dY A^T) (.) (B^T d B)] G: 36
// products over the tiles, then one small transform per (out, in) pair.
void conv3x3_weight_grad(const float* x, const float* dy, std::int64_t n, std::int64_t h, std::int64_t w,
                         std::int64_t in, std::int64_t out, float* dw);

// The weight gradient of a 3x3 stride-2 convolution (padding 1): dw (out, in, 3, 3) from x (n, h, w,
// in) and dy (n, (h - 1) / 2 + 1, (w - 1) / 2 + 1, out), both channels-last. Not Winograd: the
// direct multiply-adds, as 9 products (one per tap) over chunks of output pixels through the same
// register-blocked product kernel. suits_weight_grad_s2() says where it runs.
bool suits_weight_grad_s2(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kh, std::int64_t kw,
                          int stride, int pad, int groups, std::int64_t pixels);
void conv3x3_s2_weight_grad(const float* x, const float* dy, std::int64_t n, std::int64_t h, std::int64_t w,
                            std::int64_t in, std::int64_t out, float* dw);

// Its input gradient: dx (n, h, w, in) from dy (n, (h - 1) / 2 + 1, (w - 1) / 2 + 1, out), both
// channels-last, and w (out, in, 3, 3). One product of dy with the kernels (out x 9 in) per chunk of
// an image's output rows through the same register-blocked kernel, its 9 taps then added into the
// input pixels under them. suits_input_grad_s2() says where it runs.
bool suits_input_grad_s2(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kh, std::int64_t kw,
                         int stride, int pad, int groups, std::int64_t n, std::int64_t pixels);
void conv3x3_s2_input_grad(const float* dy, const float* w, std::int64_t n, std::int64_t h, std::int64_t wd,
                           std::int64_t in, std::int64_t out, float* dx);

// ---- between conv2d_winograd.cpp and the kernel builds ----

// Weights without std::vector (the kernel builds use no standard-library templates).
struct PackedKernels {
  const float* u;
  const float* bias;
  std::int64_t in, out, out_pad;
};

// dw[o][c] (out, in, 3, 3) = G^T S G, S[36][out][in_pad] being the sum of `threads` per-thread sums
// that start at `sums` and lie `stride` floats apart, added in thread order.
void finish_weight_grad(const float* sums, std::size_t stride, int threads, std::int64_t in, std::int64_t out,
                        std::int64_t in_pad, float* dw);

struct KernelSet {
  void (*conv3x3)(const float* x, std::int64_t n, std::int64_t h, std::int64_t w, const PackedKernels& wt, Act act,
                  float* y);
  void (*weight_grad)(const float* x, const float* dy, std::int64_t n, std::int64_t h, std::int64_t w,
                      std::int64_t in, std::int64_t out, float* dw);
  void (*conv3x3_s2)(const float* x, std::int64_t n, std::int64_t h, std::int64_t w, const PackedKernels& wt,
                     Act act, float* y);
  void (*weight_grad_s2)(const float* x, const float* dy, std::int64_t n, std::int64_t h, std::int64_t w,
                         std::int64_t in, std::int64_t out, float* dw);
  void (*input_grad_s2)(const float* dy, const float* u, std::int64_t n, std::int64_t h, std::int64_t w,
                        std::int64_t in, std::int64_t out, float* dx);
  int lanes;
};
namespace avx2 {
extern const KernelSet kKernels;
}
namespace avx512 {
extern const KernelSet kKernels;
}

}  // namespace relpos::cpu::winograd
