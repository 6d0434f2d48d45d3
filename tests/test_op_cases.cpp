// The table of op cases (tests/op_cases.cpp) on the CPU backend: every contract function has a
// case; every case's forward matches its naive reference (or is covered by named golden files);
// every differentiable input's gradient matches finite differences. test_cuda runs the same table
// for CPU vs CUDA parity, and relpos_microbench times the cases marked bench.
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "core/op_cache.hpp"
#if defined(__x86_64__)
#include "cpu/conv2d_narrow_input.hpp"
#include "cpu/conv2d_winograd.hpp"
#endif
#include "core/ops_internal.hpp"
#include "op_cases.hpp"
#include "relpos/runtime.hpp"
#include "test_util.hpp"

using namespace relpos;

TEST_CASE("every function of the backend contract has a case; backward functions have gradient cases") {
  const auto contract = test::backend_contract_ops();
  REQUIRE(contract.size() >= 20);  // the file was read and parsed
  std::set<std::string> covered, with_grads;
  for (const auto& c : test::op_cases())
    for (const auto& f : c.covers) {
      covered.insert(f);
      if (!c.diff.empty()) with_grads.insert(f);
    }
  for (const auto& f : contract) {
    INFO("backend_ops.inc declares " << f << " but no case in tests/op_cases.cpp covers it");
    CHECK(covered.count(f) == 1);
    if (f.size() > 9 && f.compare(f.size() - 9, 9, "_backward") == 0) {
      INFO(f << " has no case with finite-difference gradients");
      CHECK(with_grads.count(f) == 1);
    }
  }
  for (const auto& f : covered) {
    INFO("a case covers " << f << ", which backend_ops.inc does not declare");
    CHECK(std::find(contract.begin(), contract.end(), f) != contract.end());
  }
}

TEST_CASE("every case: forward against its reference, gradients against finite differences") {
  int referenced = 0, golden = 0, fd = 0;
  for (auto& c : test::op_cases()) {
    INFO(c.name);
    const test::OpRun r = c.run(c.inputs, Tensor());
    REQUIRE(!r.outputs.empty());
    if (c.reference) {
      const auto ref = c.reference(c.inputs);
      REQUIRE(ref.size() <= r.outputs.size());
      for (std::size_t i = 0; i < ref.size(); ++i)
        test::check_close(r.outputs[i].to(Device::CPU), ref[i], c.tol_reference * std::max(1.0f, test::max_abs(ref[i])),
                          c.name + " output " + std::to_string(i));
      ++referenced;
    } else {
      INFO("a case needs a reference or the golden files that check it");
      CHECK(!c.golden.empty());
      ++golden;
    }
    if (c.diff.empty()) continue;
    std::vector<Tensor> in;
    for (const auto& t : c.inputs) in.push_back(t.clone());
    std::mt19937 rng(77);
    const Tensor dy = test::random_tensor(r.outputs[0].shape(), rng);
    const test::OpRun g = c.run(in, dy);
    REQUIRE(g.grads.size() == c.diff.size());
    auto loss = [&] { return test::inner(c.run(in, Tensor()).outputs[0], dy); };
    for (std::size_t k = 0; k < c.diff.size(); ++k)
      test::fd_check(loss, in[static_cast<std::size_t>(c.diff[k])], g.grads[k],
                     c.name + " d input " + std::to_string(c.diff[k]), c.fd_eps, c.tol_fd);
    ++fd;
  }
  MESSAGE(referenced << " cases against naive references, " << golden << " covered by golden files, " << fd
                     << " with finite-difference gradients");
}

TEST_CASE("conv2d with overwrite_residual adds onto the residual's storage; without it the residual is kept") {
  std::mt19937 rng(31);
  const Tensor x = relpos::test::random_tensor({2, 6, 7, 7}, rng, 1.0f).channels_last();
  const Tensor w = relpos::test::random_tensor({5, 6, 3, 3}, rng, 0.3f);
  const Tensor b = relpos::test::random_tensor({5}, rng, 0.3f);
  const Tensor res = relpos::test::random_tensor({2, 5, 7, 7}, rng, 1.0f).channels_last();
  const ops::ConvSpec sp{1, 1, 1};
  const Tensor kept = res.clone();
  const Tensor copied = ops::conv2d(x, w, &b, sp, {&res, Act::ReLU});
  CHECK(copied.data() != res.data());
  CHECK(res.to_vector() == kept.to_vector());  // untouched
  Tensor scratch = res.clone();
  const Tensor in_place = ops::conv2d(x, w, &b, sp, {&scratch, Act::ReLU, true});
  CHECK(in_place.data() == scratch.data());  // the output is the residual's storage
  CHECK(in_place.to_vector() == copied.to_vector());
  // a residual that is not channels-last is copied even when it may be overwritten
  const Tensor plain = res.contiguous();
  const Tensor from_plain = ops::conv2d(x, w, &b, sp, {&plain, Act::ReLU, true});
  CHECK(from_plain.data() != plain.data());
  CHECK(from_plain.to_vector() == copied.to_vector());
}

TEST_CASE("max pooling passes a NaN on to every window that holds it") {
  // PyTorch's max_pool2d returns NaN for a window with a NaN in it; a max that skips NaNs would
  // hide a broken input behind its neighbours (channel counts for every block size of the loops:
  // pooling.cpp)
  for (const std::int64_t channels : {3, 8, 22, 70}) {
    Tensor x = Tensor::zeros({1, channels, 5, 5}, Device::CPU, Layout::ChannelsLast);
    const std::int64_t ch = channels - 1;
    for (const std::int64_t at : {std::int64_t{0}, (1 * 5 + 1) * channels + ch}) x.data()[at] = std::nanf("");
    const Tensor y = ops::pool2d(x, ops::PoolSpec{ops::PoolKind::Max, 3, 2, 1});  // 3x3 output
    REQUIRE(y.shape() == Shape({1, channels, 3, 3}));
    const Tensor yc = y.channels_last();
    for (std::int64_t oy = 0; oy < 3; ++oy)
      for (std::int64_t ox = 0; ox < 3; ++ox) {
        // channel 0 is NaN at pixel (0, 0): windows (0, 0) only; channel ch at (1, 1): windows (0..1, 0..1)
        const float first = yc.data()[(oy * 3 + ox) * channels];
        CHECK_MESSAGE(std::isnan(first) == (oy == 0 && ox == 0), "channel 0 at " << oy << "," << ox);
        const float last = yc.data()[(oy * 3 + ox) * channels + ch];
        CHECK_MESSAGE(std::isnan(last) == (oy <= 1 && ox <= 1), "channel " << ch << " at " << oy << "," << ox);
      }
  }
}

TEST_CASE("inference batch norm with ReLU passes a NaN on, as PyTorch's does") {
  // src/cpu/batchnorm.cpp: a ReLU written as max(v, 0) with an ordered compare would turn the NaN
  // into 0 and hide a broken input; 40 channels and 1024 pixels take the threaded loop
  const std::int64_t C = 40;
  Tensor x = Tensor::zeros({1, C, 32, 32}, Device::CPU, Layout::ChannelsLast);
  x.data()[(5 * 32 + 7) * C + 3] = std::nanf("");
  const Tensor ones = Tensor::from_vector({C}, std::vector<float>(static_cast<std::size_t>(C), 1.0f));
  const Tensor zeros = Tensor::zeros({C});
  const Tensor y = ops::batchnorm_infer(x, ones, zeros, zeros, ones, 1e-5f, Act::ReLU).channels_last();
  std::int64_t nans = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) nans += std::isnan(y.data()[i]) ? 1 : 0;
  CHECK(nans == 1);
  CHECK(std::isnan(y.data()[(5 * 32 + 7) * C + 3]));
}

TEST_CASE("an RGB stem's 3x3 convolution passes a NaN pixel on") {
  // On AVX2 these run through src/cpu/conv2d_narrow_input.hpp, which keeps a NaN through the ReLU
  // (as PyTorch does); oneDNN's ReLU, which runs them elsewhere, makes it 0, so the ReLU is checked
  // only where relpos's kernels run.
#if defined(__x86_64__)
  const bool own = cpu::winograd::available() && cpu::narrow_input::suits(3, 24, 3, 3, 2, 1, 1, Act::ReLU);
#else
  const bool own = false;
#endif
  for (const Act act : {Act::None, Act::ReLU}) {
    if (act == Act::ReLU && !own) continue;
    std::mt19937 rng(5);
    Tensor x = relpos::test::random_tensor({1, 3, 8, 8}, rng, 1.0f);  // planar, as a network's input
    x.data()[(1 * 8 + 4) * 8 + 4] = std::nanf("");                    // channel 1, pixel (4, 4)
    const Tensor w = relpos::test::random_tensor({24, 3, 3, 3}, rng, 0.3f);
    const Tensor b = relpos::test::random_tensor({24}, rng, 0.3f);
    OpCache cache;
    const Tensor y = ops::conv2d(x, w, &b, ops::ConvSpec{2, 1, 1}, {nullptr, act}, &cache).channels_last();
    for (std::int64_t oy = 0; oy < 4; ++oy)
      for (std::int64_t ox = 0; ox < 4; ++ox) {
        // output pixel (oy, ox) reads input rows and columns 2 o - 1 .. 2 o + 1: (4, 4) only from (2, 2)
        const bool reads_nan = oy == 2 && ox == 2;
        for (std::int64_t o = 0; o < 24; ++o)
          CHECK_MESSAGE(std::isnan(y.data()[(oy * 4 + ox) * 24 + o]) == reads_nan,
                        to_string(act) << " output " << o << " at " << oy << "," << ox);
      }
  }
}

#if defined(__x86_64__)  // conv2d_winograd.cpp is built for x86-64 only
TEST_CASE("a stride-2 3x3 convolution's input gradient by relpos's products: every element against a direct sum") {
  // conv2d_winograd.hpp: conv3x3_s2_input_grad, called directly so that small shapes run it too
  // (conv2d_backward takes it from 8 images and 3000 output pixels on): odd and even sizes (the
  // last row's and column's taps off the map), 16 to 64 input channels, output channels that are
  // not whole vectors, chunks of output pixels that span images, 1 and 2 threads, and 3 asked for
  // inside another parallel region (where the team has one).
  if (!cpu::winograd::available()) return;
  struct Shp {
    std::int64_t n, in, h, w, out;
  };
  std::mt19937 rng(41);
  std::normal_distribution<float> nd;
  for (const Shp& s : {Shp{1, 16, 5, 5, 8}, Shp{2, 32, 7, 6, 24}, Shp{3, 16, 9, 11, 40}, Shp{2, 64, 14, 13, 16},
                       Shp{5, 48, 4, 3, 20}}) {
    const std::int64_t oh = (s.h - 1) / 2 + 1, ow = (s.w - 1) / 2 + 1;
    std::vector<float> dy(static_cast<std::size_t>(s.n * oh * ow * s.out)), w(static_cast<std::size_t>(s.out * s.in * 9));
    for (float& v : dy) v = nd(rng);
    for (float& v : w) v = nd(rng);
    // dx[b][iy][ix][c] = sum over (y, x, ky, kx) with iy = 2 y - 1 + ky, ix = 2 x - 1 + kx of
    // dy[b][y][x][o] w[o][c][ky][kx]
    std::vector<double> want(static_cast<std::size_t>(s.n * s.h * s.w * s.in), 0.0);
    for (std::int64_t b = 0; b < s.n; ++b)
      for (std::int64_t y = 0; y < oh; ++y)
        for (std::int64_t x = 0; x < ow; ++x)
          for (int ky = 0; ky < 3; ++ky)
            for (int kx = 0; kx < 3; ++kx) {
              const std::int64_t iy = 2 * y - 1 + ky, ix = 2 * x - 1 + kx;
              if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
              for (std::int64_t c = 0; c < s.in; ++c) {
                double sum = 0.0;
                for (std::int64_t o = 0; o < s.out; ++o)
                  sum += double(dy[static_cast<std::size_t>(((b * oh + y) * ow + x) * s.out + o)]) *
                         w[static_cast<std::size_t>(((o * s.in + c) * 3 + ky) * 3 + kx)];
                want[static_cast<std::size_t>(((b * s.h + iy) * s.w + ix) * s.in + c)] += sum;
              }
            }
    for (int threads : {1, 2, 3}) {
      CAPTURE(s.n);
      CAPTURE(s.in);
      CAPTURE(s.h);
      CAPTURE(s.w);
      CAPTURE(s.out);
      CAPTURE(threads);
      set_num_threads(threads);
      std::vector<float> dx(want.size(), std::nanf(""));
      if (threads < 3) {
        cpu::winograd::conv3x3_s2_input_grad(dy.data(), w.data(), s.n, s.h, s.w, s.in, s.out, dx.data());
      } else {  // from inside another parallel region: a team of one where three were asked for
#pragma omp parallel num_threads(2)
#pragma omp single
        cpu::winograd::conv3x3_s2_input_grad(dy.data(), w.data(), s.n, s.h, s.w, s.in, s.out, dx.data());
      }
      double worst = 0.0, scale = 1.0;
      for (std::size_t i = 0; i < dx.size(); ++i) {
        worst = std::max(worst, std::fabs(dx[i] - want[i]));  // (a NaN left unwritten fails below)
        if (std::isnan(dx[i])) worst = 1e9;
        scale = std::max(scale, std::fabs(want[i]));
      }
      CHECK(worst <= 2e-5 * scale);
    }
  }
  set_num_threads(0);
}
#endif
