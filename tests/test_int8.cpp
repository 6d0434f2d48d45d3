// int8 inference (docs/int8.md): weight quantization, the int8 convolution against a float
// reference within the quantization error bound, a quantized model against its float model, the
// int8 file formats, and bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <cstring>
#include <nlohmann/json.hpp>

#include "cli_run.hpp"
#include "core/ops_internal.hpp"
#include "io/atomic_file.hpp"
#include "layers/int8_conv.hpp"
#include "relpos/error.hpp"
#include "relpos/quantize.hpp"
#include "relpos/safetensors.hpp"
#include "relpos/runtime.hpp"
#include "test_util.hpp"

using namespace relpos;
using relpos::test::random_tensor;

namespace {

Tensor abs_of(const Tensor& t) {
  Tensor out = t.contiguous().clone();
  for (std::int64_t i = 0; i < out.numel(); ++i) out.data()[i] = std::fabs(out.data()[i]);
  return out;
}

// The tiny test model with random weights and batch norms that are not the identity, so that
// every layer (the zero-initialised last convolutions too) does something.
// Random batch norms that are not the identity, so that every layer (the zero-initialised last
// convolutions too) does something.
void randomize_norms(Model& m, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 1.5f), c(-0.2f, 0.2f);
  for (const ParamRef& p : m.network().params()) {
    const std::string& n = p.name;
    const auto ends = [&](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
    Tensor& t = *p.value;
    if (ends("bn.weight") || ends("running_var") || (ends(".weight") && n.find("post_attn") != std::string::npos))
      for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = u(rng);
    else if (ends("bn.bias") || ends("running_mean"))
      for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = c(rng);
  }
  m.network().prepare_inference();
}

Model tiny_model(std::uint32_t seed) {
  Model m = Model::create(relpos::test::tiny_rgb_config(), seed);
  randomize_norms(m, seed + 100);
  return m;
}

ops::Int8ConvWeights int8_weights(const QuantizedWeights& q, const Tensor* bias, float input_scale, bool is_signed) {
  ops::Int8ConvWeights w;
  w.weight = &q.q;
  w.scale = &q.scale;
  w.bias = bias;
  w.input_scale = input_scale;
  w.input_signed = is_signed;
  return w;
}

std::vector<Tensor> random_batches(int batches, int n, std::uint32_t seed, int size = 12) {
  std::mt19937 rng(seed);
  std::vector<Tensor> out;
  for (int b = 0; b < batches; ++b) out.push_back(random_tensor({n, 3, size, size}, rng, 1.0f).channels_last());
  return out;
}

double relative_rms(const Tensor& ref, const Tensor& got) {
  const auto a = ref.to_vector(), b = got.to_vector();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += a[i] * a[i];
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("per-channel weight quantization round trips within half a step") {
  std::mt19937 rng(7);
  Tensor w = random_tensor({6, 4, 3, 3}, rng, 0.3f);
  for (int i = 0; i < 36; ++i) w.data()[i] = 0.0f;  // a channel of zeros
  w.data()[40] = 5.0f;                                // an outlier in channel 1 only
  const QuantizedWeights q = quantize_per_channel(w);
  REQUIRE(q.q.shape() == w.shape());
  REQUIRE(q.scale.numel() == 6);
  CHECK(q.scale.data()[0] == 1.0f);
  CHECK(q.scale.data()[1] == doctest::Approx(5.0f / 127));
  const Tensor back = dequantize_per_channel(q.q, q.scale);
  for (std::int64_t o = 0; o < 6; ++o) {
    float amax = 0;
    for (std::int64_t i = 0; i < 36; ++i) {
      const float v = q.q.data()[o * 36 + i];
      CHECK(v == std::nearbyint(v));
      CHECK(std::fabs(v) <= 127.0f);
      amax = std::max(amax, std::fabs(v));
      CHECK(std::fabs(back.data()[o * 36 + i] - w.data()[o * 36 + i]) <= 0.5f * q.scale.data()[o] * 1.0001f);
    }
    if (o > 0) CHECK(amax == 127.0f);  // each channel's largest weight gets the full range
  }
  // quantizing the dequantized weights gives the same integers
  const QuantizedWeights again = quantize_per_channel(back);
  CHECK(relpos::test::max_abs_diff(again.q, q.q) == 0.0f);
  // a channel so small that its scale would be subnormal (which a model file may not hold) is a zero one
  Tensor tiny = Tensor::full({2, 3, 1, 1}, 1e-37f);
  tiny.data()[3] = 0.5f;
  const QuantizedWeights t = quantize_per_channel(tiny);
  CHECK(t.scale.data()[0] == 1.0f);
  CHECK(t.q.data()[0] == 0.0f);
  CHECK(t.scale.data()[1] == doctest::Approx(0.5f / 127));
}

TEST_CASE("int8 convolution matches the float convolution within the quantization error bound") {
  struct Case {
    int c, o, k, stride, groups;
    bool signed_in, residual;
    Act act;
  };
  for (const Case& cs : {Case{16, 24, 3, 1, 1, false, false, Act::ReLU}, Case{32, 16, 1, 1, 1, false, true, Act::ReLU},
                         Case{3, 8, 3, 2, 1, true, false, Act::None}, Case{16, 16, 3, 1, 4, false, false, Act::SiLU}}) {
    CAPTURE(cs.c);
    CAPTURE(cs.k);
    CAPTURE(cs.signed_in);
    std::mt19937 rng(11);
    Tensor x = random_tensor({2, cs.c, 9, 9}, rng, 1.0f);
    if (!cs.signed_in)
      for (std::int64_t i = 0; i < x.numel(); ++i) x.data()[i] = std::fabs(x.data()[i]);
    x = x.channels_last();
    const Tensor w = random_tensor({cs.o, cs.c / cs.groups, cs.k, cs.k}, rng, 0.2f);
    const Tensor bias = random_tensor({cs.o}, rng, 0.5f);
    const ops::ConvSpec spec{cs.stride, cs.k / 2, cs.groups};
    const int oh = (9 + 2 * spec.pad - cs.k) / cs.stride + 1;
    const Tensor res = random_tensor({2, cs.o, oh, oh}, rng, 1.0f).channels_last();
    const ops::Epilogue ep{cs.residual ? &res : nullptr, cs.act};

    float amax = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) amax = std::max(amax, std::fabs(x.data()[i]));
    const float in_scale = amax / (cs.signed_in ? 127.0f : 255.0f);
    const QuantizedWeights q = quantize_per_channel(w);
    const ops::Int8ConvWeights iw = int8_weights(q, &bias, in_scale, cs.signed_in);
    OpCache cache;
    const Tensor got = ops::conv2d_int8(x, iw, spec, ep, &cache);
    const Tensor ref = ops::conv2d(x, w, &bias, spec, ep);
    REQUIRE(got.shape() == ref.shape());

    // |conv(x, w) - conv(x', w')| <= in_scale / 2 * sum |w| + max step(w) * sum (|x| + in_scale / 2), with
    // step(w) one weight scale (oneDNN may keep 7 bits of an s8-input layer's weights on CPUs without
    // VNNI); activations are 1-Lipschitz.
    float wstep = 0;
    for (std::int64_t o = 0; o < cs.o; ++o) wstep = std::max(wstep, q.scale.data()[o]);
    Tensor xa = abs_of(x);
    for (std::int64_t i = 0; i < xa.numel(); ++i) xa.data()[i] += 0.5f * in_scale;
    const Tensor ones_w = Tensor::full(w.shape(), 1.0f);
    const Tensor sum_w = ops::conv2d(Tensor::full(x.shape(), 1.0f), abs_of(w), nullptr, spec);
    const Tensor sum_x = ops::conv2d(xa, ones_w, nullptr, spec);
    const auto g = got.to_vector(), r = ref.to_vector(), sw = sum_w.to_vector(), sx = sum_x.to_vector();
    double worst = 0, mean_err = 0, mean_ref = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double bound = 0.5 * in_scale * sw[i] + wstep * sx[i] + 1e-4 * (1 + std::fabs(r[i]));
      worst = std::max(worst, std::fabs(g[i] - r[i]) / bound);
      mean_err += std::fabs(g[i] - r[i]);
      mean_ref += std::fabs(r[i]);
    }
    CHECK(worst <= 1.0);
    CHECK(mean_err / mean_ref < 0.02);  // and typically far inside the bound
  }
}

TEST_CASE("a quantized model's logits stay close to the float model's") {
  Model m = tiny_model(3);
  const auto calib = random_batches(4, 16, 5);
  const Tensor x = random_batches(1, 32, 9).front();
  const Tensor ref = m.logits(x);
  QuantizeOptions opt;
  opt.sensitivity_images = 16;
  const QuantizeReport r = quantize(m, calib, opt);
  CHECK(r.calibration_images == 64);
  const auto names = m.network().quantizable_layers();
  REQUIRE(r.layers.size() == names.size());
  CHECK(m.network().int8_layers().size() == names.size());
  bool qkv = false;
  for (const LayerQuantization& l : r.layers) {
    CHECK(l.int8);
    CHECK(l.sensitivity >= 0.0);
    CHECK(l.input_scale > 0.0f);
    qkv = qkv || l.name.find("self_attn.qkv") != std::string::npos;
    // only the stem's input (the normalised image) is signed: every other layer follows a ReLU
    CHECK(l.input_signed == (l.name == "stem"));
  }
  CHECK(qkv);
  const Tensor got = m.logits(x);
  const double err = relative_rms(ref, got);
  MESSAGE("relative RMS logits error of the int8 tiny model: " << err);
  CHECK(err > 0.0);  // the int8 path ran
  CHECK(err < 0.05);
  CHECK(r.logits_error < 0.05);

  // keeping a layer in float: it registers its float weights and batch norm again
  Model k = tiny_model(3);
  opt.keep_float = {"stem"};
  const QuantizeReport rk = quantize(k, calib, opt);
  CHECK_FALSE(rk.layers.front().int8);
  CHECK(k.network().find("stem.bn.running_var") != nullptr);
  CHECK(k.network().find("stages.0.0.conv1_1x1.conv.weight_scale") != nullptr);
  CHECK(k.network().find("stages.0.0.conv1_1x1.bn.weight") == nullptr);
  // info shows which layers are int8
  int int8_rows = 0;
  for (const LayerRow& row : k.network().summarize()) int8_rows += row.kind.find("int8") != std::string::npos;
  CHECK(int8_rows == static_cast<int>(names.size()) - 1);
}

TEST_CASE("an int8 model runs at another input size, its layers still int8, close to its float model there") {
  Model m = tiny_model(4);  // relative positions without clip: the tables are resampled
  const Model float_big = m.at_input_size(16, 16);
  quantize(m, random_batches(2, 16, 6), {});
  REQUIRE_FALSE(m.network().int8_layers().empty());
  std::string note;
  const Model big = m.at_input_size(16, 16, &note);  // threw "internal: stem.bn.weight missing"
  CHECK(note.find("position tables resampled") != std::string::npos);
  CHECK(big.network().int8_layers().size() == m.network().int8_layers().size());
  const Tensor x = random_batches(1, 8, 11, 16).front();
  const double err = relative_rms(float_big.logits(x), big.logits(x));
  MESSAGE("relative RMS logits error, int8 against float at 16x16: " << err);
  CHECK(err > 0.0);
  CHECK(err < 0.05);
}

TEST_CASE("u8 between blocks: a block's sum written as u8, max pooling and dequantizing u8") {
  std::mt19937 rng(21);
  Tensor xf = abs_of(random_tensor({2, 16, 7, 7}, rng, 1.0f)).channels_last();
  const float in_scale = 3.0f / 255.0f, res_scale = 4.0f / 255.0f, out_scale = 5.0f / 255.0f;
  const ops::QuantizedTensor x = ops::quantize_activation(xf, in_scale, false);
  const ops::QuantizedTensor res =
      ops::quantize_activation(abs_of(random_tensor({2, 24, 7, 7}, rng, 1.5f)).channels_last(), res_scale, false);
  const Tensor w = random_tensor({24, 16, 1, 1}, rng, 0.3f), bias = random_tensor({24}, rng, 0.3f);
  const QuantizedWeights q = quantize_per_channel(w);
  const ops::Int8ConvWeights iw = int8_weights(q, &bias, in_scale, false);
  OpCache cache;
  const ops::ConvSpec spec{1, 0, 1};

  // the u8 sum against the same int8 convolution in float32 out with the dequantized residual,
  // quantized afterwards: the same up to one rounding step
  const Tensor res_f = ops::dequantize_activation(res);
  const Tensor ref = ops::conv2d_int8(x, iw, spec, {&res_f, Act::ReLU}, &cache);
  const ops::QuantizedTensor want = ops::quantize_activation(ref, out_scale, false);
  const ops::QuantizedTensor got = ops::conv2d_int8_requantized(x, iw, spec, Act::ReLU, out_scale, {&res, nullptr}, &cache);
  REQUIRE(got.shape == want.shape);
  CHECK(got.scale == out_scale);
  const auto* g = static_cast<const std::uint8_t*>(got.data());
  const auto* r = static_cast<const std::uint8_t*>(want.data());
  const std::int64_t n = numel_of(got.shape);
  int worst = 0, differ = 0, zero = 0, saturated = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(int{g[i]} - int{r[i]}));
    differ += g[i] != r[i];
    zero += r[i] == 0;
    saturated += r[i] == 255;
  }
  CHECK(worst <= 1);
  CHECK(differ < n / 20);
  CHECK(zero < n / 2);  // the case is not trivial: most sums are positive and inside the range
  CHECK(saturated < n / 10);
  // without a residual: the plain requantized convolution again
  const ops::QuantizedTensor plain = ops::conv2d_int8_requantized(x, iw, spec, Act::ReLU, out_scale, {}, &cache);
  const ops::QuantizedTensor plain_ref =
      ops::quantize_activation(ops::conv2d_int8(x, iw, spec, {nullptr, Act::ReLU}, &cache), out_scale, false);
  int plain_worst = 0;
  for (std::int64_t i = 0; i < n; ++i)
    plain_worst = std::max(plain_worst, std::abs(int{static_cast<const std::uint8_t*>(plain.data())[i]} -
                                                 int{static_cast<const std::uint8_t*>(plain_ref.data())[i]}));
  CHECK(plain_worst <= 1);
  // a float32 residual added by the binary post-op: the same up to one rounding step
  const ops::QuantizedTensor got_f = ops::conv2d_int8_requantized(x, iw, spec, Act::ReLU, out_scale, {nullptr, &res_f}, &cache);
  int worst_f = 0, differ_f = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const int d = std::abs(int{static_cast<const std::uint8_t*>(got_f.data())[i]} - int{r[i]});
    worst_f = std::max(worst_f, d);
    differ_f += d != 0;
  }
  CHECK(worst_f <= 1);
  CHECK(differ_f < n / 20);
  // a residual of the wrong shape or sign is refused
  ops::QuantizedTensor bad = res;
  bad.is_signed = true;
  CHECK_THROWS_AS(ops::conv2d_int8_requantized(x, iw, spec, Act::ReLU, out_scale, {&bad, nullptr}, &cache), Error);
  CHECK_THROWS_AS(ops::conv2d_int8_requantized(x, iw, spec, Act::ReLU, out_scale, {&x, nullptr}, &cache), Error);
  CHECK_THROWS_AS(ops::conv2d_int8_requantized(x, iw, spec, Act::ReLU, out_scale, {nullptr, &xf}, &cache), Error);
  CHECK_THROWS_AS(ops::conv2d_int8_requantized(x, iw, spec, Act::ReLU, out_scale, {&res, &res_f}, &cache), Error);

  // dequantizing: exactly code * scale
  const Tensor xd = ops::dequantize_activation(x);
  const auto* xc = static_cast<const std::uint8_t*>(x.data());
  for (std::int64_t i = 0; i < xd.numel(); ++i) REQUIRE(xd.data()[i] == in_scale * static_cast<float>(xc[i]));
  // max pooling u8 codes is exact: the same codes as pooling the float values and quantizing
  const ops::PoolSpec pool{ops::PoolKind::Max, 3, 2, 1};
  const ops::QuantizedTensor pq = ops::max_pool2d_quantized(x, pool);
  const ops::QuantizedTensor pr = ops::quantize_activation(ops::pool2d(xd, pool), in_scale, false);
  REQUIRE(pq.shape == pr.shape);
  CHECK(pq.shape == Shape{2, 16, 4, 4});
  CHECK(std::memcmp(pq.data(), pr.data(), static_cast<std::size_t>(numel_of(pq.shape))) == 0);
}

TEST_CASE("a u8 sum with a float32 residual on maps of 36 and 45 pixels stays inside its output") {
  // oneDNN 2.6's AMX 1x1 kernel wrote whole 16-pixel tiles past such an output (sasa_resnet26 int8
  // crashed at 192x192 on AMX CPUs); on other CPUs this checks the same sums
  for (const auto& hw : {std::pair<int, int>{6, 6}, std::pair<int, int>{5, 9}}) {
    std::mt19937 rng(static_cast<unsigned>(hw.first * 100 + hw.second));
    const int h = hw.first, w_ = hw.second;
    const float in_scale = 3.0f / 255.0f, out_scale = 8.0f / 255.0f;
    const ops::QuantizedTensor x =
        ops::quantize_activation(abs_of(random_tensor({1, 512, h, w_}, rng, 1.0f)).channels_last(), in_scale, false);
    const Tensor wt = random_tensor({2048, 512, 1, 1}, rng, 0.05f), bias = random_tensor({2048}, rng, 0.1f);
    const Tensor res = random_tensor({1, 2048, h, w_}, rng, 1.0f).channels_last();
    const QuantizedWeights q = quantize_per_channel(wt);
    const ops::Int8ConvWeights iw = int8_weights(q, &bias, in_scale, false);
    OpCache cache;
    const ops::ConvSpec spec{1, 0, 1};
    const ops::QuantizedTensor want =
        ops::quantize_activation(ops::conv2d_int8(x, iw, spec, {&res, Act::ReLU}, &cache), out_scale, false);
    for (int round = 0; round < 3; ++round) {
      std::vector<Tensor> around;  // allocations next to the output, which an overrun would reach
      for (int i = 0; i < 4; ++i) around.push_back(Tensor::full({1, 2048, h, w_}, 7.0f));
      const ops::QuantizedTensor got = ops::conv2d_int8_requantized(x, iw, spec, Act::ReLU, out_scale, {nullptr, &res}, &cache);
      for (int i = 0; i < 4; ++i) around.push_back(Tensor::full({1, 2048, h, w_}, 7.0f));
      int worst = 0;
      for (std::int64_t i = 0; i < numel_of(got.shape); ++i)
        worst = std::max(worst, std::abs(int{static_cast<const std::uint8_t*>(got.data())[i]} -
                                         int{static_cast<const std::uint8_t*>(want.data())[i]}));
      CHECK(worst <= 1);
      for (const Tensor& t : around)
        for (const float v : t.to_vector()) REQUIRE(v == 7.0f);
    }
  }
}

TEST_CASE("an int8 network hands u8 from block to block: fewer float32 passes, logits close to float") {
  // stem with a max pool, then an identity block (0.1) ahead of another block: the stem writes u8
  // for stages.0.0 (pooled as u8) and stages.0.1 writes its sum as u8 for stages.1.0
  relpos::test::TempDir dir;
  const std::string cfg = dir.path + "/cfg.json";
  std::ofstream(cfg) << R"({"name": "flow", "num_classes": 5, "in_chans": 3, "input_size": [16, 16], "act": "relu",
    "stem": {"type": "conv", "chs": 8, "kernel": 3, "stride": 1, "pool": "maxpool"},
    "stages": [{"type": "bottle", "depth": 2, "chs": 16, "stride": 1, "br": 0.5},
               {"types": ["bottle", "self_attn"], "chs": 32, "stride": 2, "br": 0.5}],
    "self_attn": {"heads": 2, "pos": "relative"}})";
  Model m = Model::create(cfg, 4);
  randomize_norms(m, 104);
  std::mt19937 rng(105);
  std::vector<Tensor> calib;
  for (int b = 0; b < 4; ++b) calib.push_back(random_tensor({16, 3, 16, 16}, rng, 1.0f).channels_last());
  const Tensor x = random_tensor({32, 3, 16, 16}, rng, 1.0f).channels_last();
  const Tensor ref = m.logits(x);
  QuantizeOptions opt;
  opt.sensitivity_images = 0;
  quantize(m, calib, opt);
  REQUIRE(m.network().int8_layers().size() == m.network().quantizable_layers().size());

  set_profiling(true);
  reset_profile();
  const Tensor got = m.logits(x);
  set_profiling(false);
  std::map<std::string, long> quantized, pooled;
  for (const ProfileRow& row : profile_rows()) {
    if (row.op.rfind("quantize_activation", 0) == 0) quantized[row.layer] += row.calls;
    if (row.op.rfind("pool2d", 0) == 0) pooled[row.layer] += row.calls;
  }
  reset_profile();
  CHECK(quantized["stem"] == 1);        // the image (s8)
  CHECK(quantized["stages.0.0"] == 0);  // u8 from the stem, max-pooled as u8
  CHECK(pooled["stem"] == 1);
  CHECK(quantized["stages.0.1"] == 0);  // u8 from 0.0's sum with its projection shortcut (float32 added)
  CHECK(quantized["stages.1.0"] == 0);  // u8 from 0.1's sum with its u8 input
  CHECK(quantized["stages.1.1"] == 1);  // u8 from 1.0; only the attention output (float32) is
                                        // quantized, for conv3 (the last block writes float32 for
                                        // the head, its residual its u8 input dequantized)
  const double err = relative_rms(ref, got);
  MESSAGE("relative RMS logits error with u8 between blocks: " << err);
  CHECK(err > 0.0);
  CHECK(err < 0.05);
  // against float32 between the blocks (infer_features takes that path through the same int8
  // layers): the head, global average pool then linear, on the last stage's features
  const Tensor feat = m.network().infer_features(x).back().contiguous();
  const Tensor fw = m.network().find("head.fc.weight")->value->contiguous();
  const Tensor fb = m.network().find("head.fc.bias")->value->contiguous();
  const std::int64_t C = feat.dim(1), HW = feat.dim(2) * feat.dim(3), K = fw.dim(0);
  Tensor between({x.dim(0), K});
  for (std::int64_t i = 0; i < x.dim(0); ++i)
    for (std::int64_t k = 0; k < K; ++k) {
      double acc = fb.data()[k];
      for (std::int64_t ch = 0; ch < C; ++ch) {
        double mean = 0;
        for (std::int64_t p = 0; p < HW; ++p) mean += feat.data()[(i * C + ch) * HW + p];
        acc += fw.data()[k * C + ch] * mean / static_cast<double>(HW);
      }
      between.data()[i * K + k] = static_cast<float>(acc);
    }
  const double flow_err = relative_rms(between, got);
  MESSAGE("relative RMS logits difference, u8 against float32 between blocks: " << flow_err);
  CHECK(flow_err > 0.0);  // the paths differ (the residual of stages.0.1 is rounded to u8)
  CHECK(flow_err < 0.02);
}

TEST_CASE("int8 models round-trip through the weights JSON and safetensors") {
  relpos::test::TempDir dir;
  Model m = tiny_model(4);
  quantize(m, random_batches(2, 16, 6), {});
  const Tensor x = random_batches(1, 8, 10).front();
  const Tensor ref = m.logits(x);
  m.save_json(dir.file("q.json"));
  m.save_json(dir.file("qn.json"), TensorEncoding::Numbers);
  m.save_safetensors(dir.file("q.safetensors"));
  for (const char* f : {"q.json", "qn.json", "q.safetensors"}) {
    CAPTURE(f);
    const Model back = Model::load(dir.file(f));
    const auto a = m.network().int8_layers(), b = back.network().int8_layers();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].name == b[i].name);
      CHECK(a[i].input_scale == b[i].input_scale);
      CHECK(a[i].input_signed == b[i].input_signed);
    }
    CHECK(relpos::test::max_abs_diff(back.logits(x), ref) == 0.0f);
    CHECK(back.labels() == m.labels());
  }
  const auto j = nlohmann::json::parse(std::ifstream(dir.file("q.json")));
  CHECK(j["version"] == 2);
  CHECK(j["tensors"]["stages.0.0.conv1_1x1.conv.weight"]["dtype"] == "int8");
  CHECK(j["tensors"]["stages.0.0.conv1_1x1.conv.weight_scale"]["dtype"] == "float32");
  const SafetensorsFile st = SafetensorsFile::read(dir.file("q.safetensors"));
  CHECK(st.entry("stages.0.0.conv1_1x1.conv.weight").dtype == "I8");
  // an int8 file is a quarter of the float one's weight bytes (plus scales)
  Model f = tiny_model(4);
  f.save_safetensors(dir.file("f.safetensors"));
  CHECK(std::filesystem::file_size(dir.file("q.safetensors")) < std::filesystem::file_size(dir.file("f.safetensors")));
  // a float model still writes (and reads) version 1
  f.save_json(dir.file("f.json"));
  CHECK(nlohmann::json::parse(std::ifstream(dir.file("f.json")))["version"] == 1);
  CHECK(Model::load(dir.file("f.json")).network().int8_layers().empty());
}

TEST_CASE("the first layer is quantized for a black pixel even when calibration saw only bright ones") {
  relpos::test::TempDir dir;
  Model m = tiny_model(9);
  std::vector<Tensor> bright = random_batches(2, 4, 3);
  for (Tensor& b : bright) b = abs_of(b).channels_last();  // no negative input: before, the stem took u8
  const QuantizeReport r = quantize(m, bright, {});
  REQUIRE(r.layers.front().name == "stem");
  CHECK(r.layers.front().input_signed);
  // a black pixel is (0 - 0.5) / 0.25 = -2: inside the range, not clipped to 0
  CHECK(r.layers.front().input_scale >= 2.0f / 127.0f);
  m.save_json(dir.file("q.json"));
  CHECK(Model::load(dir.file("q.json")).network().int8_layers().front().input_signed);
}

TEST_CASE("int8 bad input: errors name the problem") {
  relpos::test::TempDir dir;
  Model m = tiny_model(5);
  CHECK_THROWS_WITH_AS(quantize(m, {}, {}), doctest::Contains("no calibration images"), Error);
  QuantizeOptions bad;
  bad.keep_float = {"stages.9.conv"};
  CHECK_THROWS_WITH_AS(quantize(m, random_batches(1, 4, 1), bad), doctest::Contains("stages.9.conv"), Error);
  bad.keep_float = m.network().quantizable_layers();
  CHECK_THROWS_WITH_AS(quantize(m, random_batches(1, 4, 1), bad), doctest::Contains("nothing to quantize"), Error);
  {
    Model nan_model = tiny_model(5);
    nan_model.network().find("stages.0.0.conv2_kxk.conv.weight")->value->data()[3] = NAN;
    nan_model.network().prepare_inference();
    CHECK_THROWS_AS(quantize(nan_model, random_batches(1, 4, 1), {}), Error);
  }
  quantize(m, random_batches(1, 8, 1), {});
  CHECK_THROWS_WITH_AS(quantize(m, random_batches(1, 4, 1), {}), doctest::Contains("already int8"), Error);
  CHECK_THROWS_WITH_AS(m.network().forward(random_batches(1, 2, 1).front()), doctest::Contains("cannot be trained"),
                       Error);

  // files: an int8 layer's weights stored as float32, int8 in a version-1 file, an unknown layer
  m.save_json(dir.file("q.json"), TensorEncoding::Numbers);
  const auto j = nlohmann::json::parse(std::ifstream(dir.file("q.json")));
  const auto write = [&](const nlohmann::json& v, const std::string& name) {
    std::ofstream(dir.file(name)) << v.dump();
    return dir.file(name);
  };
  auto f32 = j;
  f32["tensors"]["stem.conv.weight"]["dtype"] = "float32";
  CHECK_THROWS_WITH_AS(Model::load(write(f32, "a.json")), doctest::Contains("stem.conv.weight"), Error);
  auto v1 = j;
  v1["version"] = 1;
  CHECK_THROWS_WITH_AS(Model::load(write(v1, "b.json")), doctest::Contains("version 2"), Error);
  auto unknown = j;
  unknown["quantization"]["layers"]["stages.7.0.conv1_1x1"] = {{"input", "u8"}};
  CHECK_THROWS_WITH_AS(Model::load(write(unknown, "c.json")), doctest::Contains("stages.7.0.conv1_1x1"), Error);
  auto range = j;
  range["tensors"]["stem.conv.weight"]["data"][0] = -128;
  CHECK_THROWS_WITH_AS(Model::load(write(range, "d.json")), doctest::Contains("[-127, 127]"), Error);
  // the first layer in u8, while the preprocessing gives negative values (before: every one read as 0)
  auto u8stem = j;
  u8stem["quantization"]["layers"]["stem"]["input"] = "u8";
  CHECK_THROWS_WITH_AS(Model::load(write(u8stem, "u.json")),
                       doctest::Contains("the int8 layer stem takes u8 input (never negative), but this preprocessing"),
                       Error);
  // with a mean of 0 it takes a u8 first layer; a negative std makes every input negative (every
  // pixel read as 0 in u8), and was let through
  auto u8zero = u8stem;
  for (auto& m : u8zero["preprocess"]["mean"]) m = 0.0;
  CHECK_NOTHROW(Model::load(write(u8zero, "u0.json")));
  auto u8neg = u8zero;
  for (auto& sd : u8neg["preprocess"]["std"]) sd = -sd.get<double>();
  CHECK_THROWS_WITH_AS(Model::load(write(u8neg, "un.json")),
                       doctest::Contains("the int8 layer stem takes u8 input (never negative), but this preprocessing"),
                       Error);
  auto scale = j;
  scale["tensors"]["stem.conv.input_scale"]["data"][0] = 0.0;
  CHECK_THROWS_WITH_AS(Model::load(write(scale, "e.json")), doctest::Contains("input_scale"), Error);
  // before: weight scales of 0 or below, and a subnormal input scale (infinite inverse), loaded and
  // answered anything
  for (const double v : {0.0, -0.01, 1e-40}) {
    for (const char* t : {"stages.0.0.conv2_kxk.conv.weight_scale", "stages.0.0.conv2_kxk.conv.input_scale"}) {
      auto s = j;
      s["tensors"][t]["data"][0] = v;
      CAPTURE(v);
      CHECK_THROWS_WITH_AS(Model::load(write(s, "f.json")), doctest::Contains((std::string("'") + t + "' holds").c_str()),
                           Error);
    }
  }
  // an int8 layer's weights in another dtype: said as such, not as "stored as float32"
  CHECK_THROWS_WITH_AS(Model::load(write(f32, "a.json")), doctest::Contains("is not stored as int8"), Error);
  // safetensors: int8 layers in a file of format version 1, or of none, are refused as in JSON
  m.save_safetensors(dir.file("q.safetensors"));
  const SafetensorsFile sf = SafetensorsFile::read(dir.file("q.safetensors"));
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::set<std::string> i8;
  for (const auto& e : sf.entries()) {
    tensors.emplace_back(e.name, sf.tensor(e.name));
    if (e.dtype == "I8") i8.insert(e.name);
  }
  REQUIRE(!i8.empty());
  for (const char* version : {"1", ""}) {
    auto meta = sf.metadata();
    if (*version) meta["relpos.version"] = version;
    else meta.erase("relpos.version");
    write_safetensors(dir.file("v.safetensors"), tensors, meta, i8);
    CHECK_THROWS_WITH_AS(Model::load(dir.file("v.safetensors")), doctest::Contains("needs relpos.version 2"), Error);
  }
  // names under DistributedDataParallel's 'module.' load as a float model's do (it said "tensor
  // 'stem.conv.weight' is not stored as int8")
  {
    std::vector<std::pair<std::string, Tensor>> prefixed;
    std::set<std::string> prefixed_i8;
    for (const auto& [name, t] : tensors) prefixed.emplace_back("module." + name, t);
    for (const auto& name : i8) prefixed_i8.insert("module." + name);
    write_safetensors(dir.file("module.safetensors"), prefixed, sf.metadata(), prefixed_i8);
    const Model back = Model::load(dir.file("module.safetensors")), plain = Model::load(dir.file("q.safetensors"));
    const Tensor x =
        Tensor::full({1, plain.network().config().in_chans, plain.preprocess().height, plain.preprocess().width}, 0.5f);
    CHECK(test::max_abs_diff(back.logits(x), plain.logits(x)) == 0.0f);
  }
  // training an int8 model: refused naming the file, before the output folder is made
  relpos::test::make_pattern_dataset(dir.file("data"), 2, 1);
  const auto r = relpos::test::run_cli("train --init " + dir.file("q.json") + " --data " + dir.file("data") +
                                       " --epochs 1 -b 2 --threads 1 -q -o " + dir.file("run"));
  CHECK(r.status == 1);
  CHECK(r.out.find(dir.file("q.json") + " is an int8 model, which cannot be trained") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.file("run")));
}

TEST_CASE("relpos quantize: bad calibration folders and a model that cannot be quantized") {
  using relpos::test::run_cli;
  relpos::test::TempDir dir;
  const std::string cfg = relpos::test::tiny_rgb_config();
  std::filesystem::create_directories(dir.file("empty"));
  auto r = run_cli("quantize -m " + cfg + " --calib " + dir.file("empty") + " -o " + dir.file("q.json"));
  CHECK(r.status == 1);
  CHECK(r.out.find(dir.file("empty")) != std::string::npos);
  r = run_cli("quantize -m " + cfg + " --calib " + dir.file("missing") + " -o " + dir.file("q.json"));
  CHECK(r.status == 1);
  CHECK(r.out.find("missing") != std::string::npos);
  std::filesystem::create_directories(dir.file("bad"));
  std::ofstream(dir.file("bad/a.png")) << "not a png";
  r = run_cli("quantize -m " + cfg + " --calib " + dir.file("bad") + " -o " + dir.file("q.json"));
  CHECK(r.status == 1);
  CHECK(r.out.find("could be read") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.file("q.json")));

  // a folder holding only a broken link names it
  std::filesystem::create_directories(dir.file("links"));
  std::filesystem::create_symlink(dir.file("gone.png"), dir.file("links/a.png"));
  r = run_cli("quantize -m " + cfg + " --calib " + dir.file("links") + " -o " + dir.file("q.json"));
  CHECK(r.status == 1);
  CHECK(r.out.find(dir.file("links/a.png") + ": broken symbolic link") != std::string::npos);

  relpos::test::make_pattern_dataset(dir.file("pat"), 4, 1);
  std::filesystem::create_symlink(dir.file("gone.png"), dir.file("pat/lost.png"));  // skipped, and said so
  r = run_cli("quantize -m " + cfg + " --calib " + dir.file("pat") + " -n 8 -o " + dir.file("q.json") +
              " --keep-float 'stem, stages.0.0.conv1_1x1' --keep-float stages.1.1.self_attn.qkv --sensitivity-images 2");
  // the skipped image is a reported failure (exit 1, as classify and eval), the model still written
  CHECK(r.status == 1);
  REQUIRE(std::filesystem::exists(dir.file("q.json")));
  CHECK(r.out.find("skipped calibration image " + dir.file("pat/lost.png") + ": broken symbolic link") !=
        std::string::npos);
  std::filesystem::remove(dir.file("pat/lost.png"));
  CHECK(r.out.find("stages.1.1.self_attn.qkv") != std::string::npos);
  CHECK(r.out.find("sensitivity") != std::string::npos);
  // --keep-float: "a, b" (a space after the comma was refused) and repeated (CLI11's raw error)
  for (const std::string layer : {"stem", "stages.0.0.conv1_1x1", "stages.1.1.self_attn.qkv"}) {
    const std::size_t at = r.out.find("\n" + layer + " ");
    REQUIRE(at != std::string::npos);
    const std::string line = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
    CHECK(line.find(" float ") != std::string::npos);
  }
  // a name that is no such layer: a usage error (it was exit 1, after reading the calibration images)
  r = run_cli("quantize -m " + cfg + " --calib " + dir.file("pat") + " -o " + dir.file("q3.json") +
              " --keep-float nolayer");
  CHECK(r.status == 2);
  CHECK(r.out.find("--keep-float: 'nolayer' is not a layer of") != std::string::npos);
  // an int8 model cannot be quantized again
  r = run_cli("quantize -m " + dir.file("q.json") + " --calib " + dir.file("pat") + " -o " + dir.file("q2.json"));
  CHECK(r.status == 1);
  CHECK(r.out.find("already int8") != std::string::npos);
  // ... but runs everywhere a float model does
  r = run_cli("info " + dir.file("q.json"));
  CHECK(r.status == 0);
  CHECK(r.out.find("int8 (u8 in)") != std::string::npos);
  CHECK(r.out.find("MiB as loaded (int8 weights a byte each") != std::string::npos);  // before: float32's only
  r = run_cli("classify -m " + dir.file("q.json") + " " + dir.file("pat") + "/test -q");
  CHECK(r.status == 0);
  r = run_cli("bench -m " + dir.file("q.json") + " --batch 1 --warmup 0 --iters 1");
  CHECK(r.status == 0);
  r = run_cli("quantize -m " + cfg + " --calib " + dir.file("pat") + " -o " + dir.file("q.txt"));
  CHECK(r.status == 2);
  // writing over the input model (which then could not be quantized again) and a percentile out of range
  std::filesystem::copy_file(cfg, dir.file("f.json"));
  r = run_cli("quantize -m " + dir.file("f.json") + " --calib " + dir.file("pat") + " -o " + dir.path + "/./f.json");
  CHECK(r.status == 2);
  CHECK(r.out.find("--out is the input model") != std::string::npos);
  r = run_cli("convert " + dir.file("f.json") + " " + dir.file("f.json"));
  CHECK(r.status == 2);
  CHECK(r.out.find("convert's output is the input model") != std::string::npos);
  CHECK(relpos::detail::read_file(dir.file("f.json")) == relpos::detail::read_file(cfg));
  for (const char* p : {"150", "0", "-1", "nan"}) {
    r = run_cli("quantize -m " + cfg + " --calib " + dir.file("pat") + " -o " + dir.file("q3.json") + " --percentile " + p);
    CHECK(r.status == 2);
    CHECK(r.out.find(std::string("--percentile: must be a number above 0 and at most 100, got ") + p) != std::string::npos);
  }
  r = run_cli("convert " + cfg + " " + dir.file("n.safetensors") + " --numbers");
  CHECK(r.status == 2);
  r = run_cli("convert " + cfg + " " + dir.file("n.txt"));
  CHECK(r.status == 2);
}
