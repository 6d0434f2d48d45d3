// Batch normalisation on the CPU (channels-last): inference by a loop of our own, training by our
// own kernels (batchnorm_kernels.hpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/batchnorm_kernels.hpp"
#include "cpu/conv1x1_grads.hpp"
#include "cpu/cpu_features.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/dnnl_util.hpp"
#include "cpu/thread_buffer.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

namespace {

void check_params(const Tensor& x, std::initializer_list<const Tensor*> params) {
  RELPOS_CHECK(x.ndim() == 4, "batch norm: input must be (N, C, H, W), got " << x.describe());
  for (const Tensor* p : params)
    RELPOS_CHECK(p->numel() == x.dim(1), "batch norm: parameter of " << p->numel() << " values for "
                                                                     << x.dim(1) << " channels");
}

}  // namespace

// Inference: y = x * scale + shift per channel, scale = gamma / sqrt(var + eps) and shift = beta -
// mean * scale, as PyTorch computes it, then the activation. A loop of our own: oneDNN's batch norm
// made its primitive descriptor on every call, 40 to 70 us per call in botnet26t_256 (three post-
// attention norms of 32K to 64K values) where the arithmetic takes a few microseconds.
Tensor batchnorm_infer(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                       const Tensor& var, float eps, Act act) {
  const Tensor x = as_channels_last(x_in);
  check_params(x, {&gamma, &beta, &mean, &var});
  const std::int64_t c = x.dim(1), pixels = x.dim(0) * x.dim(2) * x.dim(3);
  std::vector<float> scale(static_cast<std::size_t>(c)), shift(static_cast<std::size_t>(c));
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const float s = gamma.data()[ch] / std::sqrt(var.data()[ch] + eps);
    scale[static_cast<std::size_t>(ch)] = s;
    shift[static_cast<std::size_t>(ch)] = beta.data()[ch] - mean.data()[ch] * s;
  }
  Tensor y(x.shape(), Device::CPU, Layout::ChannelsLast);
  const float* xp = x.data();
  const float* sp = scale.data();
  const float* bp = shift.data();
  float* yp = y.data();
  const bool relu = act == Act::ReLU;
#pragma omp parallel for schedule(static) if (pixels * c >= (1 << 14))
  for (std::int64_t p = 0; p < pixels; ++p) {
    const float* in = xp + p * c;
    float* out = yp + p * c;
#pragma omp simd
    for (std::int64_t ch = 0; ch < c; ++ch) {
      const float v = in[ch] * sp[ch] + bp[ch];
      out[ch] = relu && v < 0.0f ? 0.0f : v;  // (a NaN stays NaN, as PyTorch's ReLU keeps it)
    }
  }
  if (act == Act::SiLU) return activation(y, Act::SiLU);
  return y;
}

namespace {

// The training forward and backward run on blocks of rows (pixels) of about 64 KiB, in parallel.
// The blocks depend on the shape only, and their sums are added in block order, so the statistics
// and gradients are the same bits on any number of threads.
std::int64_t block_rows(std::int64_t c) { return std::max<std::int64_t>(16, 16384 / c); }

// f(first_row, rows, out_a, out_b) adds a block's two sums per channel into out_a and out_b (c
// doubles each, zeroed); their totals over the blocks.
template <class F>
void blocked_sums(std::int64_t rows, std::int64_t c, F&& f, std::vector<double>& sa, std::vector<double>& sb) {
  const std::int64_t br = block_rows(c), nb = (rows + br - 1) / br;
  std::vector<double> part(static_cast<std::size_t>(nb * 2 * c), 0.0);
  double* pp = part.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < nb; ++b)
    f(b * br, std::min(br, rows - b * br), pp + b * 2 * c, pp + b * 2 * c + c);
  sa.assign(static_cast<std::size_t>(c), 0.0);
  sb.assign(static_cast<std::size_t>(c), 0.0);
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t i = 0; i < c; ++i) {
      sa[static_cast<std::size_t>(i)] += pp[b * 2 * c + i];
      sb[static_cast<std::size_t>(i)] += pp[b * 2 * c + c + i];
    }
}

// Outputs of 4 MiB and more (more than the two cores' L2 caches of the machines we measure on) are
// written with streaming stores where the kernels have them: they would not stay in the caches, and
// a store that misses first reads the line it overwrites. (botnet-fmnist's training step at batch
// 128: 550 img/s with ordinary stores, 585 with these; 2-core AVX-512 Xeon, alternating runs.)
bool stream_output(const Tensor& t) { return t.numel() * 4 >= (4 << 20); }

// f(first_row, rows) over the blocks, in parallel.
template <class F>
void for_blocks(std::int64_t rows, std::int64_t c, F&& f) {
  const std::int64_t br = block_rows(c), nb = (rows + br - 1) / br;
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < nb; ++b) f(b * br, std::min(br, rows - b * br));
}

}  // namespace

const bn::Kernels& bn::kernels() {
  static const Kernels& k = avx512_kernels() ? avx512::kKernels : avx2_kernels() ? avx2::kKernels : generic::kKernels;
  return k;
}

namespace {
// scale and shift of PyTorch's form, x * scale + shift, from gamma, beta and the statistics
void affine_of(const Tensor& gamma, const Tensor& beta, const ops::BatchStats& stats, float* scale, float* shift) {
  const float* mean = stats.mean.data();
  const float* var = stats.var.data();
  const float* g = gamma.data();
  const float* bt = beta.data();
  for (std::int64_t i = 0; i < gamma.numel(); ++i) {
    scale[i] = static_cast<float>(g[i] / std::sqrt(static_cast<double>(var[i]) + stats.eps));
    shift[i] = bt[i] - mean[i] * scale[i];
  }
}
}  // namespace

Tensor batchnorm_normalize_train(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, Act act,
                                 ops::BatchStats& stats, const NormedResidual* residual) {
  const Tensor x = as_channels_last(x_in);
  check_params(x, {&gamma, &beta, &stats.mean, &stats.var});
  const std::int64_t c = x.dim(1), rows = x.dim(0) * x.dim(2) * x.dim(3);
  Tensor res;
  std::vector<float> res_affine;
  if (residual) {
    RELPOS_CHECK(residual->x->shape() == x.shape(), "batch norm: residual " << residual->x->describe()
                                                                            << " does not match input " << x.describe());
    RELPOS_CHECK(act == Act::None || act == Act::ReLU, "internal: batch norm with a residual takes ReLU or none");
    res = as_channels_last(*residual->x);
    if (residual->gamma) {
      check_params(res, {residual->gamma, residual->beta, &residual->stats->mean, &residual->stats->var});
      res_affine.resize(static_cast<std::size_t>(2 * c));
      affine_of(*residual->gamma, *residual->beta, *residual->stats, res_affine.data(), res_affine.data() + c);
    }
  }
  stats.act = residual ? Act::None : act;  // after a residual the activation is the caller's to undo
  // with a fused ReLU the backward recomputes its mask from x and these
  const bool relu = act == Act::ReLU;
  Tensor affine({2 * c});
  float* scale = affine.data();
  float* shift = affine.data() + c;
  affine_of(gamma, beta, stats, scale, shift);
  const bn::Kernels& k = bn::kernels();
  const float* xp = x.data();
  Tensor y(x.shape(), Device::CPU, Layout::ChannelsLast);
  float* yp = y.data();
  const bool stream = stream_output(y);
  const float* rp = residual ? res.data() : nullptr;
  const float* rs = res_affine.empty() ? nullptr : res_affine.data();
  const float* rb = res_affine.empty() ? nullptr : res_affine.data() + c;
  for_blocks(rows, c, [&](std::int64_t r0, std::int64_t n) {
    k.normalize(xp + r0 * c, rp ? rp + r0 * c : nullptr, n, c, scale, shift, rs, rb, relu, stream, yp + r0 * c);
  });
  if (residual) {
    stats.aux = Tensor();
    return y;
  }
  if (relu) {
    stats.aux = affine;
    return y;
  }
  if (act == Act::None) {
    stats.aux = Tensor();
    return y;
  }
  stats.aux = y;  // the pre-activation output, for the activation's backward
  return activation(y, act);
}

void batchnorm_statistics(const Tensor& x_in, Tensor& running_mean, Tensor& running_var, float eps, float momentum,
                          ops::BatchStats& stats) {
  const Tensor x = as_channels_last(x_in);
  check_params(x, {&running_mean, &running_var});
  const std::int64_t c = x.dim(1), rows = x.dim(0) * x.dim(2) * x.dim(3);
  RELPOS_CHECK(rows > 1, "batch norm in training needs more than one value per channel, got input "
                             << to_string(x.shape()));
  const bn::Kernels& k = bn::kernels();
  const float* xp = x.data();
  // sums of x less a pivot near the mean (the mean of 64 pixels spread over the batch), so the
  // variance as a mean square less a squared mean does not cancel away
  std::vector<float> pivot(static_cast<std::size_t>(c), 0.0f);
  {
    const std::int64_t samples = std::min<std::int64_t>(rows, 64);
    std::vector<double> acc(static_cast<std::size_t>(c), 0.0);
    for (std::int64_t sample = 0; sample < samples; ++sample) {
      const float* xr = xp + (sample * rows / samples) * c;
      for (std::int64_t i = 0; i < c; ++i) acc[static_cast<std::size_t>(i)] += xr[i];
    }
    for (std::int64_t i = 0; i < c; ++i)
      pivot[static_cast<std::size_t>(i)] = static_cast<float>(acc[static_cast<std::size_t>(i)] / static_cast<double>(samples));
  }
  std::vector<double> s, q;
  blocked_sums(rows, c, [&](std::int64_t r0, std::int64_t n, double* bs, double* bq) {
    k.stats(xp + r0 * c, n, c, pivot.data(), bs, bq);
  }, s, q);
  stats = {};
  stats.mean = Tensor({c});
  stats.var = Tensor({c});
  stats.eps = eps;
  float* mean = stats.mean.data();
  float* var = stats.var.data();
  const double m = static_cast<double>(rows);
  for (std::int64_t i = 0; i < c; ++i) {
    const auto u = static_cast<std::size_t>(i);
    const double d = s[u] / m;
    mean[i] = static_cast<float>(pivot[u] + d);
    var[i] = static_cast<float>(std::max(0.0, q[u] / m - d * d));
  }
  const float unbias = static_cast<float>(rows) / static_cast<float>(rows - 1);
  float* rm = running_mean.data();
  float* rv = running_var.data();
  for (std::int64_t i = 0; i < c; ++i) {
    rm[i] = (1.0f - momentum) * rm[i] + momentum * mean[i];
    rv[i] = (1.0f - momentum) * rv[i] + momentum * var[i] * unbias;
  }
}

Tensor batchnorm_train_add(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                           Tensor& running_var, float eps, float momentum, const Tensor* residual, Act act,
                           ops::BatchStats& stats) {
  check_params(x, {&gamma, &beta});
  batchnorm_statistics(x, running_mean, running_var, eps, momentum, stats);
  if (!residual) return batchnorm_normalize_train(x, gamma, beta, act, stats);
  const NormedResidual r{residual};
  return batchnorm_normalize_train(x, gamma, beta, act, stats, &r);
}

Tensor batchnorm_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, float eps, float momentum, Act act, ops::BatchStats& stats) {
  return batchnorm_train_add(x, gamma, beta, running_mean, running_var, eps, momentum, nullptr, act, stats);
}

namespace {

// What the backward's first pass leaves for the second: x and g in channels-last, whether g is dy
// masked by the batch norm's ReLU (with the forward's scale and shift to recompute the mask), and
// the sums of g and g (x - mean) per channel.
struct FirstPass {
  Tensor x, g;
  bool relu;
  const float* scale;
  const float* shift;
  std::vector<double> sg, sgx;
};

// The second pass works from the sums: dgamma, dbeta and dx = gamma rstd (g - dbeta / m - xhat
// dgamma / m), xhat = (x - mean) rstd, as dx = g a + (x - mean) b + d per channel.
struct GradCoefs {
  ops::BatchNormGrads grads;  // dgamma and dbeta
  std::vector<float> a, b, d;
};

GradCoefs grad_coefs(const Tensor& x, const Tensor& gamma, const ops::BatchStats& stats,
                     const std::vector<double>& sg, const std::vector<double>& sgx) {
  const std::int64_t c = x.dim(1), rows = x.dim(0) * x.dim(2) * x.dim(3);
  GradCoefs out;
  out.grads.dgamma = Tensor({c});
  out.grads.dbeta = Tensor({c});
  out.a.resize(static_cast<std::size_t>(c));
  out.b.resize(out.a.size());
  out.d.resize(out.a.size());
  const float* g = gamma.data();
  const float* var = stats.var.data();
  const double m = static_cast<double>(rows);
  for (std::int64_t i = 0; i < c; ++i) {
    const auto u = static_cast<std::size_t>(i);
    const double rstd = 1.0 / std::sqrt(static_cast<double>(var[i]) + stats.eps);
    const double dgamma = sgx[u] * rstd, ka = g[i] * rstd;
    out.grads.dgamma.data()[i] = static_cast<float>(dgamma);
    out.grads.dbeta.data()[i] = static_cast<float>(sg[u]);
    out.a[u] = static_cast<float>(ka);
    out.b[u] = static_cast<float>(-ka * rstd * dgamma / m);
    out.d[u] = static_cast<float>(-ka * sg[u] / m);
  }
  return out;
}

// The second pass writing dx.
ops::BatchNormGrads backward_from_sums(const FirstPass& p, const Tensor& gamma, const ops::BatchStats& stats) {
  const Tensor& x = p.x;
  const std::int64_t c = x.dim(1), rows = x.dim(0) * x.dim(2) * x.dim(3);
  GradCoefs k2 = grad_coefs(x, gamma, stats, p.sg, p.sgx);
  ops::BatchNormGrads out = std::move(k2.grads);
  out.dx = Tensor(x.shape(), Device::CPU, Layout::ChannelsLast);
  const bn::Kernels& k = bn::kernels();
  const float* xp = x.data();
  const float* dp = p.g.data();
  const float* mean = stats.mean.data();
  float* dxp = out.dx.data();
  const bool stream = stream_output(out.dx);
  for_blocks(rows, c, [&](std::int64_t r0, std::int64_t n) {
    k.grad_input(xp + r0 * c, dp + r0 * c, n, c, mean, p.scale, p.shift, p.relu, k2.a.data(), k2.b.data(),
                 k2.d.data(), stream, dxp + r0 * c);
  });
  return out;
}

// The second pass handing dx, about 64 rows at a time, to the backward of the 1x1 convolution x =
// conv_x * w (conv1x1_grads.hpp): dx is never written whole.
ops::BatchNormConvGrads conv1x1_from_sums(const FirstPass& p, const Tensor& gamma, const ops::BatchStats& stats,
                                          const Tensor& conv_x_in, const Tensor& w, int stride, bool need_dx) {
  const Tensor& x = p.x;
  const Tensor conv_x = as_channels_last(conv_x_in);
  const std::int64_t oc = x.dim(1), ic = conv_x.dim(1);
  GradCoefs k2 = grad_coefs(x, gamma, stats, p.sg, p.sgx);
  ops::BatchNormConvGrads out;
  out.dgamma = std::move(k2.grads.dgamma);
  out.dbeta = std::move(k2.grads.dbeta);
  out.dw = Tensor(w.shape());
  if (need_dx) out.dx = Tensor(conv_x.shape(), Device::CPU, Layout::ChannelsLast);
  const bn::Kernels& k = bn::kernels();
  const float* xp = x.data();
  const float* dp = p.g.data();
  const float* mean = stats.mean.data();
  conv1x1::grads({conv_x.dim(0), conv_x.dim(2), conv_x.dim(3), ic, oc, stride},
                 [&](std::int64_t r0, std::int64_t n, float* g) {
                   k.grad_input(xp + r0 * oc, dp + r0 * oc, n, oc, mean, p.scale, p.shift, p.relu, k2.a.data(),
                                k2.b.data(), k2.d.data(), false, g);
                   return static_cast<const float*>(g);
                 },
                 conv_x.data(), w.data(), out.dw.data(), need_dx ? out.dx.data() : nullptr);
  return out;
}

}  // namespace

namespace {

// The backward's first pass: the sums per channel of g and g (x - mean).
FirstPass first_pass(const Tensor& x_in, const Tensor& gamma, const ops::BatchStats& stats, const Tensor& dy_in) {
  const Tensor x = as_channels_last(x_in);
  check_params(x, {&gamma, &stats.mean, &stats.var});
  RELPOS_CHECK(dy_in.shape() == x.shape(), "batch norm backward: gradient " << dy_in.describe()
                                                                            << " does not match input");
  const std::int64_t c = x.dim(1), rows = x.dim(0) * x.dim(2) * x.dim(3);
  const bool relu = stats.act == Act::ReLU;
  RELPOS_CHECK(!relu || (stats.aux.defined() && stats.aux.numel() == 2 * c),
               "batch norm backward: the fused ReLU's saved scale and shift are missing");
  const Tensor dy = as_channels_last(relu || stats.act == Act::None ? dy_in
                                                                    : activation_backward(stats.aux, dy_in, stats.act));
  const bn::Kernels& k = bn::kernels();
  const float* xp = x.data();
  const float* dp = dy.data();
  const float* mean = stats.mean.data();
  // without the ReLU the kernels read neither (any c floats will do)
  const float* scale = relu ? stats.aux.data() : mean;
  const float* shift = relu ? stats.aux.data() + c : mean;
  std::vector<double> sg, sgx;
  blocked_sums(rows, c, [&](std::int64_t r0, std::int64_t n, double* bg, double* bgx) {
    k.grad_sums(xp + r0 * c, dp + r0 * c, n, c, mean, scale, shift, relu, bg, bgx);
  }, sg, sgx);
  return {x, dy, relu, scale, shift, std::move(sg), std::move(sgx)};
}

// The first pass after a residual sum and ReLU (y its output): writes ds = (y > 0) (dy_a + dy_b),
// g of the batch norm (which has no ReLU of its own), as it sums.
FirstPass first_pass_relu_sum(const Tensor& x_in, const Tensor& gamma, const ops::BatchStats& stats, const Tensor& y_in,
                              const Tensor& dy_a_in, const Tensor& dy_b_in, Tensor& ds) {
  const Tensor x = as_channels_last(x_in);
  check_params(x, {&gamma, &stats.mean, &stats.var});
  RELPOS_CHECK(stats.act == Act::None, "internal: a batch norm with its own activation before a residual sum");
  for (const Tensor* t : {&y_in, &dy_a_in, &dy_b_in})
    RELPOS_CHECK(!t->defined() || t->shape() == x.shape(), "batch norm backward: " << t->describe()
                                                                                   << " does not match input "
                                                                                   << x.describe());
  const Tensor y = as_channels_last(y_in), a = as_channels_last(dy_a_in);
  const Tensor b = dy_b_in.defined() ? as_channels_last(dy_b_in) : Tensor();
  const std::int64_t c = x.dim(1), rows = x.dim(0) * x.dim(2) * x.dim(3);
  ds = Tensor(x.shape(), Device::CPU, Layout::ChannelsLast);
  const bn::Kernels& k = bn::kernels();
  const float* xp = x.data();
  const float* yp = y.data();
  const float* ap = a.data();
  const float* bp = b.defined() ? b.data() : nullptr;
  const float* mean = stats.mean.data();
  float* sp = ds.data();
  const bool stream = stream_output(ds);
  std::vector<double> sg, sgx;
  blocked_sums(rows, c, [&](std::int64_t r0, std::int64_t n, double* bg, double* bgx) {
    const std::int64_t o = r0 * c;
    k.relu_grad_sums(xp + o, yp + o, ap + o, bp ? bp + o : nullptr, n, c, mean, stream, sp + o, bg, bgx);
  }, sg, sgx);
  return {x, ds, false, mean, mean, std::move(sg), std::move(sgx)};
}

}  // namespace

ops::BatchNormGrads batchnorm_backward(const Tensor& x, const Tensor& gamma, const ops::BatchStats& stats,
                                       const Tensor& dy) {
  return backward_from_sums(first_pass(x, gamma, stats, dy), gamma, stats);
}

ops::BatchNormGrads batchnorm_backward_relu_sum(const Tensor& x, const Tensor& gamma, const ops::BatchStats& stats,
                                                const Tensor& y, const Tensor& dy_a, const Tensor& dy_b, Tensor& ds) {
  return backward_from_sums(first_pass_relu_sum(x, gamma, stats, y, dy_a, dy_b, ds), gamma, stats);
}

// Measured against batchnorm_backward + oneDNN's conv2d_backward at batch 128, 2 threads: AVX-512,
// 32 -> 64 channels at 28x28 5.7 against 9.1 ms, 128 -> 128 at 14x14 7.2 against 8.0, 256 -> 128 at
// 7x7 3.3 against 3.4; AVX2 (Zen 3), new / old 0.76 to 0.91 at stride 1 and 0.84 and 0.85 at stride
// 2 (tools/bench/README.md).
bool conv1x1_grads_fit(const Tensor& x, const Tensor& conv_x, const Tensor& w, const ops::ConvSpec& spec) {
  if (x.ndim() != 4 || conv_x.ndim() != 4 || w.ndim() != 4) return false;
  const std::int64_t oc = x.dim(1), ic = conv_x.dim(1);
  const auto out_size = [&](std::int64_t in) { return (in - 1) / spec.stride + 1; };
  return conv1x1::grads_fit(ic, oc, spec.stride) && spec.pad == 0 && spec.groups == 1 &&
         w.layout() == Layout::Contiguous && w.shape() == Shape({oc, ic, 1, 1}) && conv_x.dim(0) == x.dim(0) &&
         out_size(conv_x.dim(2)) == x.dim(2) && out_size(conv_x.dim(3)) == x.dim(3);
}

ops::BatchNormConvGrads batchnorm_conv1x1_backward(const Tensor& x, const Tensor& gamma, const ops::BatchStats& stats,
                                                   const Tensor& dy, const Tensor& conv_x, const Tensor& w,
                                                   const ops::ConvSpec& spec, bool need_dx) {
  RELPOS_CHECK(conv1x1_grads_fit(x, conv_x, w, spec), "internal: the fused 1x1 gradients do not take this convolution");
  return conv1x1_from_sums(first_pass(x, gamma, stats, dy), gamma, stats, conv_x, w, spec.stride, need_dx);
}

ops::BatchNormConvGrads batchnorm_relu_sum_conv1x1_backward(const Tensor& x, const Tensor& gamma,
                                                            const ops::BatchStats& stats, const Tensor& y,
                                                            const Tensor& dy_a, const Tensor& dy_b, Tensor& ds,
                                                            const Tensor& conv_x, const Tensor& w,
                                                            const ops::ConvSpec& spec, bool need_dx) {
  RELPOS_CHECK(conv1x1_grads_fit(x, conv_x, w, spec), "internal: the fused 1x1 gradients do not take this convolution");
  return conv1x1_from_sums(first_pass_relu_sum(x, gamma, stats, y, dy_a, dy_b, ds), gamma, stats, conv_x, w,
                           spec.stride, need_dx);
}

}  // namespace relpos::cpu
