// The table of op cases (see op_cases.hpp) and the naive CPU references of the simple ops.
#include "op_cases.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>

#include "core/ops_internal.hpp"
#include "relpos/attention_ops.hpp"
#include "relpos/ops.hpp"
#include "test_util.hpp"

namespace relpos::test {

namespace {

using Vec = std::vector<float>;

Tensor rnd(const Shape& s, std::uint32_t seed, float scale = 1.0f, Layout layout = Layout::Contiguous) {
  std::mt19937 rng(seed);
  return random_tensor(s, rng, scale).to_layout(layout);
}
Tensor positive(const Shape& s, std::uint32_t seed) {  // variances
  Vec v = rnd(s, seed).to_vector();
  for (float& x : v) x = 0.5f + std::fabs(x);
  return Tensor::from_vector(s, v);
}
Tensor scalar(float v) { return Tensor::from_vector({1}, {v}); }

float act_of(float v, Act a) {
  if (a == Act::ReLU) return std::max(0.0f, v);
  if (a == Act::SiLU) return v / (1.0f + std::exp(-v));
  return v;
}

std::string shape_text(const Shape& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out;
}

// ---- naive references (NCHW index arithmetic on plain vectors) --------------------------------

Tensor ref_conv(const Tensor& xt, const Tensor& wt, const Tensor* bias, const ops::ConvSpec& sp,
                const Tensor* residual, Act act) {
  const auto x = xt.to_vector(), w = wt.to_vector();
  const std::int64_t N = xt.dim(0), C = xt.dim(1), H = xt.dim(2), W = xt.dim(3);
  const std::int64_t O = wt.dim(0), Cg = wt.dim(1), KH = wt.dim(2), KW = wt.dim(3);
  const std::int64_t OH = (H + 2 * sp.pad - KH) / sp.stride + 1, OW = (W + 2 * sp.pad - KW) / sp.stride + 1;
  const std::int64_t Og = O / sp.groups;
  Vec b = bias ? bias->to_vector() : Vec(static_cast<std::size_t>(O), 0.0f);
  Vec r = residual ? residual->to_vector() : Vec();
  Vec y(static_cast<std::size_t>(N * O * OH * OW));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t oy = 0; oy < OH; ++oy)
        for (std::int64_t ox = 0; ox < OW; ++ox) {
          double acc = b[static_cast<std::size_t>(o)];
          const std::int64_t g = o / Og;
          for (std::int64_t c = 0; c < Cg; ++c)
            for (std::int64_t ky = 0; ky < KH; ++ky)
              for (std::int64_t kx = 0; kx < KW; ++kx) {
                const std::int64_t iy = oy * sp.stride - sp.pad + ky, ix = ox * sp.stride - sp.pad + kx;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                acc += static_cast<double>(x[static_cast<std::size_t>(((n * C + g * Cg + c) * H + iy) * W + ix)]) *
                       w[static_cast<std::size_t>(((o * Cg + c) * KH + ky) * KW + kx)];
              }
          const std::size_t i = static_cast<std::size_t>(((n * O + o) * OH + oy) * OW + ox);
          if (residual) acc += r[i];
          y[i] = act_of(static_cast<float>(acc), act);
        }
  return Tensor::from_vector({N, O, OH, OW}, y);
}

// y = act(gamma * (x - mean) / sqrt(var + eps) + beta) per channel of NCHW x.
Tensor ref_norm(const Tensor& xt, const Vec& gamma, const Vec& beta, const Vec& mean, const Vec& var, float eps, Act act) {
  Vec x = xt.to_vector();
  const std::int64_t C = xt.dim(1), hw = xt.dim(2) * xt.dim(3);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t c = static_cast<std::size_t>((static_cast<std::int64_t>(i) / hw) % C);
    x[i] = act_of(static_cast<float>(gamma[c] * (x[i] - mean[c]) / std::sqrt(static_cast<double>(var[c]) + eps) + beta[c]), act);
  }
  return Tensor::from_vector(xt.shape(), x);
}

// Batch statistics of NCHW x per channel: mean and biased variance.
void batch_stats(const Tensor& xt, Vec& mean, Vec& var) {
  const Vec x = xt.to_vector();
  const std::int64_t C = xt.dim(1), hw = xt.dim(2) * xt.dim(3), n = xt.dim(0) * hw;
  mean.assign(static_cast<std::size_t>(C), 0.0f);
  var.assign(static_cast<std::size_t>(C), 0.0f);
  for (std::int64_t c = 0; c < C; ++c) {
    double s = 0.0, s2 = 0.0;
    for (std::int64_t b = 0; b < xt.dim(0); ++b)
      for (std::int64_t p = 0; p < hw; ++p) {
        const double v = x[static_cast<std::size_t>((b * C + c) * hw + p)];
        s += v, s2 += v * v;
      }
    const double m = s / static_cast<double>(n);
    mean[static_cast<std::size_t>(c)] = static_cast<float>(m);
    var[static_cast<std::size_t>(c)] = static_cast<float>(s2 / static_cast<double>(n) - m * m);
  }
}

Tensor ref_pool(const Tensor& xt, const ops::PoolSpec& sp) {
  const Vec x = xt.to_vector();
  const std::int64_t N = xt.dim(0), C = xt.dim(1), H = xt.dim(2), W = xt.dim(3);
  const std::int64_t OH = (H + 2 * sp.pad - sp.kernel) / sp.stride + 1, OW = (W + 2 * sp.pad - sp.kernel) / sp.stride + 1;
  Vec y(static_cast<std::size_t>(N * C * OH * OW));
  for (std::int64_t nc = 0; nc < N * C; ++nc)
    for (std::int64_t oy = 0; oy < OH; ++oy)
      for (std::int64_t ox = 0; ox < OW; ++ox) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0.0;
        int count = 0;
        for (int ky = 0; ky < sp.kernel; ++ky)
          for (int kx = 0; kx < sp.kernel; ++kx) {
            const std::int64_t iy = oy * sp.stride - sp.pad + ky, ix = ox * sp.stride - sp.pad + kx;
            if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
            const double v = x[static_cast<std::size_t>((nc * H + iy) * W + ix)];
            best = std::max(best, v), sum += v, ++count;
          }
        y[static_cast<std::size_t>((nc * OH + oy) * OW + ox)] =
            static_cast<float>(sp.kind == ops::PoolKind::Max ? best : sum / count);
      }
  return Tensor::from_vector({N, C, OH, OW}, y);
}

// (M, K) @ (K, N) with optional transposes of the stored matrices.
Tensor ref_matmul(const Tensor& at, const Tensor& bt, bool ta, bool tb) {
  const Vec a = at.to_vector(), b = bt.to_vector();
  const std::int64_t M = ta ? at.dim(1) : at.dim(0), K = ta ? at.dim(0) : at.dim(1), N = tb ? bt.dim(0) : bt.dim(1);
  Vec y(static_cast<std::size_t>(M * N));
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double acc = 0.0;
      for (std::int64_t k = 0; k < K; ++k)
        acc += static_cast<double>(a[static_cast<std::size_t>(ta ? k * M + i : i * K + k)]) *
               b[static_cast<std::size_t>(tb ? j * K + k : k * N + j)];
      y[static_cast<std::size_t>(i * N + j)] = static_cast<float>(acc);
    }
  return Tensor::from_vector({M, N}, y);
}

Tensor ref_softmax(const Tensor& xt) {
  Vec x = xt.to_vector();
  const std::int64_t rows = xt.dim(0), n = xt.dim(1);
  for (std::int64_t r = 0; r < rows; ++r) {
    float* p = x.data() + r * n;
    const float m = *std::max_element(p, p + n);
    double s = 0.0;
    for (std::int64_t j = 0; j < n; ++j) s += std::exp(static_cast<double>(p[j] - m));
    for (std::int64_t j = 0; j < n; ++j) p[j] = static_cast<float>(std::exp(static_cast<double>(p[j] - m)) / s);
  }
  return Tensor::from_vector(xt.shape(), x);
}

// rel[n, i, j] = q[n, i] . Rh[off(yj - yi)] + q[n, i] . Rw[off(xj - xi)] (docs/attention.md).
Tensor ref_rel_logits(const Tensor& qt, const Tensor& th, const Tensor& tw, int H, int W, int clip) {
  const Vec q = qt.to_vector(), rh = th.to_vector(), rw = tw.to_vector();
  const std::int64_t B = qt.dim(0), N = qt.dim(1), d = qt.dim(2);
  const auto row = [&](int off, int size) {
    return clip > 0 ? std::clamp(off, -clip, clip) + clip : off + size - 1;
  };
  Vec y(static_cast<std::size_t>(B * N * N));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        const int yi = static_cast<int>(i / W), xi = static_cast<int>(i % W), yj = static_cast<int>(j / W),
                  xj = static_cast<int>(j % W);
        const std::int64_t rhr = row(yj - yi, H), rwr = row(xj - xi, W);
        double acc = 0.0;
        for (std::int64_t k = 0; k < d; ++k)
          acc += static_cast<double>(q[static_cast<std::size_t>((b * N + i) * d + k)]) *
                 (rh[static_cast<std::size_t>(rhr * d + k)] + rw[static_cast<std::size_t>(rwr * d + k)]);
        y[static_cast<std::size_t>((b * N + i) * N + j)] = static_cast<float>(acc);
      }
  return Tensor::from_vector({B, N, N}, y);
}

// ---- the cases --------------------------------------------------------------------------------

// A forward case's run and reference for conv2d with a plan cache, as layers run it (inputs: x,
// kernels, bias; the bias used or not).
void with_plan_cache(OpCase& c, const ops::ConvSpec& sp, bool bias, Act act) {
  auto cache = std::make_shared<OpCache>();  // the weights never change inside a case
  c.run = [sp, cache, bias, act](const std::vector<Tensor>& in, const Tensor&) {
    return OpRun{{ops::conv2d(in[0], in[1], bias ? &in[2] : nullptr, sp, {nullptr, act}, cache.get())}, {}};
  };
  c.reference = [sp, bias, act](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ref_conv(in[0], in[1], bias ? &in[2] : nullptr, sp, nullptr, act)};
  };
}

void conv_cases(std::vector<OpCase>& out) {
  struct Shp {
    Shape x;
    int o, k, stride, pad, groups;
  };
  // backward: no bias or epilogue (conv2d_backward is the convolution's own gradient)
  for (const Shp& s : {Shp{{2, 3, 5, 5}, 4, 3, 1, 1, 1}, Shp{{2, 4, 7, 7}, 6, 3, 2, 1, 2}, Shp{{2, 4, 6, 6}, 4, 1, 2, 0, 1},
                       Shp{{2, 2, 6, 6}, 3, 5, 1, 2, 1}, Shp{{1, 6, 5, 9}, 6, 3, 1, 1, 6},
                       // 1x1 over several images: the CPU folds the batch into the height, at stride
                       // 2 only where the height is even (the second must not fold)
                       Shp{{3, 5, 4, 7}, 6, 1, 1, 0, 1}, Shp{{2, 4, 7, 6}, 4, 1, 2, 0, 1}, Shp{{3, 4, 6, 5}, 5, 1, 2, 0, 1},
                       // channels in whole SIMD blocks: the CPU runs these in oneDNN's blocked layout
                       // (the stride-2 forward on AVX2 through Winograd's stride-2 kernels, as in training)
                       Shp{{2, 16, 9, 9}, 24, 3, 2, 1, 1}, Shp{{2, 16, 6, 7}, 16, 3, 1, 1, 1},
                       // 3x3 stride 1 with channels in multiples of 8: Winograd on AVX2, forward and
                       // input gradient (8 in, 24 out, so that swapping them in the backward shows);
                       // in multiples of 16 the AVX-512 build where the CPU has it (48 in: the weight
                       // gradient's 32-channel blocks padded). The weight gradient takes Winograd's
                       // kernels from 56 x 56 maps on with AVX-512, from 2048 pixels a batch on with
                       // AVX2 only (winograd::suits_training): the last map either way.
                       Shp{{2, 8, 9, 5}, 24, 3, 1, 1, 1}, Shp{{2, 48, 7, 9}, 16, 3, 1, 1, 1},
                       Shp{{1, 16, 56, 57}, 16, 3, 1, 1, 1},
                       // 3x3 stride 2 from 64 x 64 channels and 196 output pixels: on AVX2 the weight
                       // gradient by relpos's own products (winograd::suits_weight_grad_s2); 72 input
                       // channels pad the last 16-channel block, an odd width leaves the last column's
                       // right taps off the map, 800 pixels make several chunks across the threads,
                       // and 64 output channels a tail of 4 rows after the blocks of 6
                       Shp{{2, 72, 40, 39}, 64, 3, 2, 1, 1},
                       // 3x3 of 1 to 4 input channels into 8 to 32 (a network's first convolution):
                       // on AVX2 the forward and the weight gradient by relpos's own kernels
                       // (conv2d_narrow_input.hpp), stride 1 and 2, odd sizes (the last pixel's
                       // right taps off the map), rows split across the threads
                       Shp{{2, 1, 9, 11}, 8, 3, 1, 1, 1}, Shp{{2, 3, 9, 11}, 24, 3, 2, 1, 1},
                       Shp{{1, 4, 7, 6}, 32, 3, 1, 1, 1}, Shp{{3, 2, 10, 13}, 16, 3, 2, 1, 1},
                       // 1x1 into 128 output channels or more, channels in multiples of 16: on AVX2
                       // both gradients by relpos's own kernels (conv1x1_grads.hpp): a partial last
                       // block of rows, stride 2 with odd sizes (blocks of whole image rows, the
                       // gradient's skipped rows and columns zero), 48 input channels in groups of
                       // 16 and 32
                       Shp{{2, 16, 5, 7}, 128, 1, 1, 0, 1}, Shp{{3, 32, 7, 9}, 128, 1, 2, 0, 1},
                       Shp{{1, 48, 4, 5}, 144, 1, 1, 0, 1},
                       // 3x3 stride 2 over 8 images and 3000 output pixels or more: on AVX2 the
                       // input gradient by relpos's products too (winograd::suits_input_grad_s2),
                       // an odd height
                       Shp{{16, 64, 27, 28}, 64, 3, 2, 1, 1}}) {
    OpCase c;
    c.covers = {"conv2d", "conv2d_backward"};
    const ops::ConvSpec sp{s.stride, s.pad, s.groups};
    c.name = "conv2d x" + shape_text(s.x) + " " + std::to_string(s.k) + "x" + std::to_string(s.k) + " s" +
             std::to_string(s.stride) + " g" + std::to_string(s.groups);
    c.inputs = {rnd(s.x, 1, 1.0f, Layout::ChannelsLast), rnd({s.o, s.x[1] / s.groups, s.k, s.k}, 2, 0.5f)};
    c.diff = {0, 1};
    c.run = [sp](const std::vector<Tensor>& in, const Tensor& dy) {
      OpRun r{{ops::conv2d(in[0], in[1], nullptr, sp)}, {}};
      if (dy.defined()) {
        const auto g = ops::conv2d_backward(in[0], in[1], dy, sp, true);
        r.grads = {g.dx, g.dw};
      }
      return r;
    };
    c.reference = [sp](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ref_conv(in[0], in[1], nullptr, sp, nullptr, Act::None)};
    };
    out.push_back(std::move(c));
  }
  // forward with the fused epilogue: bias, residual, activation
  for (Act act : {Act::ReLU, Act::SiLU}) {
    OpCase c;
    c.covers = {"conv2d"};
    const ops::ConvSpec sp{2, 1, 1};
    c.name = "conv2d 3x3 s2 + bias + residual + " + to_string(act);
    c.inputs = {rnd({2, 3, 9, 7}, 3, 1.0f, Layout::ChannelsLast), rnd({8, 3, 3, 3}, 4, 0.3f), rnd({8}, 5),
                rnd({2, 8, 5, 4}, 6, 1.0f, Layout::ChannelsLast)};
    c.run = [sp, act](const std::vector<Tensor>& in, const Tensor&) {
      return OpRun{{ops::conv2d(in[0], in[1], &in[2], sp, {&in[3], act})}, {}};
    };
    c.reference = [sp, act](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ref_conv(in[0], in[1], &in[2], sp, &in[3], act)};
    };
    out.push_back(std::move(c));
  }
  // forward with bias and activation but no residual, 16 -> 24 channels: the blocked-layout path
  {
    OpCase c;
    c.covers = {"conv2d"};
    const ops::ConvSpec sp{1, 1, 1};
    c.name = "conv2d 3x3 s1 + bias + ReLU, 16 -> 24 channels";
    c.inputs = {rnd({2, 16, 7, 6}, 7, 1.0f, Layout::ChannelsLast), rnd({24, 16, 3, 3}, 8, 0.2f), rnd({24}, 9)};
    c.run = [sp](const std::vector<Tensor>& in, const Tensor&) {
      return OpRun{{ops::conv2d(in[0], in[1], &in[2], sp, {nullptr, Act::ReLU})}, {}};
    };
    c.reference = [sp](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ref_conv(in[0], in[1], &in[2], sp, nullptr, Act::ReLU)};
    };
    out.push_back(std::move(c));
  }
  // inference with a plan cache, as layers run it: 3x3 stride-1 convolutions with channel counts in
  // multiples of 8 take the CPU's Winograd kernels (src/cpu/conv2d_winograd.hpp). Maps that are not
  // whole 4x4 tiles, output channels that are not whole 16-channel blocks, more tiles than one
  // chunk, and a row block of fewer than six tiles.
  struct WinogradShp {
    Shape x;
    int o;
    bool bias;
    Act act;
    int stride = 1;
  };
  // Channel counts in multiples of 16 take the AVX-512 build where the CPU has it (48 out: a
  // 32-channel block padded; 364 tiles: several chunks, each ending in a register block shorter
  // than AVX-512's 12 tiles).
  for (const WinogradShp& s : {WinogradShp{{2, 16, 7, 6}, 24, true, Act::ReLU}, WinogradShp{{3, 8, 9, 13}, 40, false, Act::None},
                               WinogradShp{{1, 24, 5, 5}, 8, true, Act::None},
                               WinogradShp{{4, 64, 21, 19}, 32, true, Act::ReLU},
                               WinogradShp{{2, 32, 50, 53}, 48, true, Act::ReLU},
                               // 8 mod 16 input channels, 16 output: AVX-512 with a half vector
                               // (the stem's 24 -> 32)
                               WinogradShp{{2, 24, 13, 11}, 32, true, Act::ReLU}, WinogradShp{{1, 40, 9, 9}, 16, false, Act::None},
                               // stride 2 (conv2d_winograd.hpp: conv3x3_s2, on AVX2): odd and even
                               // maps, outputs that are not whole 4x4 tiles, several chunks (98 tiles
                               // of 32 -> 48), one tile, a network-like 128 -> 128 at 16x16
                               WinogradShp{{2, 16, 7, 6}, 24, true, Act::ReLU, 2},
                               WinogradShp{{3, 8, 9, 13}, 40, false, Act::None, 2},
                               WinogradShp{{1, 24, 5, 5}, 8, true, Act::None, 2},
                               WinogradShp{{4, 64, 21, 19}, 32, true, Act::ReLU, 2},
                               WinogradShp{{2, 32, 50, 53}, 48, true, Act::ReLU, 2},
                               WinogradShp{{1, 16, 2, 3}, 16, true, Act::None, 2},
                               WinogradShp{{2, 128, 16, 16}, 128, true, Act::ReLU, 2}}) {
    OpCase c;
    c.covers = {"conv2d"};
    const ops::ConvSpec sp{s.stride, 1, 1};
    c.name = "conv2d x" + shape_text(s.x) + " -> " + std::to_string(s.o) + " 3x3 s" + std::to_string(s.stride) +
             (s.bias ? " + bias" : "") + " + " + to_string(s.act) + ", plan cache (Winograd)";
    c.inputs = {rnd(s.x, 21, 1.0f, Layout::ChannelsLast), rnd({s.o, s.x[1], 3, 3}, 22, 0.2f), rnd({s.o}, 23)};
    with_plan_cache(c, sp, s.bias, s.act);
    out.push_back(std::move(c));
  }
  // inference with a plan cache: 3x3 convolutions of inputs with 1 to 4 channels (an RGB stem) take
  // the CPU's own kernels on AVX2 (src/cpu/conv2d_narrow_input.hpp), read planar or channels-last;
  // rows that end in part of a pixel block (odd widths), 8 to 32 output channels
  struct NarrowShp {
    Shape x;
    int o, stride;
    bool bias, planar;
    Act act;
  };
  for (const NarrowShp& s : {NarrowShp{{2, 3, 9, 11}, 24, 2, true, true, Act::ReLU},
                             NarrowShp{{2, 3, 9, 11}, 24, 2, true, false, Act::ReLU},
                             NarrowShp{{1, 1, 6, 7}, 8, 1, false, true, Act::None},
                             NarrowShp{{1, 4, 7, 5}, 32, 1, true, false, Act::None},
                             NarrowShp{{3, 2, 10, 13}, 16, 2, true, true, Act::ReLU},
                             NarrowShp{{1, 3, 2, 1}, 24, 2, true, true, Act::None}}) {
    OpCase c;
    c.covers = {"conv2d"};
    const ops::ConvSpec sp{s.stride, 1, 1};
    c.name = "conv2d x" + shape_text(s.x) + (s.planar ? " planar" : " channels-last") + " -> " +
             std::to_string(s.o) + " 3x3 s" + std::to_string(s.stride) + (s.bias ? " + bias" : "") + " + " +
             to_string(s.act) + ", plan cache (few input channels)";
    c.inputs = {rnd(s.x, 31, 1.0f, s.planar ? Layout::Contiguous : Layout::ChannelsLast), rnd({s.o, s.x[1], 3, 3}, 32, 0.3f),
                rnd({s.o}, 33)};
    with_plan_cache(c, sp, s.bias, s.act);
    out.push_back(std::move(c));
  }
  // network-sized convolutions (botnet26t_256's) for the micro-benchmark, with a plan cache as
  // layers run them; too big for the naive reference, they run the kernels the cases above check
  for (const Shp& s : {Shp{{1, 64, 64, 64}, 256, 1, 1, 0, 1}, Shp{{8, 64, 64, 64}, 256, 1, 1, 0, 1},
                       Shp{{1, 64, 64, 64}, 64, 3, 1, 1, 1}, Shp{{8, 64, 64, 64}, 64, 3, 1, 1, 1},
                       Shp{{1, 128, 64, 64}, 128, 3, 2, 1, 1}, Shp{{8, 128, 64, 64}, 128, 3, 2, 1, 1},
                       Shp{{1, 3, 256, 256}, 24, 3, 2, 1, 1}, Shp{{8, 3, 256, 256}, 24, 3, 2, 1, 1},
                       Shp{{1, 256, 32, 32}, 256, 3, 2, 1, 1}, Shp{{8, 256, 32, 32}, 256, 3, 2, 1, 1},
                       Shp{{1, 256, 16, 16}, 512, 1, 1, 0, 1}, Shp{{8, 256, 16, 16}, 512, 1, 1, 0, 1}}) {
    OpCase c;
    c.covers = {"conv2d"};
    const ops::ConvSpec sp{s.stride, s.pad, s.groups};
    c.name = "conv2d x" + shape_text(s.x) + " -> " + std::to_string(s.o) + " " + std::to_string(s.k) + "x" +
             std::to_string(s.k) + (s.stride != 1 ? " s" + std::to_string(s.stride) : "") + " + bias + relu";
    // (an RGB input comes planar, as a network's input does)
    c.inputs = {rnd(s.x, 7, 1.0f, s.x[1] <= 4 ? Layout::Contiguous : Layout::ChannelsLast),
                rnd({s.o, s.x[1], s.k, s.k}, 8, 0.1f), rnd({s.o}, 9)};
    auto cache = std::make_shared<OpCache>();  // the weights never change inside a case
    c.run = [sp, cache](const std::vector<Tensor>& in, const Tensor&) {
      return OpRun{{ops::conv2d(in[0], in[1], &in[2], sp, {nullptr, Act::ReLU}, cache.get())}, {}};
    };
    c.golden = "the small conv2d cases above (same kernels, naive reference) and the model golden files";
    c.bench = true;
    c.flop = 2.0 * static_cast<double>(s.x[0] * s.o * s.x[1] * s.k * s.k) *
             static_cast<double>(((s.x[2] + 2 * s.pad - s.k) / s.stride + 1) * ((s.x[3] + 2 * s.pad - s.k) / s.stride + 1));
    out.push_back(std::move(c));
  }
}

void norm_cases(std::vector<OpCase>& out) {
  for (Act act : {Act::None, Act::ReLU, Act::SiLU}) {
    OpCase c;
    c.covers = {"batchnorm_infer"};
    c.name = "batchnorm_infer + " + to_string(act);
    c.inputs = {rnd({2, 4, 3, 5}, 10, 2.0f, Layout::ChannelsLast), rnd({4}, 11), rnd({4}, 12), rnd({4}, 13), positive({4}, 14)};
    c.run = [act](const std::vector<Tensor>& in, const Tensor&) {
      return OpRun{{ops::batchnorm_infer(in[0], in[1], in[2], in[3], in[4], 1e-5f, act)}, {}};
    };
    c.reference = [act](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{
          ref_norm(in[0], in[1].to_vector(), in[2].to_vector(), in[3].to_vector(), in[4].to_vector(), 1e-5f, act)};
    };
    out.push_back(std::move(c));
  }
  // channel counts below and in whole SIMD blocks, and enough pixels for oneDNN to split them
  // between threads
  struct NormShp {
    Shape x;
    std::vector<Act> acts;
  };
  for (const NormShp& s : {NormShp{{3, 4, 3, 2}, {Act::None, Act::ReLU, Act::SiLU}}, NormShp{{2, 16, 5, 3}, {Act::None, Act::ReLU}},
                           NormShp{{4, 8, 20, 20}, {Act::ReLU}}})
    for (Act act : s.acts) {
      OpCase c;
      c.covers = {"batchnorm_train", "batchnorm_backward"};
      const std::int64_t ch = s.x[1];
      c.name = "batchnorm_train x" + shape_text(s.x) + " + " + to_string(act) +
               " (batch statistics, running statistics updated)";
      c.inputs = {rnd(s.x, act == Act::None ? 4 : 40, 2.0f, Layout::ChannelsLast), rnd({ch}, 41), rnd({ch}, 42)};
      c.diff = {0, 1, 2};
      c.fd_eps = act == Act::None ? 1e-2f : 1e-3f;  // below the spread of the pre-activations (few kinks crossed)
      c.tol_fd = 3e-2f;
      c.run = [act, ch](const std::vector<Tensor>& in, const Tensor& dy) {
        Tensor rm = Tensor::zeros({ch}, in[0].device()), rv = Tensor::full({ch}, 1.0f, in[0].device());
        ops::BatchStats st;
        OpRun r;
        r.outputs = {ops::batchnorm_train(in[0], in[1], in[2], rm, rv, 1e-5f, 0.1f, act, st)};
        r.outputs.push_back(rm);
        r.outputs.push_back(rv);
        if (dy.defined()) {
          const auto g = ops::batchnorm_backward(in[0], in[1], st, dy);
          r.grads = {g.dx, g.dgamma, g.dbeta};
        }
        return r;
      };
      c.reference = [act, ch](const std::vector<Tensor>& in) {
        Vec mean, var;
        batch_stats(in[0], mean, var);
        const double n = static_cast<double>(in[0].numel() / in[0].dim(1));
        Vec rm(static_cast<std::size_t>(ch)), rv(static_cast<std::size_t>(ch));
        for (std::size_t k = 0; k < rm.size(); ++k) {
          rm[k] = 0.1f * mean[k];
          rv[k] = static_cast<float>(0.9 + 0.1 * var[k] * n / (n - 1));  // unbiased, as PyTorch
        }
        return std::vector<Tensor>{ref_norm(in[0], in[1].to_vector(), in[2].to_vector(), mean, var, 1e-5f, act),
                                   Tensor::from_vector({ch}, rm), Tensor::from_vector({ch}, rv)};
      };
      out.push_back(std::move(c));
    }
}

void elementwise_cases(std::vector<OpCase>& out) {
  for (Act act : {Act::ReLU, Act::SiLU}) {
    OpCase c;
    c.covers = {"activation", "activation_backward"};
    c.name = to_string(act);
    c.inputs = {rnd({2, 3, 4, 4}, 8, 1.0f, Layout::ChannelsLast)};
    c.diff = {0};
    c.fd_eps = 1e-3f;
    c.run = [act](const std::vector<Tensor>& in, const Tensor& dy) {
      OpRun r{{ops::activation(in[0], act)}, {}};
      if (dy.defined()) r.grads = {ops::activation_backward(in[0], dy, act)};
      return r;
    };
    c.reference = [act](const std::vector<Tensor>& in) {
      Vec x = in[0].to_vector();
      for (float& v : x) v = act_of(v, act);
      return std::vector<Tensor>{Tensor::from_vector(in[0].shape(), x)};
    };
    out.push_back(std::move(c));
  }
  for (Act act : {Act::None, Act::ReLU}) {
    OpCase c;
    c.covers = {"add"};
    c.name = "add + " + to_string(act) + " (mixed layouts)";
    c.inputs = {rnd({2, 3, 4, 5}, 50, 1.0f, Layout::ChannelsLast), rnd({2, 3, 4, 5}, 51)};
    c.run = [act](const std::vector<Tensor>& in, const Tensor&) { return OpRun{{ops::add(in[0], in[1], act)}, {}}; };
    c.reference = [act](const std::vector<Tensor>& in) {
      Vec a = in[0].to_vector();
      const Vec b = in[1].to_vector();
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = act_of(a[i] + b[i], act);
      return std::vector<Tensor>{Tensor::from_vector(in[0].shape(), a)};
    };
    out.push_back(std::move(c));
  }
  {
    OpCase c;
    c.covers = {"add_inplace"};
    c.name = "add_inplace";
    c.inputs = {rnd({2, 3, 4, 5}, 52, 1.0f, Layout::ChannelsLast), rnd({2, 3, 4, 5}, 53, 1.0f, Layout::ChannelsLast)};
    c.run = [](const std::vector<Tensor>& in, const Tensor&) {
      Tensor a = in[0].clone();
      ops::add_inplace(a, in[1]);
      return OpRun{{a}, {}};
    };
    c.reference = [](const std::vector<Tensor>& in) {
      Vec a = in[0].to_vector();
      const Vec b = in[1].to_vector();
      for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
      return std::vector<Tensor>{Tensor::from_vector(in[0].shape(), a)};
    };
    out.push_back(std::move(c));
  }
}

void pool_linear_loss_cases(std::vector<OpCase>& out) {
  struct PoolCase {
    ops::PoolSpec spec;
    std::int64_t channels;
  };
  // the CPU's max pool takes 64 channels at a time, then 16, then four, then single ones: 22 channels
  // (a block of 16, one of four, two single) and 70 (one of 64, one of four, two single); the
  // average pool's windows at the edges count only their in-bounds pixels (3/2 pad 1)
  for (const PoolCase pc : {PoolCase{{ops::PoolKind::Max, 3, 2, 1}, 3}, PoolCase{{ops::PoolKind::Max, 3, 2, 1}, 22},
                            PoolCase{{ops::PoolKind::Max, 3, 2, 1}, 70},
                            PoolCase{{ops::PoolKind::Max, 2, 2, 0}, 8}, PoolCase{{ops::PoolKind::Avg, 2, 2, 0}, 3},
                            PoolCase{{ops::PoolKind::Avg, 3, 2, 1}, 22}, PoolCase{{ops::PoolKind::Avg, 2, 2, 0}, 70}}) {
    const ops::PoolSpec sp = pc.spec;
    OpCase c;
    c.covers = {"pool2d", "pool2d_backward"};
    c.name = std::string(sp.kind == ops::PoolKind::Max ? "max" : "avg") + " pool " + std::to_string(sp.kernel) + "/" +
             std::to_string(sp.stride) + " pad " + std::to_string(sp.pad) + " (odd sizes, " +
             std::to_string(pc.channels) + " channels)";
    c.inputs = {rnd({2, pc.channels, 7, 5}, 10, 1.0f, Layout::ChannelsLast)};
    c.diff = {0};
    c.fd_eps = 1e-3f;
    c.run = [sp](const std::vector<Tensor>& in, const Tensor& dy) {
      OpRun r{{ops::pool2d(in[0], sp)}, {}};
      if (dy.defined()) r.grads = {ops::pool2d_backward(in[0], dy, sp)};
      return r;
    };
    c.reference = [sp](const std::vector<Tensor>& in) { return std::vector<Tensor>{ref_pool(in[0], sp)}; };
    out.push_back(std::move(c));
  }
  for (const int stride : {1, 2}) {
    OpCase c;
    c.covers = {"concat_channels"};
    c.name = "concat_channels stride " + std::to_string(stride);
    // stride 2 from an odd-sized map (5x7 -> 3x4); stride 1 with b in the contiguous layout
    c.inputs = {rnd({2, 3, 3, 4}, 40, 1.0f, Layout::ChannelsLast),
                stride == 2 ? rnd({2, 5, 5, 7}, 41, 1.0f, Layout::ChannelsLast) : rnd({2, 5, 3, 4}, 41)};
    c.run = [stride](const std::vector<Tensor>& in, const Tensor&) {
      return OpRun{{ops::concat_channels(in[0], in[1], stride)}, {}};
    };
    c.reference = [stride](const std::vector<Tensor>& in) {
      const Vec a = in[0].to_vector(), b = in[1].to_vector();
      const std::int64_t n = in[0].dim(0), ca = in[0].dim(1), h = in[0].dim(2), w = in[0].dim(3);
      const std::int64_t cb = in[1].dim(1), hb = in[1].dim(2), wb = in[1].dim(3);
      Vec y;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t ch = 0; ch < ca + cb; ++ch)
          for (std::int64_t yy = 0; yy < h; ++yy)
            for (std::int64_t x = 0; x < w; ++x)
              y.push_back(ch < ca ? a[static_cast<std::size_t>(((i * ca + ch) * h + yy) * w + x)]
                                  : b[static_cast<std::size_t>(((i * cb + ch - ca) * hb + yy * stride) * wb + x * stride)]);
      return std::vector<Tensor>{Tensor::from_vector({n, ca + cb, h, w}, y)};
    };
    c.tol_reference = 0.0f;
    c.tol_parity = 0.0f;
    out.push_back(std::move(c));
  }
  {
    OpCase c;
    c.covers = {"global_avg_pool", "global_avg_pool_backward"};
    c.name = "global_avg_pool";
    c.inputs = {rnd({3, 5, 2, 3}, 12, 1.0f, Layout::ChannelsLast)};
    c.diff = {0};
    c.run = [](const std::vector<Tensor>& in, const Tensor& dy) {
      OpRun r{{ops::global_avg_pool(in[0])}, {}};
      if (dy.defined()) r.grads = {ops::global_avg_pool_backward(dy, in[0].shape())};
      return r;
    };
    c.reference = [](const std::vector<Tensor>& in) {
      const Vec x = in[0].to_vector();
      const std::int64_t nc = in[0].dim(0) * in[0].dim(1), hw = in[0].dim(2) * in[0].dim(3);
      Vec y(static_cast<std::size_t>(nc), 0.0f);
      for (std::int64_t i = 0; i < nc * hw; ++i) y[static_cast<std::size_t>(i / hw)] += x[static_cast<std::size_t>(i)] / hw;
      return std::vector<Tensor>{Tensor::from_vector({in[0].dim(0), in[0].dim(1)}, y)};
    };
    out.push_back(std::move(c));
  }
  {
    OpCase c;
    c.covers = {"linear", "linear_backward"};
    c.name = "linear 6x5 -> 4";
    c.inputs = {rnd({6, 5}, 15), rnd({4, 5}, 16), rnd({4}, 17)};
    c.diff = {0, 1, 2};
    c.run = [](const std::vector<Tensor>& in, const Tensor& dy) {
      OpRun r{{ops::linear(in[0], in[1], &in[2])}, {}};
      if (dy.defined()) {
        const auto g = ops::linear_backward(in[0], in[1], dy);
        r.grads = {g.dx, g.dw, g.db};
      }
      return r;
    };
    c.reference = [](const std::vector<Tensor>& in) {
      Vec y = ref_matmul(in[0], in[1], false, true).to_vector();
      const Vec b = in[2].to_vector();
      for (std::size_t i = 0; i < y.size(); ++i) y[i] += b[i % b.size()];
      return std::vector<Tensor>{Tensor::from_vector({in[0].dim(0), in[1].dim(0)}, y)};
    };
    out.push_back(std::move(c));
  }
  for (const auto& [ta, tb] : {std::pair{false, true}, std::pair{true, false}, std::pair{false, false}}) {
    OpCase c;
    c.covers = {"matmul"};
    c.name = std::string("matmul") + (ta ? " a^T" : "") + (tb ? " b^T" : "");
    c.inputs = {ta ? rnd({5, 6}, 18) : rnd({6, 5}, 18), tb ? rnd({4, 5}, 19) : rnd({5, 4}, 19)};
    c.run = [ta = ta, tb = tb](const std::vector<Tensor>& in, const Tensor&) {
      return OpRun{{ops::matmul(in[0], in[1], ta, tb)}, {}};
    };
    c.reference = [ta = ta, tb = tb](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ref_matmul(in[0], in[1], ta, tb)};
    };
    out.push_back(std::move(c));
  }
  {
    OpCase c;
    c.covers = {"softmax"};
    c.name = "softmax 6x4";
    c.inputs = {rnd({6, 4}, 20, 3.0f)};
    c.run = [](const std::vector<Tensor>& in, const Tensor&) { return OpRun{{ops::softmax(in[0])}, {}}; };
    c.reference = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ref_softmax(in[0])}; };
    out.push_back(std::move(c));
  }
  for (float smooth : {0.0f, 0.1f}) {
    OpCase c;
    c.covers = {"cross_entropy"};
    c.name = "cross_entropy, label smoothing " + std::to_string(smooth).substr(0, 3);
    c.inputs = {rnd({4, 6}, 16, 2.0f)};
    c.diff = {0};  // its gradient comes with the loss
    const std::vector<int> labels{0, 5, 2, 2};
    c.run = [labels, smooth](const std::vector<Tensor>& in, const Tensor& dy) {
      const auto ce = ops::cross_entropy(in[0], labels, smooth);
      OpRun r{{scalar(ce.loss), ce.dlogits}, {}};
      if (dy.defined()) {
        Vec g = ce.dlogits.to_vector();
        const float s = dy.to_vector()[0];
        for (float& v : g) v *= s;
        r.grads = {Tensor::from_vector(ce.dlogits.shape(), g).to(in[0].device())};
      }
      return r;
    };
    c.reference = [labels, smooth](const std::vector<Tensor>& in) {
      const Vec p = ref_softmax(in[0]).to_vector();
      const std::size_t k = static_cast<std::size_t>(in[0].dim(1));
      double loss = 0.0;
      for (std::size_t i = 0; i < labels.size(); ++i) {
        double uniform = 0.0;
        for (std::size_t j = 0; j < k; ++j) uniform -= std::log(p[i * k + j]) / static_cast<double>(k);
        loss += (1.0 - smooth) * -std::log(p[i * k + static_cast<std::size_t>(labels[i])]) + smooth * uniform;
      }
      return std::vector<Tensor>{scalar(static_cast<float>(loss / static_cast<double>(labels.size())))};
    };
    out.push_back(std::move(c));
  }
}

void optimizer_cases(std::vector<OpCase>& out) {
  {
    OpCase c;
    c.covers = {"sgd_update"};
    c.name = "sgd_update, Nesterov momentum, weight decay, 3 steps";
    c.inputs = {rnd({37}, 20), rnd({37}, 19)};
    c.run = [](const std::vector<Tensor>& in, const Tensor&) {
      Tensor p = in[0].clone(), buf = Tensor::zeros({37}, in[0].device());
      for (int step = 0; step < 3; ++step) ops::sgd_update(p, in[1], buf, 0.1f, 0.9f, true, 0.01f, step == 0);
      return OpRun{{p, buf}, {}};
    };
    c.reference = [](const std::vector<Tensor>& in) {  // PyTorch's rule (relpos/ops.hpp)
      Vec p = in[0].to_vector(), buf(37, 0.0f);
      const Vec g0 = in[1].to_vector();
      for (int step = 0; step < 3; ++step)
        for (std::size_t i = 0; i < p.size(); ++i) {
          const float g = g0[i] + 0.01f * p[i];
          buf[i] = step == 0 ? g : 0.9f * buf[i] + g;
          p[i] -= 0.1f * (g + 0.9f * buf[i]);
        }
      return std::vector<Tensor>{Tensor::from_vector({37}, p), Tensor::from_vector({37}, buf)};
    };
    out.push_back(std::move(c));
  }
  {
    OpCase c;
    c.covers = {"adamw_update"};
    c.name = "adamw_update, 3 steps";
    c.inputs = {rnd({37}, 21), rnd({37}, 19)};
    c.run = [](const std::vector<Tensor>& in, const Tensor&) {
      Tensor p = in[0].clone(), m = Tensor::zeros({37}, in[0].device()), v = Tensor::zeros({37}, in[0].device());
      for (int step = 1; step <= 3; ++step) ops::adamw_update(p, in[1], m, v, 0.01f, 0.9f, 0.999f, 1e-8f, 0.05f, step);
      return OpRun{{p, m, v}, {}};
    };
    c.reference = [](const std::vector<Tensor>& in) {
      Vec p = in[0].to_vector(), m(37, 0.0f), v(37, 0.0f);
      const Vec g = in[1].to_vector();
      for (int step = 1; step <= 3; ++step)
        for (std::size_t i = 0; i < p.size(); ++i) {
          p[i] -= 0.01f * 0.05f * p[i];
          m[i] = 0.9f * m[i] + 0.1f * g[i];
          v[i] = 0.999f * v[i] + 0.001f * g[i] * g[i];
          const double mh = m[i] / (1.0 - std::pow(0.9, step)), vh = v[i] / (1.0 - std::pow(0.999, step));
          p[i] -= static_cast<float>(0.01 * mh / (std::sqrt(vh) + 1e-8));
        }
      return std::vector<Tensor>{Tensor::from_vector({37}, p), Tensor::from_vector({37}, m), Tensor::from_vector({37}, v)};
    };
    out.push_back(std::move(c));
  }
}

void attention_cases(std::vector<OpCase>& out) {
  struct Bot {
    PosEncoding pos;
    int clip;
    bool per_head, scale;
    int B, H, W, heads, dqk, dv;
    bool bench;
  };
  for (const Bot& b : {Bot{PosEncoding::Relative, 0, false, false, 2, 5, 7, 4, 8, 6, false},
                       Bot{PosEncoding::Relative, 0, true, true, 1, 9, 4, 4, 8, 6, false},
                       Bot{PosEncoding::Relative, 2, false, false, 2, 6, 11, 4, 8, 6, false},
                       Bot{PosEncoding::Absolute, 0, false, false, 2, 3, 5, 4, 8, 6, false},
                       Bot{PosEncoding::Absolute, 0, true, true, 1, 4, 4, 4, 8, 6, false},
                       Bot{PosEncoding::None, 0, false, false, 3, 7, 3, 4, 8, 6, false},
                       Bot{PosEncoding::Relative, 0, false, false, 1, 16, 16, 4, 64, 64, true},
                       Bot{PosEncoding::Relative, 0, false, false, 8, 16, 16, 4, 64, 64, true},
                       Bot{PosEncoding::Relative, 0, false, false, 1, 32, 32, 4, 64, 64, true},
                       Bot{PosEncoding::Relative, 0, false, false, 1, 8, 8, 4, 128, 128, true}}) {
    BotAttnSpec sp{b.heads, b.dqk, b.dv};
    sp.pos = b.pos, sp.clip = b.clip, sp.per_head = b.per_head, sp.scale_pos_embed = b.scale;
    const int kh = b.clip ? b.clip : b.H - 1, kw = b.clip ? b.clip : b.W - 1;
    Shape hs{1}, ws{1};
    if (sp.pos == PosEncoding::Relative) {
      hs = sp.per_head ? Shape{b.heads, 2 * kh + 1, b.dqk} : Shape{2 * kh + 1, b.dqk};
      ws = sp.per_head ? Shape{b.heads, 2 * kw + 1, b.dqk} : Shape{2 * kw + 1, b.dqk};
    } else if (sp.pos == PosEncoding::Absolute) {
      hs = sp.per_head ? Shape{b.heads, b.H * b.W, b.dqk} : Shape{b.H * b.W, b.dqk};
    }
    OpCase c;
    c.covers = {"bot_attention", "bot_attention_backward"};
    c.name = "bot_attention " + to_string(sp.pos) + (b.clip ? " clip " + std::to_string(b.clip) : "") +
             (b.per_head ? " per-head" : "") + (b.scale ? " scaled" : "") + " B" + std::to_string(b.B) + " " +
             std::to_string(b.H) + "x" + std::to_string(b.W) + " heads " + std::to_string(b.heads) + " d" +
             std::to_string(b.dqk);
    c.inputs = {rnd({b.B, sp.channels_qkv(), b.H, b.W}, 22, 1.0f, Layout::ChannelsLast), rnd(hs, 23, 0.5f), rnd(ws, 24, 0.5f)};
    if (!b.bench) c.diff = sp.pos == PosEncoding::Relative ? std::vector<int>{0, 1, 2}
                           : sp.pos == PosEncoding::Absolute ? std::vector<int>{0, 1}
                                                             : std::vector<int>{0};
    c.tol_parity = 5e-5f;
    c.bench = b.bench;
    c.golden = "test_attention_golden (bot_attn_*, timm's BottleneckAttn)";
    const double N = static_cast<double>(b.H) * b.W;
    c.flop = 2.0 * b.B * b.heads * (N * N * (b.dqk + b.dv) + N * ((2 * b.H - 1) + (2 * b.W - 1)) * b.dqk);
    const std::vector<int> diff = c.diff;
    c.run = [sp, diff](const std::vector<Tensor>& in, const Tensor& dy) {
      Tensor probs;
      OpRun r{{ops::bot_attention(in[0], in[1], in[2], sp, &probs)}, {}};
      r.outputs.push_back(probs);
      if (dy.defined()) {
        const auto g = ops::bot_attention_backward(in[0], in[1], in[2], sp, probs, dy);
        const Tensor all[] = {g.dqkv, g.dpos_h, g.dpos_w};
        for (int k : diff) r.grads.push_back(all[k]);
      }
      return r;
    };
    out.push_back(std::move(c));
  }
  for (int clip : {0, 2}) {
    OpCase c;
    c.covers = {"rel_pos_logits"};
    const int H = 5, W = 7, d = 8, rows_h = clip ? 2 * clip + 1 : 2 * H - 1, rows_w = clip ? 2 * clip + 1 : 2 * W - 1;
    c.name = "rel_pos_logits 5x7" + std::string(clip ? " clip 2" : "");
    c.inputs = {rnd({2, H * W, d}, 30), rnd({rows_h, d}, 31, 0.5f), rnd({rows_w, d}, 32, 0.5f)};
    c.run = [=](const std::vector<Tensor>& in, const Tensor&) {
      return OpRun{{ops::rel_pos_logits(in[0], in[1], in[2], H, W, clip)}, {}};
    };
    c.reference = [=](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ref_rel_logits(in[0], in[1], in[2], H, W, clip)};
    };
    out.push_back(std::move(c));
  }
  struct Sasa {
    int B, H, W, heads, dqk, dv, k;
    bool bench;
  };
  for (const Sasa& s : {Sasa{2, 9, 6, 2, 8, 4, 3, false}, Sasa{2, 9, 6, 2, 8, 4, 7, false},
                        Sasa{2, 5, 13, 2, 8, 4, 5, false},  // 9 to 15 wide: AVX-512's 16 lanes, 3 empty
                        Sasa{1, 56, 56, 8, 8, 8, 7, true}, Sasa{1, 28, 28, 8, 16, 16, 7, true}}) {
    SasaSpec sp;
    sp.heads = s.heads, sp.dqk = s.dqk, sp.dv = s.dv, sp.kernel = s.k;
    OpCase c;
    c.covers = {"sasa_attention", "sasa_attention_backward"};
    c.name = "sasa_attention " + std::to_string(s.k) + "x" + std::to_string(s.k) + " B" + std::to_string(s.B) + " " +
             std::to_string(s.H) + "x" + std::to_string(s.W) + " heads " + std::to_string(s.heads) + " d" +
             std::to_string(s.dqk);
    c.inputs = {rnd({s.B, sp.channels_qkv(), s.H, s.W}, 26, 1.0f, Layout::ChannelsLast), rnd({s.k, s.dqk / 2}, 27, 0.5f),
                rnd({s.k, s.dqk / 2}, 28, 0.5f)};
    if (!s.bench) c.diff = {0, 1, 2};
    c.tol_parity = 5e-5f;
    c.bench = s.bench;
    c.golden = "test_attention_golden (sasa_*, an unfold-based PyTorch SASA)";
    c.flop = 2.0 * s.B * s.heads * s.H * s.W * s.k * s.k * (s.dqk + s.dv);
    c.run = [sp](const std::vector<Tensor>& in, const Tensor& dy) {
      Tensor probs;
      OpRun r{{ops::sasa_attention(in[0], in[1], in[2], sp, &probs)}, {}};
      r.outputs.push_back(probs);
      if (dy.defined()) {
        const auto g = ops::sasa_attention_backward(in[0], in[1], in[2], sp, probs, dy);
        r.grads = {g.dqkv, g.dr_row, g.dr_col};
      }
      return r;
    };
    out.push_back(std::move(c));
  }
}

}  // namespace

std::vector<OpCase> op_cases() {
  std::vector<OpCase> out;
  conv_cases(out);
  norm_cases(out);
  elementwise_cases(out);
  pool_linear_loss_cases(out);
  optimizer_cases(out);
  attention_cases(out);
  return out;
}

std::vector<std::string> backend_contract_ops() {
  std::ifstream in(source_dir() + "/src/core/backend_ops.inc");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // a declaration: "<return type> name(" at the start of a line, the return type being Tensor,
  // void or ops::<Struct> (continuation lines start with spaces)
  std::vector<std::string> names;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (!(line.rfind("Tensor ", 0) == 0 || line.rfind("void ", 0) == 0 || line.rfind("ops::", 0) == 0)) continue;
    const std::size_t paren = line.find('(');
    const std::size_t space = line.rfind(' ', paren);
    if (paren == std::string::npos || space == std::string::npos || space + 1 >= paren) continue;
    names.push_back(line.substr(space + 1, paren - space - 1));
  }
  return names;
}

}  // namespace relpos::test
