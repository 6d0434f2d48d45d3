// Finite-difference gradient checks of whole modules with their parameters (conv + BN + act,
// blocks with and without shortcuts, attention layers with stride 2, the stem and the head).
// loss = <layer(x), g> for a random g. The ops' own gradients are checked from the table of op
// cases (tests/op_cases.cpp, driven by tests/test_op_cases.cpp).
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "layers/attention_layers.hpp"
#include "layers/blocks.hpp"
#include "layers/stem_and_head.hpp"
#include "relpos/ops.hpp"
#include "core/ops_internal.hpp"
#include "test_util.hpp"

using namespace relpos;
using test::fd_check;
using test::inner;

namespace {

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

TEST_CASE("activation_backward_sum: the bits of an add then the activation's backward") {
  // A residual block's input gradient comes as two terms (body, shortcut) that the block before adds
  // inside its activation's backward: for ReLU one pass of its own on the CPU. It must give what
  // add + activation_backward gave: the same bits, including at y == 0, and NaN or infinite
  // gradients where the mask is off (oneDNN multiplies them by 0, giving NaN).
  std::mt19937 rng(5);
  const Shape s{2, 16, 5, 7};
  Tensor y = test::random_tensor(s, rng).channels_last();
  Tensor a = test::random_tensor(s, rng).channels_last(), b = test::random_tensor(s, rng).channels_last();
  float* yp = y.data();
  for (std::int64_t i = 0; i < y.numel(); i += 7) yp[i] = 0.0f;  // on the mask's edge
  for (std::int64_t i = 0; i < y.numel(); ++i)
    if (yp[i] < 0.0f) yp[i] = 0.0f;  // a ReLU output
  yp[3] = 1.0f;
  a.data()[3] = std::nanf("");                             // NaN where the mask is on
  a.data()[7] = std::numeric_limits<float>::infinity();    // infinity where it is off (y = 0)
  b.data()[14] = std::nanf("");                            // NaN where it is off
  for (const Act act : {Act::ReLU, Act::SiLU, Act::None}) {
    CAPTURE(to_string(act));
    const auto want = ops::activation_backward(y, ops::add(a, b), act).contiguous().to_vector();
    const auto got = ops::activation_backward_sum(y, a, b, act).contiguous().to_vector();
    REQUIRE(want.size() == got.size());
    std::size_t same = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      same += (want[i] == got[i] || (std::isnan(want[i]) && std::isnan(got[i]))) ? 1 : 0;
    CHECK(same == want.size());
  }
  // one term alone is the plain backward
  CHECK(ops::activation_backward_sum(y, a, Tensor(), Act::ReLU).contiguous().to_vector().size() == a.to_vector().size());
  const auto one = ops::activation_backward_sum(y, b, Tensor(), Act::ReLU).contiguous().to_vector();
  const auto plain = ops::activation_backward(y, b, Act::ReLU).contiguous().to_vector();
  std::size_t same = 0;
  for (std::size_t i = 0; i < one.size(); ++i) same += (one[i] == plain[i] || (std::isnan(one[i]) && std::isnan(plain[i]))) ? 1 : 0;
  CHECK(same == one.size());
}
