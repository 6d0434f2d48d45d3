// CPU vs CUDA parity of every op, forward and backward: every case of the table of op cases
// (tests/op_cases.cpp), plus the older per-op cases below, and the golden files; the model API and training on the GPU. Without a GPU the
// suite exits with status 77, which ctest reports as skipped (not passed).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <cstdio>
#include <opencv2/core.hpp>
#include <random>
#include <thread>

#include "relpos/attention_ops.hpp"
#include "core/ops_internal.hpp"
#include "relpos/error.hpp"
#include "relpos/model.hpp"
#include "relpos/ops.hpp"
#include "relpos/optim.hpp"
#include "op_cases.hpp"
#include "test_util.hpp"

using namespace relpos;

namespace {

constexpr Device GPU = Device::CUDA;

Tensor rnd(const Shape& s, std::uint32_t seed, float scale = 1.0f, Layout layout = Layout::Contiguous) {
  std::mt19937 rng(seed);
  return test::random_tensor(s, rng, scale).to_layout(layout);
}

Tensor gpu(const Tensor& t) { return t.to(GPU); }

// float32 on both sides (TF32 off): agreement to a few float32 ulps of the largest value.
void same(const Tensor& g, const Tensor& c, const std::string& what, float rel = 2e-5f) {
  CHECK_MESSAGE(g.is_cuda(), what << " did not stay on the GPU");
  test::check_close(g.to(Device::CPU), c, rel * std::max(1.0f, test::max_abs(c)), what);
}

}  // namespace

TEST_CASE("every case of the table of op cases: CUDA agrees with the CPU, outputs and gradients") {
  int cases = 0;
  for (const auto& c : test::op_cases()) {
    CAPTURE(c.name);
    std::vector<Tensor> in;
    for (const auto& t : c.inputs) in.push_back(gpu(t));
    Tensor dy;
    if (!c.diff.empty()) dy = rnd(c.run(c.inputs, Tensor()).outputs[0].shape(), 31);
    const test::OpRun cpu = c.run(c.inputs, dy);
    const test::OpRun cuda = c.run(in, dy.defined() ? gpu(dy) : Tensor());
    REQUIRE(cuda.outputs.size() == cpu.outputs.size());
    REQUIRE(cuda.grads.size() == cpu.grads.size());
    const auto close = [&](const Tensor& g, const Tensor& r, const std::string& what) {
      if (!r.defined()) return;
      test::check_close(g.to(Device::CPU), r, c.tol_parity * std::max(1.0f, test::max_abs(r)), c.name + " " + what);
    };
    for (std::size_t i = 0; i < cpu.outputs.size(); ++i) close(cuda.outputs[i], cpu.outputs[i], "output " + std::to_string(i));
    for (std::size_t i = 0; i < cpu.grads.size(); ++i) close(cuda.grads[i], cpu.grads[i], "gradient " + std::to_string(i));
    if (!cpu.outputs[0].is_cuda() && cuda.outputs[0].numel() > 1) CHECK_MESSAGE(cuda.outputs[0].is_cuda(), "did not stay on the GPU");
    ++cases;
  }
  MESSAGE(cases << " op cases agree");
}

TEST_CASE("layouts and copies round-trip through the GPU") {
  const Tensor x = rnd({3, 5, 7, 2}, 1);
  const Tensor back = gpu(x).channels_last().contiguous().to(Device::CPU);
  CHECK(test::max_abs_diff(back, x) == 0.0f);
  // more row tiles than a grid's y (65535 x 32 pixels) and more images than its z: they failed to launch
  for (const Shape& big : {Shape{1, 4, 1500, 1500}, Shape{65537, 3, 1, 2}}) {
    CAPTURE(to_string(big));
    const Tensor t = rnd(big, 2, 1.0f, Layout::ChannelsLast);
    CHECK(test::max_abs_diff(gpu(t).contiguous().to(Device::CPU), t.contiguous()) == 0.0f);
    CHECK(test::max_abs_diff(gpu(t.contiguous()).channels_last().to(Device::CPU), t) == 0.0f);
  }
  Tensor z = Tensor::zeros({4, 4}, GPU);
  z.fill(2.5f);
  CHECK(z.to_vector()[5] == 2.5f);
}

TEST_CASE("convolution forward (bias, residual, relu / silu epilogues) and backward") {
  struct Case { int n, c, o, hw_h, hw_w, k, stride, groups; };
  for (const Case cs : {Case{2, 3, 8, 9, 7, 3, 2, 1}, Case{1, 16, 32, 5, 6, 1, 1, 1}, Case{2, 8, 8, 6, 6, 3, 1, 4},
                        Case{3, 4, 6, 11, 5, 7, 2, 1}}) {
    CAPTURE(cs.k);
    CAPTURE(cs.groups);
    const Tensor x = rnd({cs.n, cs.c, cs.hw_h, cs.hw_w}, 2, 1.0f, Layout::ChannelsLast);
    const Tensor w = rnd({cs.o, cs.c / cs.groups, cs.k, cs.k}, 3, 0.3f), b = rnd({cs.o}, 4);
    const ops::ConvSpec spec{cs.stride, (cs.k - 1) / 2, cs.groups};
    const Tensor y0 = ops::conv2d(x, w, nullptr, spec);
    const Tensor res = rnd(y0.shape(), 5, 1.0f, Layout::ChannelsLast);
    for (Act act : {Act::None, Act::ReLU, Act::SiLU}) {
      OpCache cg, cc;
      same(ops::conv2d(gpu(x), gpu(w), nullptr, spec, {nullptr, act}), ops::conv2d(x, w, nullptr, spec, {nullptr, act}),
           "conv " + to_string(act));
      const Tensor gb = gpu(b), gres = gpu(res);
      same(ops::conv2d(gpu(x), gpu(w), &gb, spec, {&gres, act}, &cg), ops::conv2d(x, w, &b, spec, {&res, act}, &cc),
           "conv + bias + residual " + to_string(act));
    }
    const Tensor dy = rnd(y0.shape(), 6, 1.0f, Layout::ChannelsLast);
    const auto g = ops::conv2d_backward(gpu(x), gpu(w), gpu(dy), spec, true);
    const auto c = ops::conv2d_backward(x, w, dy, spec, true);
    same(g.dx, c.dx, "conv dx", 5e-5f);
    same(g.dw, c.dw, "conv dw", 5e-5f);
  }
}

TEST_CASE("batch norm (inference, training with running statistics, backward), activations, adds") {
  const Tensor x = rnd({4, 6, 5, 3}, 7, 2.0f, Layout::ChannelsLast), gamma = rnd({6}, 8), beta = rnd({6}, 9);
  const Tensor mean = rnd({6}, 10, 0.1f), var = Tensor::full({6}, 1.3f);
  SUBCASE("inference") {
  for (Act act : {Act::None, Act::ReLU, Act::SiLU})
    same(ops::batchnorm_infer(gpu(x), gpu(gamma), gpu(beta), gpu(mean), gpu(var), 1e-5f, act),
         ops::batchnorm_infer(x, gamma, beta, mean, var, 1e-5f, act), "bn infer " + to_string(act));
  }
  SUBCASE("training and backward") {
  Tensor rm_c = mean.clone(), rv_c = var.clone();
  Tensor rm_g = gpu(mean), rv_g = gpu(var);
  ops::BatchStats sc, sg;
  const Tensor yc = ops::batchnorm_train(x, gamma, beta, rm_c, rv_c, 1e-5f, 0.1f, Act::None, sc);
  const Tensor yg = ops::batchnorm_train(gpu(x), gpu(gamma), gpu(beta), rm_g, rv_g, 1e-5f, 0.1f, Act::None, sg);
  same(yg, yc, "bn train");
  same(rm_g, rm_c, "running mean");
  same(rv_g, rv_c, "running var (unbiased)");
  const Tensor dy = rnd(x.shape(), 11, 1.0f, Layout::ChannelsLast);
  const auto bc = ops::batchnorm_backward(x, gamma, sc, dy);
  const auto bg = ops::batchnorm_backward(gpu(x), gpu(gamma), sg, gpu(dy));
  same(bg.dx, bc.dx, "bn dx", 5e-5f);
  same(bg.dgamma, bc.dgamma, "bn dgamma", 5e-5f);
  same(bg.dbeta, bc.dbeta, "bn dbeta", 5e-5f);
  }
  SUBCASE("activations and adds") {
  const Tensor dy = rnd(x.shape(), 11, 1.0f, Layout::ChannelsLast);
  for (Act act : {Act::ReLU, Act::SiLU}) {
    same(ops::activation(gpu(x), act), ops::activation(x, act), "act " + to_string(act));
    same(ops::activation_backward(gpu(x), gpu(dy), act), ops::activation_backward(x, dy, act), "act back " + to_string(act));
  }
  same(ops::add(gpu(x), gpu(dy), Act::ReLU), ops::add(x, dy, Act::ReLU), "add+relu");
  }
}

TEST_CASE("pooling, global average pooling, linear, matmul, softmax, cross-entropy") {
  const Tensor x = rnd({2, 5, 9, 7}, 12, 1.0f, Layout::ChannelsLast);
  for (const ops::PoolSpec spec : {ops::PoolSpec{ops::PoolKind::Max, 3, 2, 1}, ops::PoolSpec{ops::PoolKind::Avg, 2, 2, 0}}) {
    const Tensor y = ops::pool2d(x, spec);
    same(ops::pool2d(gpu(x), spec), y, "pool");
    const Tensor dy = rnd(y.shape(), 13, 1.0f, Layout::ChannelsLast);
    same(ops::pool2d_backward(gpu(x), gpu(dy), spec), ops::pool2d_backward(x, dy, spec), "pool backward");
  }
  same(ops::global_avg_pool(gpu(x)), ops::global_avg_pool(x), "gap");
  const Tensor d = rnd({2, 5}, 14);
  same(ops::global_avg_pool_backward(gpu(d), x.shape()), ops::global_avg_pool_backward(d, x.shape()), "gap backward");
  const Tensor a = rnd({6, 5}, 15), w = rnd({4, 5}, 16), b = rnd({4}, 17), dy = rnd({6, 4}, 18);
  const Tensor gb = gpu(b);
  same(ops::linear(gpu(a), gpu(w), &gb), ops::linear(a, w, &b), "linear");
  const auto lg = ops::linear_backward(gpu(a), gpu(w), gpu(dy)), lc = ops::linear_backward(a, w, dy);
  same(lg.dx, lc.dx, "linear dx");
  same(lg.dw, lc.dw, "linear dw");
  same(lg.db, lc.db, "linear db");
  same(ops::matmul(gpu(a), gpu(w), false, true), ops::matmul(a, w, false, true), "matmul");
  same(ops::softmax(gpu(dy)), ops::softmax(dy), "softmax");
  const auto cg = ops::cross_entropy(gpu(dy), {0, 1, 2, 3, 0, 1}, 0.1f), cc = ops::cross_entropy(dy, {0, 1, 2, 3, 0, 1}, 0.1f);
  CHECK(cg.loss == doctest::Approx(cc.loss));
  same(cg.dlogits, cc.dlogits, "cross-entropy gradient");
}

TEST_CASE("a NaN passes through max pooling and batch norm with ReLU on the GPU, as on the CPU") {
  // The GPU turned it into 0 (a ReLU written x > 0 ? x : 0, cuDNN's pooling told not to propagate
  // NaN) where the CPU's own kernels and PyTorch keep it (test_op_cases.cpp, test_batchnorm_train.cpp).
  // Each is checked for NaN where the CPU has one and nowhere else. (oneDNN's ReLU, in the CPU's
  // ops::activation and convolution epilogues, and cuDNN's fused one make a NaN 0 on both.)
  const auto nan_at = [](const Tensor& g, const Tensor& c, const std::string& what) {
    const Tensor a = g.to(Device::CPU).channels_last(), b = c.channels_last();
    REQUIRE(a.shape() == b.shape());
    std::int64_t differ = 0, nans = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      differ += std::isnan(a.data()[i]) != std::isnan(b.data()[i]);
      nans += std::isnan(b.data()[i]);
    }
    CHECK_MESSAGE(differ == 0, what << ": NaN at " << differ << " other places than on the CPU");
    CHECK_MESSAGE(nans > 0, what << ": the CPU has no NaN to compare with");
  };
  const std::int64_t C = 40;
  Tensor x = rnd({2, C, 6, 5}, 41, 1.0f, Layout::ChannelsLast);
  x.data()[(1 * 5 + 1) * C + 3] = std::nanf("");
  nan_at(ops::pool2d(gpu(x), ops::PoolSpec{ops::PoolKind::Max, 3, 2, 1}), ops::pool2d(x, ops::PoolSpec{ops::PoolKind::Max, 3, 2, 1}),
         "max pool");
  const Tensor gamma = Tensor::full({C}, 1.0f), beta = Tensor::zeros({C}), var = Tensor::full({C}, 1.0f);
  nan_at(ops::batchnorm_infer(gpu(x), gpu(gamma), gpu(beta), gpu(beta), gpu(var), 1e-5f, Act::ReLU),
         ops::batchnorm_infer(x, gamma, beta, beta, var, 1e-5f, Act::ReLU), "batch norm inference");
  Tensor rm = Tensor::zeros({C}), rv = Tensor::full({C}, 1.0f), grm = gpu(rm), grv = gpu(rv);
  ops::BatchStats st, gst;
  const Tensor y = ops::batchnorm_train(x, gamma, beta, rm, rv, 1e-5f, 0.1f, Act::ReLU, st);
  const Tensor gy = ops::batchnorm_train(gpu(x), gpu(gamma), gpu(beta), grm, grv, 1e-5f, 0.1f, Act::ReLU, gst);
  nan_at(gy, y, "batch norm training");
  nan_at(grm, rm, "running mean");
}

TEST_CASE("optimizer updates") {
  const Tensor g = rnd({37}, 19);
  Tensor pc = rnd({37}, 20), bc = Tensor::zeros({37}), pg = gpu(pc), bg = Tensor::zeros({37}, GPU);
  for (int step = 0; step < 3; ++step) {
    ops::sgd_update(pc, g, bc, 0.1f, 0.9f, true, 0.01f, step == 0);
    ops::sgd_update(pg, gpu(g), bg, 0.1f, 0.9f, true, 0.01f, step == 0);
  }
  same(pg, pc, "sgd");
  Tensor qc = rnd({37}, 21), mc = Tensor::zeros({37}), vc = Tensor::zeros({37});
  Tensor qg = gpu(qc), mg = Tensor::zeros({37}, GPU), vg = Tensor::zeros({37}, GPU);
  for (int step = 1; step <= 3; ++step) {
    ops::adamw_update(qc, g, mc, vc, 0.01f, 0.9f, 0.999f, 1e-8f, 0.05f, step);
    ops::adamw_update(qg, gpu(g), mg, vg, 0.01f, 0.9f, 0.999f, 1e-8f, 0.05f, step);
  }
  same(qg, qc, "adamw");
}

TEST_CASE("BoTNet attention: every option, forward and backward, odd and non-square maps") {
  struct Case { PosEncoding pos; int clip; bool per_head, scale; int B, H, W; };
  for (const Case cs : {Case{PosEncoding::Relative, 0, false, false, 2, 5, 7}, Case{PosEncoding::Relative, 0, true, true, 1, 9, 4},
                        Case{PosEncoding::Relative, 2, false, false, 2, 6, 11}, Case{PosEncoding::Absolute, 0, false, false, 2, 3, 5},
                        Case{PosEncoding::Absolute, 0, true, true, 1, 4, 4}, Case{PosEncoding::None, 0, false, false, 3, 7, 3},
                        Case{PosEncoding::Relative, 0, false, false, 2, 16, 16}}) {
    BotAttnSpec sp{4, 8, 6};
    sp.pos = cs.pos, sp.clip = cs.clip, sp.per_head = cs.per_head, sp.scale_pos_embed = cs.scale;
    CAPTURE(to_string(sp.pos));
    CAPTURE(cs.H);
    const int kh = cs.clip ? cs.clip : cs.H - 1, kw = cs.clip ? cs.clip : cs.W - 1;
    Shape hs{1}, ws{1};
    if (sp.pos == PosEncoding::Relative) {
      hs = sp.per_head ? Shape{4, 2 * kh + 1, 8} : Shape{2 * kh + 1, 8};
      ws = sp.per_head ? Shape{4, 2 * kw + 1, 8} : Shape{2 * kw + 1, 8};
    } else if (sp.pos == PosEncoding::Absolute) {
      hs = sp.per_head ? Shape{4, cs.H * cs.W, 8} : Shape{cs.H * cs.W, 8};
    }
    const Tensor qkv = rnd({cs.B, sp.channels_qkv(), cs.H, cs.W}, 22, 1.0f, Layout::ChannelsLast);
    const Tensor ph = rnd(hs, 23, 0.5f), pw = rnd(ws, 24, 0.5f);
    Tensor pc, pg;
    const Tensor oc = ops::bot_attention(qkv, ph, pw, sp, &pc);
    same(ops::bot_attention(gpu(qkv), gpu(ph), gpu(pw), sp, &pg), oc, "attention");
    same(pg, pc, "probabilities");
    const Tensor dout = rnd(oc.shape(), 25, 1.0f, Layout::ChannelsLast);
    const auto gc = ops::bot_attention_backward(qkv, ph, pw, sp, pc, dout);
    const auto gg = ops::bot_attention_backward(gpu(qkv), gpu(ph), gpu(pw), sp, pg, gpu(dout));
    same(gg.dqkv, gc.dqkv, "d qkv", 5e-5f);
    if (gc.dpos_h.defined()) same(gg.dpos_h, gc.dpos_h, "d pos_h", 5e-5f);
    if (gc.dpos_w.defined()) same(gg.dpos_w, gc.dpos_w, "d pos_w", 5e-5f);
  }
}

TEST_CASE("SASA local attention forward and backward") {
  for (int k : {3, 7}) {
    SasaSpec sp;
    sp.heads = 2, sp.dqk = 8, sp.dv = 4, sp.kernel = k;
    const Tensor qkv = rnd({2, sp.channels_qkv(), 9, 6}, 26, 1.0f, Layout::ChannelsLast);
    const Tensor rr = rnd({k, 4}, 27, 0.5f), rc = rnd({k, 4}, 28, 0.5f);
    Tensor pc, pg;
    const Tensor oc = ops::sasa_attention(qkv, rr, rc, sp, &pc);
    same(ops::sasa_attention(gpu(qkv), gpu(rr), gpu(rc), sp, &pg), oc, "sasa");
    const Tensor dout = rnd(oc.shape(), 29, 1.0f, Layout::ChannelsLast);
    const auto gc = ops::sasa_attention_backward(qkv, rr, rc, sp, pc, dout);
    const auto gg = ops::sasa_attention_backward(gpu(qkv), gpu(rr), gpu(rc), sp, pg, gpu(dout));
    same(gg.dqkv, gc.dqkv, "sasa d qkv", 5e-5f);
    same(gg.dr_row, gc.dr_row, "sasa d r_row", 5e-5f);
    same(gg.dr_col, gc.dr_col, "sasa d r_col", 5e-5f);
  }
}

TEST_CASE("golden files on the GPU: rel_logits, BoTNet attention, tiny BoTNet eval and training step") {
  test::for_each_golden("rel_logits_h5w7", [](const SafetensorsFile& rl, const std::string& label) {
    test::check_forward(ops::rel_pos_logits(gpu(rl.tensor("q")), gpu(rl.tensor("height_rel")), gpu(rl.tensor("width_rel")), 5, 7),
                        rl.tensor("rel_logits"), label + " rel_logits (GPU)");
  });
  test::for_each_golden("bot_attn_s1_h6w8", [](const SafetensorsFile& f, const std::string& label) {
    BotAttnSpec sp{4, 8, 8};
    const Tensor qkv = ops::conv2d(gpu(f.tensor("x")), gpu(f.tensor("qkv.weight")), nullptr, {});
    test::check_forward(ops::bot_attention(qkv, gpu(f.tensor("pos_embed.height_rel")), gpu(f.tensor("pos_embed.width_rel")), sp),
                        f.tensor("y"), label + " bot_attn_s1 y (GPU)");
  });
  // Eval logits are compared with the CPU's; training-mode logits and gradients use batch
  // statistics, so they do not depend on which running statistics param.* holds.
  test::for_each_golden("tiny_botnet_96x64", [](const SafetensorsFile& t, const std::string& label) {
    Model m = Model::create(test::source_dir() + "/models/tiny_botnet_96x64.json");
    for (const auto& p : m.network().params()) p.value->copy_from(t.tensor("param." + p.name));
    m.network().prepare_inference();
    const Tensor cpu_logits = m.logits(t.tensor("input"));
    m.to(GPU);
    same(m.network().infer(gpu(t.tensor("input"))), cpu_logits, label + " tiny botnet eval logits", 1e-4f);
    const Tensor logits = m.network().forward(gpu(t.tensor("input")));
    test::check_forward(logits, t.tensor("logits_train"), label + " logits_train (GPU)");
    std::vector<int> labels;
    for (float v : t.tensor("labels").to_vector()) labels.push_back(static_cast<int>(v));
    const auto ce = ops::cross_entropy(logits, labels);
    CHECK(ce.loss == doctest::Approx(t.tensor("loss").to_vector()[0]).epsilon(1e-5));
    m.network().backward(ce.dlogits);
    for (const auto& p : m.network().params())
      if (p.grad) test::check_grad(*p.grad, t.tensor("grad." + p.name), label + " grad." + p.name + " (GPU)");
  });
}

TEST_CASE("the model API on the GPU: classify agrees with the CPU; a few training steps lower the loss") {
  Model cpu_model = Model::create(test::source_dir() + "/models/tiny_botnet_96x64.json", 4);
  Model gpu_model = Model::create(test::source_dir() + "/models/tiny_botnet_96x64.json", 4);
  gpu_model.to(GPU);
  const Tensor x = rnd({3, 3, 96, 64}, 30);
  same(gpu_model.network().infer(gpu(x)), cpu_model.logits(x), "logits", 1e-4f);
  Optimizer opt({}, gpu_model.network().params());
  const std::vector<int> labels{1, 2, 3};
  float first = 0.0f, last = 0.0f;
  for (int step = 0; step < 8; ++step) {
    const auto ce = ops::cross_entropy(gpu_model.network().forward(gpu(x)), labels);
    gpu_model.network().backward(ce.dlogits);
    opt.step(0.05f);
    (step == 0 ? first : last) = ce.loss;
  }
  CHECK(last < first);
}

TEST_CASE("many threads classifying on one GPU model agree exactly with one thread") {
  // The model's cached convolution plans are made by whichever thread comes first and then used
  // by every other thread on its own stream; activations are freed on the thread that made them.
  Model m = Model::create(test::source_dir() + "/models/tiny_botnet_96x64.json", 5);
  m.to(GPU);
  std::vector<cv::Mat> imgs;
  cv::RNG rng(7);
  for (int i = 0; i < 6; ++i) {
    cv::Mat img(80 + 7 * i, 60 + 5 * i, CV_8UC3);
    rng.fill(img, cv::RNG::UNIFORM, 0, 256);
    imgs.push_back(img);
  }
  std::vector<std::vector<Prediction>> serial;
  {
    // A first pass on a thread that then exits: the plans it published and the blocks its pool
    // owned outlive it.
    std::thread first([&] {
      for (const auto& img : imgs) serial.push_back(m.classify(img, 3));
    });
    first.join();
  }
  std::atomic<int> mismatches{0}, failures{0};
  std::mutex error_mutex;
  std::string first_error;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      try {
        for (int rep = 0; rep < 6; ++rep)
          for (std::size_t i = 0; i < imgs.size(); ++i) {
            const std::size_t k = (i + static_cast<std::size_t>(t)) % imgs.size();
            const auto got = m.classify(imgs[k], 3);
            for (std::size_t j = 0; j < got.size(); ++j)
              if (got[j].index != serial[k][j].index || got[j].logit != serial[k][j].logit) ++mismatches;
          }
      } catch (const std::exception& e) {
        ++failures;
        std::lock_guard<std::mutex> lock(error_mutex);
        if (first_error.empty()) first_error = e.what();
      }
    });
  for (auto& th : threads) th.join();
  CHECK_MESSAGE(failures.load() == 0, "first error: " << first_error);
  CHECK(mismatches.load() == 0);
}

TEST_CASE("GPU tensors made on one thread, used and freed on another") {
  // Blocks cross streams: the freeing thread's queued work must finish before the owner's pool
  // hands the block out again, and blocks of an exited thread go back to the device.
  const Tensor a = rnd({64, 96}, 40), b = rnd({96, 48}, 41);
  const Tensor want = ops::matmul(a, b, false, false);
  for (int round = 0; round < 20; ++round) {
    Tensor ga, gb;
    std::thread maker([&] {
      ga = gpu(a);
      gb = gpu(b);
    });
    maker.join();  // the owner thread is gone now
    Tensor out;
    std::thread user([&] {
      out = ops::matmul(ga, gb, false, false);
      ga = Tensor();  // freed while the product may still be queued on this thread's stream
      out = out.to(Device::CPU);
    });
    user.join();
    gb = Tensor();
    CHECK(test::max_abs_diff(out, want) <= 1e-4f * std::max(1.0f, test::max_abs(want)));
  }
  // Ping-pong: two live threads allocate, hand over and free each other's blocks.
  std::atomic<int> bad{0};
  auto worker = [&](std::uint32_t seed) {
    for (int i = 0; i < 50; ++i) {
      const Tensor x = rnd({33, 17}, seed + static_cast<std::uint32_t>(i));
      const Tensor y = ops::add(gpu(x), gpu(x), Act::None).to(Device::CPU);
      if (test::max_abs_diff(y, ops::add(x, x, Act::None)) != 0.0f) ++bad;
    }
  };
  std::thread t1(worker, 100), t2(worker, 200);
  t1.join();
  t2.join();
  CHECK(bad.load() == 0);
}

int main(int argc, char** argv) {
  if (!relpos::cuda_available()) {
    std::printf("test_cuda: no CUDA GPU on this machine; the GPU parity tests are skipped\n");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
