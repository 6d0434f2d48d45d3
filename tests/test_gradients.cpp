// Finite-difference gradient checks of every layer's backward: ops, and whole modules with
// their parameters (conv + BN + act, blocks with and without shortcuts, attention layers with
// stride 2, the stem and the head). loss = <layer(x), g> for a random g.
#include <cmath>
#include <functional>
#include <random>

#include "layers/attention_layers.hpp"
#include "layers/blocks.hpp"
#include "layers/stem_and_head.hpp"
#include "relpos/ops.hpp"
#include "core/ops_internal.hpp"
#include "test_util.hpp"

using namespace relpos;

namespace {

double inner(const Tensor& a, const Tensor& g) {
  const auto va = a.to_vector(), vg = g.to_vector();
  double s = 0.0;
  for (std::size_t i = 0; i < va.size(); ++i) s += static_cast<double>(va[i]) * vg[i];
  return s;
}

// Compares `analytic` with central differences of loss() in the entries of `value` (a sample
// of at most max_points of them). Float forward passes: eps and the tolerance are set for that.
void fd_check(const std::function<double()>& loss, Tensor& value, const Tensor& analytic, const std::string& what,
              float eps = 1e-2f, double tol = 2e-2, int max_points = 40) {
  REQUIRE_MESSAGE(analytic.defined(), what << ": no gradient");
  REQUIRE(analytic.shape() == value.shape());
  const auto grad = analytic.to_vector();
  double gmax = 1e-6;
  for (float v : grad) gmax = std::max(gmax, static_cast<double>(std::fabs(v)));
  std::vector<float> v = value.to_vector();
  const std::size_t n = v.size();
  const std::size_t step = std::max<std::size_t>(1, n / static_cast<std::size_t>(max_points));
  double worst = 0.0;
  for (std::size_t i = (n > 1 ? 1 : 0) % n; i < n; i += step) {
    const float keep = v[i];
    v[i] = keep + eps;
    value.copy_from(Tensor::from_vector(value.shape(), v));
    const double up = loss();
    v[i] = keep - eps;
    value.copy_from(Tensor::from_vector(value.shape(), v));
    const double down = loss();
    v[i] = keep;
    value.copy_from(Tensor::from_vector(value.shape(), v));
    worst = std::max(worst, std::fabs((up - down) / (2.0 * eps) - grad[i]));
  }
  INFO(what << ": worst |fd - analytic| " << worst << ", max |grad| " << gmax);
  CHECK(worst <= tol * gmax);
}

Tensor rnd(const Shape& s, std::uint32_t seed, float scale = 1.0f, Layout layout = Layout::Contiguous) {
  std::mt19937 rng(seed);
  return test::random_tensor(s, rng, scale).to_layout(layout);
}

// Checks a module: input gradient and every parameter gradient. The module runs in training
// mode; the loss is recomputed with forward() each time.
void check_module(Module& m, const Shape& in_shape, std::uint32_t seed, double tol = 2e-2) {
  Tensor x = rnd(in_shape, seed, 1.0f, Layout::ChannelsLast);
  Tensor y = m.forward(x);
  const Tensor g = rnd(y.shape(), seed + 1);
  const Tensor dx = m.backward(g);
  std::vector<ParamRef> params;
  m.collect("", params);
  std::vector<std::pair<std::string, Tensor>> grads;
  for (const auto& p : params)
    if (p.grad) grads.emplace_back(p.name, p.grad->clone());
  // eps well below the spread of the (batch-normalised) pre-activations, so that few of them
  // cross a ReLU kink between the two evaluations.
  auto loss = [&] { return inner(m.forward(x), g); };
  fd_check(loss, x, dx, "d input", 1e-3f, tol);
  for (const auto& p : params)
    if (p.grad)
      for (const auto& [name, gr] : grads)
        if (name == p.name) fd_check(loss, *p.value, gr, "d " + name, 1e-3f, tol);
}

}  // namespace

TEST_CASE("conv2d backward: strides, padding, groups") {
  struct Case { int c, o, k, stride, pad, groups, hw; };
  for (const Case cs : {Case{3, 4, 3, 1, 1, 1, 5}, Case{4, 6, 3, 2, 1, 2, 7}, Case{4, 4, 1, 2, 0, 1, 6}, Case{2, 3, 5, 1, 2, 1, 6}}) {
    CAPTURE(cs.k);
    CAPTURE(cs.stride);
    CAPTURE(cs.groups);
    Tensor x = rnd({2, cs.c, cs.hw, cs.hw}, 1, 1.0f, Layout::ChannelsLast);
    Tensor w = rnd({cs.o, cs.c / cs.groups, cs.k, cs.k}, 2, 0.5f);
    const ops::ConvSpec spec{cs.stride, cs.pad, cs.groups};
    const Tensor y = ops::conv2d(x, w, nullptr, spec);
    const Tensor g = rnd(y.shape(), 3);
    const auto gr = ops::conv2d_backward(x, w, g, spec, true);
    auto loss = [&] { return inner(ops::conv2d(x, w, nullptr, spec), g); };
    fd_check(loss, x, gr.dx, "conv dx");
    fd_check(loss, w, gr.dw, "conv dw");
  }
}

TEST_CASE("batch norm (batch statistics), activations, add, pools, linear, cross-entropy backward") {
  SUBCASE("batch norm in training mode") {
    Tensor x = rnd({3, 4, 3, 2}, 4, 2.0f, Layout::ChannelsLast), gamma = rnd({4}, 5), beta = rnd({4}, 6);
    Tensor rm = Tensor::zeros({4}), rv = Tensor::full({4}, 1.0f);
    ops::BatchStats st;
    const Tensor g = rnd(x.shape(), 7);
    ops::batchnorm_train(x, gamma, beta, rm, rv, 1e-5f, 0.1f, Act::None, st);
    const auto gr = ops::batchnorm_backward(x, gamma, st, g);
    auto loss = [&] {
      ops::BatchStats s;
      return inner(ops::batchnorm_train(x, gamma, beta, rm, rv, 1e-5f, 0.1f, Act::None, s), g);
    };
    fd_check(loss, x, gr.dx, "bn dx", 1e-2f, 3e-2);
    fd_check(loss, gamma, gr.dgamma, "bn dgamma");
    fd_check(loss, beta, gr.dbeta, "bn dbeta");
  }
  SUBCASE("batch norm with a fused activation (ReLU fused on the CPU, SiLU after)") {
    for (Act a : {Act::ReLU, Act::SiLU}) {
      Tensor x = rnd({3, 4, 3, 2}, 40, 2.0f, Layout::ChannelsLast), gamma = rnd({4}, 41), beta = rnd({4}, 42);
      Tensor rm = Tensor::zeros({4}), rv = Tensor::full({4}, 1.0f);
      ops::BatchStats st;
      const Tensor g = rnd(x.shape(), 43);
      ops::batchnorm_train(x, gamma, beta, rm, rv, 1e-5f, 0.1f, a, st);
      const auto gr = ops::batchnorm_backward(x, gamma, st, g);
      auto loss = [&] {
        ops::BatchStats s;
        return inner(ops::batchnorm_train(x, gamma, beta, rm, rv, 1e-5f, 0.1f, a, s), g);
      };
      fd_check(loss, x, gr.dx, "bn+" + to_string(a) + " dx", 1e-3f, 3e-2);
      fd_check(loss, gamma, gr.dgamma, "bn+" + to_string(a) + " dgamma", 1e-3f);
      fd_check(loss, beta, gr.dbeta, "bn+" + to_string(a) + " dbeta", 1e-3f);
    }
  }
  SUBCASE("relu and silu") {
    for (Act a : {Act::ReLU, Act::SiLU}) {
      Tensor x = rnd({2, 3, 4, 4}, 8, 1.0f, Layout::ChannelsLast);
      const Tensor g = rnd(x.shape(), 9);
      fd_check([&] { return inner(ops::activation(x, a), g); }, x, ops::activation_backward(x, g, a), to_string(a), 1e-3f);
    }
  }
  SUBCASE("max pool 3x3/2 pad 1 and avg pool 2x2/2 (odd sizes)") {
    for (const ops::PoolSpec spec : {ops::PoolSpec{ops::PoolKind::Max, 3, 2, 1}, ops::PoolSpec{ops::PoolKind::Avg, 2, 2, 0}}) {
      Tensor x = rnd({2, 3, 7, 5}, 10, 1.0f, Layout::ChannelsLast);
      const Tensor g = rnd(ops::pool2d(x, spec).shape(), 11);
      fd_check([&] { return inner(ops::pool2d(x, spec), g); }, x, ops::pool2d_backward(x, g, spec), "pool", 1e-3f);
    }
  }
  SUBCASE("global average pool and linear") {
    Tensor x = rnd({3, 5, 2, 3}, 12, 1.0f, Layout::ChannelsLast), w = rnd({4, 5}, 13), b = rnd({4}, 14);
    const Tensor g = rnd({3, 4}, 15);
    const Tensor pooled = ops::global_avg_pool(x);
    const auto lg = ops::linear_backward(pooled, w, g);
    const Tensor dx = ops::global_avg_pool_backward(lg.dx, x.shape());
    auto loss = [&] { return inner(ops::linear(ops::global_avg_pool(x), w, &b), g); };
    fd_check(loss, x, dx, "gap+linear dx");
    fd_check(loss, w, lg.dw, "linear dw");
    fd_check(loss, b, lg.db, "linear db");
  }
  SUBCASE("cross-entropy with and without label smoothing") {
    for (float smooth : {0.0f, 0.1f}) {
      Tensor logits = rnd({4, 6}, 16, 2.0f);
      const std::vector<int> labels{0, 5, 2, 2};
      const auto ce = ops::cross_entropy(logits, labels, smooth);
      fd_check([&] { return static_cast<double>(ops::cross_entropy(logits, labels, smooth).loss); }, logits, ce.dlogits,
               "cross-entropy", 1e-2f);
    }
  }
}

// Modules use SiLU: with ReLU, finite differences of a batch-normalised network cross kinks
// (a weight moves every pre-activation of its channel through the batch statistics). ReLU's
// backward is checked above and the golden training step checks ReLU networks end to end.
TEST_CASE("modules: every parameter and the input, in training mode") {
  SUBCASE("ConvNormAct 3x3/2 + BN + SiLU") {
    ConvNormAct m(3, 6, 3, 2, 1, Act::SiLU);
    Init init(1);
    m.init(init, false);
    check_module(m, {4, 3, 6, 6}, 20);
  }
  SUBCASE("BottleneckBlock with a strided conv shortcut") {
    BottleneckBlock m(8, 16, 2, 0.5f, 0, Act::SiLU);
    Init init(2);
    m.init(init, false);
    check_module(m, {2, 8, 6, 6}, 21);
  }
  SUBCASE("BottleneckBlock with identity shortcut and grouped 3x3") {
    BottleneckBlock m(16, 16, 1, 1.0f, 4, Act::SiLU);
    Init init(3);
    m.init(init, false);
    check_module(m, {2, 16, 4, 4}, 22);
  }
  SUBCASE("SelfAttnBlock with BoTNet attention, stride 2, relative positions") {
    BotAttnSpec sp{2, 4, 4};
    SelfAttnBlock m(8, 8, 16, 2, std::make_unique<BotAttention>(8, sp, 4, 6, 2), Act::SiLU);
    Init init(4);
    m.init(init, false);
    check_module(m, {2, 8, 4, 6}, 23);
  }
  SUBCASE("SelfAttnBlock with clipped, per-head BoTNet attention") {
    BotAttnSpec sp{2, 4, 4};
    sp.clip = 2, sp.per_head = true;
    SelfAttnBlock m(8, 8, 8, 1, std::make_unique<BotAttention>(8, sp, 0, 0, 1), Act::SiLU);
    Init init(5);
    m.init(init, false);
    check_module(m, {2, 8, 5, 3}, 24);
  }
  SUBCASE("SelfAttnBlock with absolute positions") {
    BotAttnSpec sp{2, 4, 4};
    sp.pos = PosEncoding::Absolute;
    SelfAttnBlock m(8, 8, 8, 1, std::make_unique<BotAttention>(8, sp, 3, 3, 1), Act::SiLU);
    Init init(6);
    m.init(init, false);
    check_module(m, {2, 8, 3, 3}, 25);
  }
  SUBCASE("SelfAttnBlock with SASA local attention, stride 2") {
    SasaSpec sp;
    sp.heads = 2, sp.dqk = 4, sp.dv = 4, sp.kernel = 3;
    SelfAttnBlock m(8, 8, 16, 2, std::make_unique<SasaAttention>(8, sp, 2), Act::SiLU);
    Init init(7);
    m.init(init, false);
    check_module(m, {2, 8, 6, 4}, 26);
  }
  SUBCASE("tiered stem with max pool, and the classifier head") {
    StemConfig sc;
    sc.chs = 16;
    Stem stem(sc, 3, Act::SiLU);
    Init init(8);
    stem.init(init);
    Tensor x = rnd({2, 3, 12, 10}, 27, 1.0f, Layout::ChannelsLast);
    const Tensor y = stem.forward(x);
    const Tensor g = rnd(y.shape(), 28);
    stem.backward(g);
    std::vector<ParamRef> ps;
    stem.collect("", ps);
    for (const auto& p : ps)
      if (p.grad) {
        const Tensor gr = p.grad->clone();
        fd_check([&] { return inner(stem.forward(x), g); }, *p.value, gr, "stem " + p.name, 1e-3f);
      }
    ClassifierHead head(6, 4);
    head.init(init);
    check_module(head, {3, 6, 2, 2}, 29);
  }
}
