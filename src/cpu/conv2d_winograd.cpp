// Winograd F(4x4, 3x3) convolutions (conv2d_winograd.hpp): the parts that are not vector kernels,
// built for any x86-64 CPU: transforming the kernels (in double), the last step of the weight
// gradient, and choosing the kernel build (conv2d_winograd_kernels.inc, built for AVX2 and for
// AVX-512) for each convolution.
#include "cpu/conv2d_winograd.hpp"

#include <omp.h>

#include <algorithm>

#include "core/huge_page_arena.hpp"
#include "cpu/cpu_features.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu::winograd {

namespace {

constexpr int kIn = 6;    // input tile
constexpr int kPos = 36;  // positions in the transformed tile

// G: the kernels' transforms (forward and weight gradient) are made with it, in double.
//   G = [1/4 0 0;  -1/6 -1/6 -1/6;  -1/6 1/6 -1/6;  1/24 1/12 1/6;  1/24 -1/12 1/6;  0 0 1]
constexpr double G[kIn][3] = {{1.0 / 4, 0, 0},         {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                              {1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6},  {0, 0, 1}};

// The AVX-512 build for these channel counts, else the AVX2 one. The forward takes input channels in
// multiples of 8 there too (the last vector of its input transform half full: the stem's 24 -> 32
// convolution); the weight gradient needs whole vectors on both sides.
const KernelSet& kernels_for(std::int64_t in, std::int64_t out, bool forward = false) {
  return avx512_kernels() && in % (forward ? 8 : 16) == 0 && out % 16 == 0 ? avx512::kKernels : avx2::kKernels;
}

// Weights for the build that will run them, the 36 transformed kernels zeroed (so are the padding
// output channels), the bias copied.
std::shared_ptr<Weights> empty_weights(std::int64_t out, std::int64_t in, const float* bias, int stride) {
  auto wt = std::make_shared<Weights>();
  wt->in = in;
  wt->out = out;
  wt->stride = stride;
  wt->lanes = kernels_for(in, out, true).lanes;
  const std::int64_t cols = 2 * wt->lanes;
  wt->out_pad = (out + cols - 1) / cols * cols;
  const std::size_t n = static_cast<std::size_t>(kPos * wt->out_pad * in);
  wt->u = detail::arena_array<float>(n);
  std::fill(wt->u.get(), wt->u.get() + n, 0.0f);
  wt->bias.assign(static_cast<std::size_t>(out), 0.0f);
  if (bias) std::copy(bias, bias + out, wt->bias.begin());
  return wt;
}

}  // namespace

std::shared_ptr<Weights> transform_weights(const float* w, std::int64_t out, std::int64_t in, const float* bias,
                                           bool turned) {
  auto wt = empty_weights(out, in, bias, 1);
  const std::int64_t cols = 2 * wt->lanes, blocks = wt->out_pad / cols;
  float* u_out = wt->u.get();
#pragma omp parallel for schedule(static)
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t c = 0; c < in; ++c) {
      double k[3][3];
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j)
          k[i][j] = turned ? w[((c * out + o) * 3 + 2 - i) * 3 + 2 - j] : w[((o * in + c) * 3 + i) * 3 + j];
      double gk[kIn][3];  // G g
      for (int i = 0; i < kIn; ++i)
        for (int j = 0; j < 3; ++j) gk[i][j] = G[i][0] * k[0][j] + G[i][1] * k[1][j] + G[i][2] * k[2][j];
      for (int i = 0; i < kIn; ++i)
        for (int j = 0; j < kIn; ++j) {
          const double u = gk[i][0] * G[j][0] + gk[i][1] * G[j][1] + gk[i][2] * G[j][2];  // (G g) G^T
          const std::int64_t p = i * kIn + j;
          u_out[((p * blocks + o / cols) * in + c) * cols + o % cols] = static_cast<float>(u);
        }
    }
  return wt;
}

std::shared_ptr<Weights> transform_weights_s2(const float* w, std::int64_t out, std::int64_t in, const float* bias) {
  // F(4, 2)'s G for the points 0, 1, -1, 2 and infinity
  constexpr double G2[5][2] = {{1.0 / 2, 0}, {-1.0 / 2, -1.0 / 2}, {-1.0 / 6, 1.0 / 6}, {1.0 / 6, 1.0 / 3}, {0, 1}};
  auto wt = empty_weights(out, in, bias, 2);
  const std::int64_t cols = 2 * wt->lanes, blocks = wt->out_pad / cols;
  float* u_out = wt->u.get();
#pragma omp parallel for schedule(static)
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t c = 0; c < in; ++c) {
      auto k = [&](int i, int j) { return static_cast<double>(w[((o * in + c) * 3 + i) * 3 + j]); };
      auto put = [&](int q, double u) {
        u_out[((q * blocks + o / cols) * in + c) * cols + o % cols] = static_cast<float>(u);
      };
      for (int a = 0; a < 5; ++a) {
        // the corner taps (rows and columns 0 and 2) through G2 on both sides: positions 0..24
        for (int b = 0; b < 5; ++b) {
          double u = 0.0;
          for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j) u += G2[a][i] * k(2 * i, 2 * j) * G2[b][j];
          put(a * 5 + b, u);
        }
        put(25 + a, G2[a][0] * k(0, 1) + G2[a][1] * k(2, 1));  // the middle column's taps down the rows
        put(30 + a, G2[a][0] * k(1, 0) + G2[a][1] * k(1, 2));  // the middle row's taps along the columns
      }
      put(35, k(1, 1));
    }
  return wt;
}

void conv3x3_s2(const float* x, std::int64_t n, std::int64_t h, std::int64_t w, const Weights& wt, Act act,
                float* y) {
  RELPOS_CHECK(wt.stride == 2, "winograd: kernels transformed for stride " << wt.stride << " used at stride 2");
  const PackedKernels view{wt.u.get(), wt.bias.data(), wt.in, wt.out, wt.out_pad};
  (wt.lanes == 16 ? avx512::kKernels : avx2::kKernels).conv3x3_s2(x, n, h, w, view, act, y);
}

void conv3x3(const float* x, std::int64_t n, std::int64_t h, std::int64_t w, const Weights& wt, Act act, float* y) {
  RELPOS_CHECK(wt.stride == 1, "winograd: kernels transformed for stride " << wt.stride << " used at stride 1");
  const PackedKernels view{wt.u.get(), wt.bias.data(), wt.in, wt.out, wt.out_pad};
  (wt.lanes == 16 ? avx512::kKernels : avx2::kKernels).conv3x3(x, n, h, w, view, act, y);
}

void conv3x3_weight_grad(const float* x, const float* dy, std::int64_t n, std::int64_t h, std::int64_t w,
                         std::int64_t in, std::int64_t out, float* dw) {
  kernels_for(in, out).weight_grad(x, dy, n, h, w, in, out, dw);
}

void conv3x3_s2_weight_grad(const float* x, const float* dy, std::int64_t n, std::int64_t h, std::int64_t w,
                            std::int64_t in, std::int64_t out, float* dw) {
  kernels_for(in, out).weight_grad_s2(x, dy, n, h, w, in, out, dw);
}

void conv3x3_s2_input_grad(const float* dy, const float* w, std::int64_t n, std::int64_t h, std::int64_t wd,
                           std::int64_t in, std::int64_t out, float* dx) {
  // the AVX2 build, measured (suits_input_grad_s2 keeps it to AVX2-only CPUs; the AVX-512 build's
  // column blocks of 32 would need in to be a multiple of 32)
  const KernelSet& k = avx2::kKernels;
  RELPOS_CHECK(in % 16 == 0,
               "winograd: the stride-2 input gradient takes input channels in multiples of 16, not " << in);
  const std::int64_t cols_per_block = 2 * k.lanes;
  // u[j / cols_per_block][o][j % cols_per_block] = w[o][c][tap] for column j = tap * in + c
  std::vector<float> u(static_cast<std::size_t>(9 * in * out));
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t c = 0; c < in; ++c)
      for (std::int64_t tap = 0; tap < 9; ++tap) {
        const std::int64_t j = tap * in + c;
        u[static_cast<std::size_t>((j / cols_per_block * out + o) * cols_per_block + j % cols_per_block)] =
            w[(o * in + c) * 9 + tap];
      }
  k.input_grad_s2(dy, u.data(), n, h, wd, in, out, dx);
}

void finish_weight_grad(const float* sums, std::size_t stride, int threads, std::int64_t in, std::int64_t out,
                        std::int64_t in_pad, float* dw) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t c = 0; c < in; ++c) {
      double sp[kIn][kIn];
      for (int p = 0; p < kPos; ++p) {
        double v = 0.0;
        for (int th = 0; th < threads; ++th) v += sums[static_cast<std::size_t>(th) * stride + (p * out + o) * in_pad + c];
        sp[p / kIn][p % kIn] = v;
      }
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
          double v = 0.0;
          for (int a = 0; a < kIn; ++a)
            for (int b = 0; b < kIn; ++b) v += G[a][i] * sp[a][b] * G[b][j];
          dw[((o * in + c) * 3 + i) * 3 + j] = static_cast<float>(v);
        }
    }
}

}  // namespace relpos::cpu::winograd
