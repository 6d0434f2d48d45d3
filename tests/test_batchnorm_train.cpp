// Batch norm in training on the CPU (src/cpu/batchnorm.cpp and its kernels): the statistics, the
// normalised output (with the fused ReLU and with a residual added before it) and the three
// gradients against a double-precision reference, tightly; the same bits on any number of threads;
// an accurate variance far from zero; NaN kept. ctest runs it at every SIMD level the CPU has
// (RELPOS_SIMD), channel counts covering every chunk width of the kernels, and an output large
// enough for the streaming stores.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "core/ops_internal.hpp"
#include "cpu/cpu_features.hpp"
#include "cpu/cpu_ops.hpp"
#include "relpos/runtime.hpp"
#include "test_util.hpp"

using namespace relpos;

namespace {

struct Case {
  Shape shape;
  float mean, spread;
};

Tensor filled(const Shape& s, std::mt19937& rng, float mean, float spread) {
  std::normal_distribution<float> nd(mean, spread);
  Tensor t(s, Device::CPU, s.size() == 4 ? Layout::ChannelsLast : Layout::Contiguous);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = nd(rng);
  return t;
}

// Convolution weights: (O, C, kh, kw), contiguous.
Tensor weights(const Shape& s, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 0.2f);
  Tensor t(s, Device::CPU, Layout::Contiguous);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = nd(rng);
  return t;
}

// Everything the op gives, from a double-precision evaluation of the definitions.
struct Reference {
  std::vector<double> mean, var, y, dx, dgamma, dbeta, dres;
};

// y = act(gamma (x - mean) / sqrt(var + eps) + beta [+ res]); dy is the output's gradient.
Reference reference(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor* res, Act act,
                    const Tensor& dy, float eps) {
  const std::int64_t c = x.dim(1), rows = x.numel() / c;
  const float* xp = x.data();
  const float* dp = dy.data();
  Reference r;
  r.mean.assign(static_cast<std::size_t>(c), 0.0);
  r.var.assign(r.mean.size(), 0.0);
  r.y.resize(static_cast<std::size_t>(x.numel()));
  r.dx.resize(r.y.size());
  r.dres.resize(r.y.size());
  r.dgamma.assign(r.mean.size(), 0.0);
  r.dbeta.assign(r.mean.size(), 0.0);
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const auto u = static_cast<std::size_t>(ch);
    double m = 0.0, v = 0.0;
    for (std::int64_t i = 0; i < rows; ++i) m += xp[i * c + ch];
    m /= static_cast<double>(rows);
    for (std::int64_t i = 0; i < rows; ++i) v += (xp[i * c + ch] - m) * (xp[i * c + ch] - m);
    v /= static_cast<double>(rows);
    r.mean[u] = m;
    r.var[u] = v;
    const double rstd = 1.0 / std::sqrt(v + eps), g = gamma.data()[ch], b = beta.data()[ch];
    std::vector<double> gy(static_cast<std::size_t>(rows));  // gradient of the batch norm's output
    double sg = 0.0, sgx = 0.0;
    for (std::int64_t i = 0; i < rows; ++i) {
      const auto k = static_cast<std::size_t>(i * c + ch);
      const double xhat = (xp[k] - m) * rstd;
      const double t = g * xhat + b + (res ? res->data()[k] : 0.0);
      r.y[k] = act == Act::ReLU ? std::max(t, 0.0) : t;
      const double d = act == Act::ReLU && t <= 0.0 ? 0.0 : dp[k];
      r.dres[k] = d;
      gy[static_cast<std::size_t>(i)] = d;
      sg += d;
      sgx += d * xhat;
    }
    r.dbeta[u] = sg;
    r.dgamma[u] = sgx;
    for (std::int64_t i = 0; i < rows; ++i) {
      const auto k = static_cast<std::size_t>(i * c + ch);
      const double xhat = (xp[k] - m) * rstd;
      r.dx[k] = g * rstd * (gy[static_cast<std::size_t>(i)] - sg / rows - xhat * sgx / rows);
    }
  }
  return r;
}

// max |got - ref| / max(floor, max |ref|)
double rel_err(const float* got, const std::vector<double>& ref, double floor = 1.0) {
  double d = 0.0, s = floor;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    d = std::max(d, std::fabs(got[i] - ref[i]));
    s = std::max(s, std::fabs(ref[i]));
  }
  return d / s;
}

struct Run {
  Tensor y, mean, var, running_mean, running_var, dx, dgamma, dbeta;
};

Run run(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor* res, Act act, const Tensor& dy) {
  const std::int64_t c = x.dim(1);
  Run o;
  o.running_mean = Tensor::full({c}, 0.5f);
  o.running_var = Tensor::full({c}, 2.0f);
  ops::BatchStats st;
  o.y = res ? ops::batchnorm_train_add(x, gamma, beta, o.running_mean, o.running_var, 1e-5f, 0.1f, *res, act, st)
            : ops::batchnorm_train(x, gamma, beta, o.running_mean, o.running_var, 1e-5f, 0.1f, act, st);
  o.mean = st.mean;
  o.var = st.var;
  // with a residual the caller undoes the activation: the batch norm gets the sum's gradient
  Tensor g = dy;
  if (res && act == Act::ReLU) g = ops::activation_backward(o.y, dy, Act::ReLU);
  const ops::BatchNormGrads gr = ops::batchnorm_backward(x, gamma, st, g);
  o.dx = gr.dx;
  o.dgamma = gr.dgamma;
  o.dbeta = gr.dbeta;
  return o;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * 4) == 0;
}

}  // namespace

TEST_CASE("batch norm training: statistics, output and gradients match a double-precision reference") {
  // channel counts through every chunk width (64, 32, 16, 8, 4, 1 and their sums), a mean far from
  // zero (the variance must not cancel away), and 8 x 64 x 48 x 48 (4.5 MiB: streamed stores)
  const std::vector<Case> cases{{{4, 3, 5, 7}, 0.0f, 1.0f},    {{3, 24, 6, 5}, 0.3f, 2.0f},
                                {{2, 40, 9, 9}, -1.0f, 0.5f},  {{5, 64, 4, 4}, 0.0f, 1.0f},
                                {{2, 125, 3, 5}, 2.0f, 1.5f},  {{2, 264, 4, 3}, 0.0f, 1.0f},
                                {{6, 16, 8, 8}, 1000.0f, 1.0f}, {{8, 64, 48, 48}, 0.2f, 1.0f}};
  std::mt19937 rng(5);
  for (const Case& k : cases)
    for (Act act : {Act::None, Act::ReLU})
      for (bool with_res : {false, true}) {
        CAPTURE(to_string(k.shape));
        CAPTURE(to_string(act));
        CAPTURE(with_res);
        const std::int64_t c = k.shape[1];
        const Tensor x = filled(k.shape, rng, k.mean, k.spread);
        const Tensor gamma = filled({c}, rng, 1.0f, 0.3f), beta = filled({c}, rng, 0.0f, 0.5f);
        const Tensor res = filled(k.shape, rng, 0.0f, 1.0f), dy = filled(k.shape, rng, 0.0f, 1.0f);
        const Run o = run(x, gamma, beta, with_res ? &res : nullptr, act, dy);
        const Reference r = reference(x, gamma, beta, with_res ? &res : nullptr, act, dy, 1e-5f);
        // the mean to float rounding of its size; the variance relative to itself (also at mean 1000)
        CHECK(rel_err(o.mean.data(), r.mean, std::max(1.0f, std::fabs(k.mean))) < 1e-6);
        CHECK(rel_err(o.var.data(), r.var, 0.0) < 2e-6);
        // PyTorch's form x * scale + (beta - mean * scale) rounds at the mean's size, |mean| / spread
        // times the output's: so does timm's training
        CHECK(rel_err(o.y.data(), r.y) < 2e-6 * std::max(1.0f, std::fabs(k.mean) / k.spread));
        CHECK(rel_err(o.dx.data(), r.dx) < 2e-5);
        CHECK(rel_err(o.dgamma.data(), r.dgamma) < 2e-5);
        CHECK(rel_err(o.dbeta.data(), r.dbeta) < 2e-5);
        const double n = static_cast<double>(x.numel() / c);
        for (std::int64_t i = 0; i < c; ++i) {
          const auto u = static_cast<std::size_t>(i);
          CHECK(o.running_mean.data()[i] == doctest::Approx(0.9 * 0.5 + 0.1 * r.mean[u]).epsilon(1e-5));
          CHECK(o.running_var.data()[i] == doctest::Approx(0.9 * 2.0 + 0.1 * r.var[u] * n / (n - 1)).epsilon(1e-5));
        }
      }
}

TEST_CASE("batch norm training gives the same bits on 1, 2 and 3 threads") {
  std::mt19937 rng(9);
  const Shape s{8, 48, 20, 20};
  const Tensor x = filled(s, rng, 0.5f, 2.0f), res = filled(s, rng, 0.0f, 1.0f), dy = filled(s, rng, 0.0f, 1.0f);
  const Tensor gamma = filled({48}, rng, 1.0f, 0.3f), beta = filled({48}, rng, 0.0f, 0.5f);
  const int old = num_threads();
  std::vector<Run> runs;
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    runs.push_back(run(x, gamma, beta, &res, Act::ReLU, dy));
    runs.push_back(run(x, gamma, beta, nullptr, Act::ReLU, dy));
  }
  set_num_threads(old);
  for (std::size_t i = 2; i < runs.size(); ++i) {
    CAPTURE(i);
    const Run &a = runs[i % 2], &b = runs[i];
    CHECK(same_bits(a.y, b.y));
    CHECK(same_bits(a.mean, b.mean));
    CHECK(same_bits(a.var, b.var));
    CHECK(same_bits(a.dx, b.dx));
    CHECK(same_bits(a.dgamma, b.dgamma));
    CHECK(same_bits(a.dbeta, b.dbeta));
  }
}

TEST_CASE("batch norm training keeps a NaN: the ReLU does not turn it into 0") {
  std::mt19937 rng(3);
  Tensor x = filled({2, 20, 3, 3}, rng, 0.0f, 1.0f);
  x.data()[7] = std::nanf("");  // channel 7 of the first pixel
  const Tensor gamma = Tensor::full({20}, 1.0f), beta = Tensor::zeros({20});
  Tensor rm = Tensor::zeros({20}), rv = Tensor::full({20}, 1.0f);
  ops::BatchStats st;
  const Tensor y = ops::batchnorm_train(x, gamma, beta, rm, rv, 1e-5f, 0.1f, Act::ReLU, st);
  for (std::int64_t i = 0; i < y.numel() / 20; ++i) CHECK(std::isnan(y.data()[i * 20 + 7]));
  CHECK(std::isnan(rm.data()[7]));
  CHECK(std::isfinite(y.data()[6]));
}

TEST_CASE("a projection shortcut's batch norm folded into the sum: act(bn(x) + bn_r(r)) and both backwards") {
  std::mt19937 rng(21);
  for (const Shape& s : {Shape{3, 24, 5, 6}, Shape{8, 64, 48, 48}})
    for (Act act : {Act::None, Act::ReLU}) {
      CAPTURE(to_string(s));
      CAPTURE(to_string(act));
      const std::int64_t c = s[1];
      const Tensor x = filled(s, rng, 0.3f, 1.5f), r = filled(s, rng, -0.5f, 2.0f), dy = filled(s, rng, 0.0f, 1.0f);
      const Tensor gamma = filled({c}, rng, 1.0f, 0.3f), beta = filled({c}, rng, 0.0f, 0.5f);
      const Tensor r_gamma = filled({c}, rng, 1.0f, 0.3f), r_beta = filled({c}, rng, 0.0f, 0.5f);
      Tensor rm = Tensor::zeros({c}), rv = Tensor::full({c}, 1.0f), r_rm = Tensor::zeros({c}), r_rv = Tensor::full({c}, 1.0f);
      ops::BatchStats st, r_st;
      const Tensor y = ops::batchnorm_train_add_normed(x, gamma, beta, rm, rv, st, r, r_gamma, r_beta, r_rm, r_rv, r_st,
                                                       1e-5f, 0.1f, act);
      // the reference: the shortcut's normalised output in double, then the block's sum
      const Tensor zeros = Tensor::zeros(s).channels_last();
      const Reference rr = reference(r, r_gamma, r_beta, nullptr, Act::None, zeros, 1e-5f);
      Tensor sc(s, Device::CPU, Layout::ChannelsLast);
      for (std::int64_t i = 0; i < sc.numel(); ++i) sc.data()[i] = static_cast<float>(rr.y[static_cast<std::size_t>(i)]);
      const Reference rx = reference(x, gamma, beta, &sc, act, dy, 1e-5f);
      CHECK(rel_err(y.data(), rx.y) < 4e-6);
      CHECK(rel_err(st.mean.data(), rx.mean) < 1e-6);
      CHECK(rel_err(r_st.mean.data(), rr.mean) < 1e-6);
      CHECK(rel_err(r_st.var.data(), rr.var, 0.0) < 2e-6);
      // both batch norms get the sum's gradient
      const Tensor g = act == Act::ReLU ? ops::activation_backward(y, dy, Act::ReLU) : dy;
      const ops::BatchNormGrads gx = ops::batchnorm_backward(x, gamma, st, g);
      const ops::BatchNormGrads gr = ops::batchnorm_backward(r, r_gamma, r_st, g);
      const Reference rrg = reference(r, r_gamma, r_beta, nullptr, Act::None, g, 1e-5f);
      CHECK(rel_err(gx.dx.data(), rx.dx) < 2e-5);
      CHECK(rel_err(gx.dgamma.data(), rx.dgamma) < 2e-5);
      CHECK(rel_err(gr.dx.data(), rrg.dx) < 2e-5);
      CHECK(rel_err(gr.dbeta.data(), rrg.dbeta) < 2e-5);
    }
}

TEST_CASE("the backward of relu(bn(x) + residual) from two gradient terms: the same values as its parts") {
  std::mt19937 rng(33);
  for (const Shape& s : {Shape{3, 40, 5, 6}, Shape{8, 64, 48, 48}})
    for (bool two_terms : {true, false}) {
      CAPTURE(to_string(s));
      CAPTURE(two_terms);
      const std::int64_t c = s[1];
      const Tensor x = filled(s, rng, 0.3f, 1.5f), res = filled(s, rng, 0.0f, 1.0f);
      const Tensor dy_a = filled(s, rng, 0.0f, 1.0f), dy_b = two_terms ? filled(s, rng, 0.0f, 1.0f) : Tensor();
      const Tensor gamma = filled({c}, rng, 1.0f, 0.3f), beta = filled({c}, rng, 0.0f, 0.5f);
      Tensor rm = Tensor::zeros({c}), rv = Tensor::full({c}, 1.0f);
      ops::BatchStats st;
      const Tensor y = ops::batchnorm_train_add(x, gamma, beta, rm, rv, 1e-5f, 0.1f, res, Act::ReLU, st);
      Tensor ds;
      const ops::BatchNormGrads fused = ops::batchnorm_backward_relu_sum(x, gamma, st, y, dy_a, dy_b, ds);
      const Tensor ds_parts = ops::activation_backward_sum(y, dy_a, dy_b, Act::ReLU);
      const ops::BatchNormGrads parts = ops::batchnorm_backward(x, gamma, st, ds_parts);
      CHECK(test::max_abs_diff(ds, ds_parts) == 0.0f);
      CHECK(test::max_abs_diff(fused.dx, parts.dx) == 0.0f);
      CHECK(test::max_abs_diff(fused.dgamma, parts.dgamma) == 0.0f);
      CHECK(test::max_abs_diff(fused.dbeta, parts.dbeta) == 0.0f);
    }
}

TEST_CASE("a 1x1 convolution's gradients fused into its batch norm's backward: the values of the two ops in turn") {
  // conv_x -> 1x1 convolution (w) -> x -> batch norm [+ ReLU, or + residual and ReLU]: the fused
  // kernels (AVX-512 or AVX2; the composition under RELPOS_SIMD=generic) against batchnorm_backward
  // and oneDNN's conv2d_backward. Input channel counts cover the kernels' column groups of 4, 3, 2
  // and 1 vectors (AVX-512) and 2 (AVX2); output channel counts tiles of 6 with the rest in 4 and 2
  // (AVX2); row counts leave partial row tiles (of 4, 2 and 1) and a partial last block of 64 rows;
  // stride 2 with even and odd input sizes (the gradient's zero rows and columns written by the
  // blocks) and blocks of several image rows.
  std::mt19937 rng(35);
  struct Shp {
    std::int64_t n, ic, oc, h, w;
    int stride;
  };
  int fused_cases = 0;
  for (const Shp& s : {Shp{3, 16, 32, 5, 7, 1}, Shp{2, 32, 16, 9, 11, 1}, Shp{4, 112, 48, 6, 5, 1},
                       Shp{2, 80, 64, 13, 3, 1}, Shp{1, 96, 128, 7, 7, 1}, Shp{8, 64, 64, 14, 14, 1},
                       Shp{3, 32, 64, 28, 28, 2}, Shp{2, 48, 16, 7, 9, 2}, Shp{5, 16, 32, 6, 3, 2}})
    for (int variant = 0; variant < 4; ++variant) {  // act None, ReLU, residual sum (two terms, one term)
      CAPTURE(s.n);
      CAPTURE(s.ic);
      CAPTURE(s.oc);
      CAPTURE(s.h);
      CAPTURE(s.stride);
      CAPTURE(variant);
      const ops::ConvSpec spec{s.stride, 0, 1};
      const Tensor conv_x = filled({s.n, s.ic, s.h, s.w}, rng, 0.2f, 1.0f);
      const Tensor w = weights({s.oc, s.ic, 1, 1}, rng);
      const Tensor x = ops::conv2d(conv_x, w, nullptr, spec);
      const Tensor gamma = filled({s.oc}, rng, 1.0f, 0.3f), beta = filled({s.oc}, rng, 0.0f, 0.5f);
      Tensor rm = Tensor::zeros({s.oc}), rv = Tensor::full({s.oc}, 1.0f);
      const Shape ys = x.shape();
      const Tensor dy_a = filled(ys, rng, 0.0f, 1.0f), dy_b = variant == 2 ? filled(ys, rng, 0.0f, 1.0f) : Tensor();
      ops::BatchStats st;
      ops::BatchNormConvGrads got;
      ops::BatchNormGrads bn;
      Tensor ds, ds_parts;
      if (variant < 2) {
        const Act act = variant == 0 ? Act::None : Act::ReLU;
        (void)ops::batchnorm_train(x, gamma, beta, rm, rv, 1e-5f, 0.1f, act, st);
        got = ops::batchnorm_conv_backward(x, gamma, st, dy_a, conv_x, w, spec, true);
        bn = ops::batchnorm_backward(x, gamma, st, dy_a);
      } else {
        const Tensor res = filled(ys, rng, 0.0f, 1.0f);
        const Tensor y = ops::batchnorm_train_add(x, gamma, beta, rm, rv, 1e-5f, 0.1f, res, Act::ReLU, st);
        got = ops::batchnorm_relu_sum_conv_backward(x, gamma, st, y, dy_a, dy_b, ds, conv_x, w, spec, true);
        bn = ops::batchnorm_backward_relu_sum(x, gamma, st, y, dy_a, dy_b, ds_parts);
        CHECK(test::max_abs_diff(ds, ds_parts) == 0.0f);
      }
      const ops::ConvGrads conv = ops::conv2d_backward(conv_x, w, bn.dx, spec, true);
      CHECK(test::max_abs_diff(got.dgamma, bn.dgamma) == 0.0f);
      CHECK(test::max_abs_diff(got.dbeta, bn.dbeta) == 0.0f);
      test::check_close(got.dw, conv.dw, 2e-5f * std::max(1.0f, test::max_abs(conv.dw)), "dw");
      test::check_close(got.dx, conv.dx, 2e-5f * std::max(1.0f, test::max_abs(conv.dx)), "dx");
      CHECK(got.dx.layout() == Layout::ChannelsLast);
      if (cpu::conv1x1_grads_fit(x, conv_x, w, spec)) ++fused_cases;
    }
  // without the input gradient, and a convolution the kernels do not take (stride 3): the same values
  const Tensor conv_x = filled({2, 32, 8, 8}, rng, 0.0f, 1.0f), w = weights({16, 32, 1, 1}, rng);
  for (const ops::ConvSpec sp : {ops::ConvSpec{1, 0, 1}, ops::ConvSpec{3, 0, 1}}) {
    const Tensor x = ops::conv2d(conv_x, w, nullptr, sp);
    const Tensor gamma = filled({16}, rng, 1.0f, 0.3f), beta = filled({16}, rng, 0.0f, 0.5f);
    Tensor rm = Tensor::zeros({16}), rv = Tensor::full({16}, 1.0f);
    ops::BatchStats st;
    (void)ops::batchnorm_train(x, gamma, beta, rm, rv, 1e-5f, 0.1f, Act::ReLU, st);
    const Tensor dy = filled(x.shape(), rng, 0.0f, 1.0f);
    const auto got = ops::batchnorm_conv_backward(x, gamma, st, dy, conv_x, w, sp, sp.stride == 3);
    const auto bn = ops::batchnorm_backward(x, gamma, st, dy);
    const auto conv = ops::conv2d_backward(conv_x, w, bn.dx, sp, sp.stride == 3);
    test::check_close(got.dw, conv.dw, 2e-5f * std::max(1.0f, test::max_abs(conv.dw)), "dw");
    CHECK(got.dx.defined() == (sp.stride == 3));
    if (got.dx.defined()) CHECK(test::max_abs_diff(got.dx, conv.dx) == 0.0f);
    CHECK_FALSE(cpu::conv1x1_grads_fit(x, conv_x, w, ops::ConvSpec{3, 0, 1}));
  }
  // the fused kernels ran wherever this CPU and build have them (not under RELPOS_SIMD=generic)
  const char* simd = std::getenv("RELPOS_SIMD");
  if (relpos::cpu::avx2_kernels()) CHECK(fused_cases == 36);
  MESSAGE(fused_cases << " of 36 cases through the fused kernels (RELPOS_SIMD=" << std::string(simd ? simd : "") << ")");
}
