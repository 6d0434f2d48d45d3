#include <cstdlib>
#include <cstring>

#include "core/environment.hpp"
#include "layers/activation_observer.hpp"
#include "layers/blocks.hpp"
#include "relpos/error.hpp"

namespace relpos {

namespace {

// Whether a block runs conv3 and its projection shortcut as one convolution over both inputs
// (ResidualBlock::merged_w_). oneDNN's 1x1 convolutions of stride 2 read their input at a stride;
// from 256 input channels on, gathering the shortcut's pixels next to conv3's input and running
// one convolution is faster (tools/bench/README.md, 2026-11-26: botnet26t_256's stage 2.0 1.10x to
// 1.18x at batch 1 and 8, stage 3.0 1.02x to 1.07x at batch 1; stage 1.0, 256 channels, 1.02x to
// 1.06x once 1x1 convolutions fold the batch into the height); at stride 1 it is not (0.84x at batch
// 8). RELPOS_MERGE_SHORTCUT=1 merges every projection shortcut, 0 none (for tests and measurements).
bool merges_shortcut(int in_channels, int stride) {
  static const char* env = detail::setting("RELPOS_MERGE_SHORTCUT");
  if (env && std::strcmp(env, "1") == 0) return true;
  if (env && std::strcmp(env, "0") == 0) return false;
  return stride == 2 && in_channels >= 256;
}

}  // namespace

int make_divisible(double v, int divisor) {
  int nv = std::max(divisor, static_cast<int>(v + divisor / 2.0) / divisor * divisor);
  if (nv < 0.9 * v) nv += divisor;
  return nv;
}

HeadDims head_dims(int mid, int heads, double qk_ratio, const std::string& where) {
  RELPOS_CHECK(heads >= 1 && mid % heads == 0,
               where << ": " << mid << " attention channels do not split into " << heads << " heads");
  return {make_divisible(mid * qk_ratio) / heads, mid / heads};
}

ResidualBlock::ResidualBlock(int in, int mid, int out, int stride, Act act) : act_(act) {
  if (in != out || stride != 1) shortcut_ = std::make_unique<ConvNormAct>(in, out, 1, stride, 1, Act::None);
  conv1_ = std::make_unique<ConvNormAct>(in, mid, 1, 1, 1, act);
  conv3_ = std::make_unique<ConvNormAct>(mid, out, 1, 1, 1, Act::None);
}

void ResidualBlock::collect(const std::string& p, std::vector<ParamRef>& out) {
  if (shortcut_) shortcut_->collect(p + "shortcut.", out);
  conv1_->collect(p + "conv1_1x1.", out);
  for (auto& [name, m] : body()) m->collect(p + name + ".", out);
  conv3_->collect(p + "conv3_1x1.", out);
}

void ResidualBlock::init(Init& init, bool zero_init_last) {
  if (shortcut_) shortcut_->init(init, false);
  conv1_->init(init, false);
  conv3_->init(init, zero_init_last);
}

Tensor ResidualBlock::infer(const Tensor& x) const { return infer_recording(x, nullptr, nullptr); }

Tensor ResidualBlock::infer_attention(const Tensor& x, const std::string& prefix, std::vector<AttentionMaps>& maps) const {
  return infer_recording(x, &prefix, &maps);
}

Tensor ResidualBlock::infer_recording(const Tensor& x, const std::string* prefix, std::vector<AttentionMaps>* maps,
                                      bool input_is_scratch) const {
  if (!maps && conv1_->int8()) return infer_flow({x, {}}, nullptr).f;
  // conv3 and the shortcut merged: not while calibration observes each layer's own input, nor once
  // either layer runs in int8
  const bool merged = merged_w_.defined() && merged_w_.device() == x.device() && !detail::observing() &&
                      !shortcut_->int8() && !conv3_->int8();
  const Tensor sc = shortcut_ && !merged ? shortcut_->infer(x) : x;
  Tensor h = conv1_->infer(x);
  if (maps) {
    for (auto& [name, m] : body()) h = m->infer_attention(h, *prefix + name + ".", *maps);
  } else {
    h = infer_body(h);
  }
  if (merged) {
    const ops::ConvSpec one{1, 0};
    return ops::conv2d(ops::concat_channels(h, x, shortcut_->stride()), merged_w_, &merged_b_, one, {nullptr, act_},
                       &merged_cache_);
  }
  // a projection shortcut's output is ours, and so is the input the caller handed over: conv3 adds
  // onto it in place (conv1 and the shortcut have read the input by now)
  return conv3_->infer(h, &sc, act_, shortcut_ != nullptr || input_is_scratch);
}

Tensor ResidualBlock::infer_body(const Tensor& h) const {
  Tensor out = h;
  for (auto& [name, m] : body()) out = m->infer(out);
  return out;
}

const Int8Conv* ResidualBlock::u8_input() const {
  const Int8Conv* c = conv1_->int8();
  return c && !c->input_signed() ? c : nullptr;
}

BlockFlow ResidualBlock::infer_flow(const BlockFlow& in, const Int8Conv* next, bool input_is_scratch) const {
  RELPOS_CHECK(in.f.defined() || u8_input(), "internal: a u8 input for a block that does not take one");
  if (!conv1_->int8()) return {infer_recording(in.f, nullptr, nullptr, input_is_scratch), {}};
  // the block input quantized once, for conv1 and for an int8 shortcut that takes the same
  const ops::QuantizedTensor qx = in.q.defined() ? in.q : conv1_->quantize_input(in.f);
  Tensor x = in.f;  // float32, made from the u8 input only where a float32 layer needs it
  auto float_input = [&]() -> const Tensor& {
    if (!x.defined()) x = ops::dequantize_activation(qx);
    return x;
  };
  const BlockFlow body = infer_body_int8(qx);
  auto conv3_input = [&] { return body.q.defined() ? body.q : conv3_->quantize_input(body.f); };
  const bool u8_out = next && act_ == Act::ReLU && conv3_->int8() && !next->input_signed();
  // u8 out, identity shortcut: conv3's sum post-op adds the block's u8 input
  if (u8_out && !shortcut_ && !qx.is_signed)
    return {Tensor(), conv3_->infer_requantized_sum(conv3_input(), {&qx, nullptr}, act_, *next)};
  Tensor sc;
  if (shortcut_) {
    const Int8Conv* s = shortcut_->int8();
    const bool shared = s && s->input_scale() == qx.scale && s->input_signed() == qx.is_signed;
    sc = shared ? shortcut_->infer(qx) : shortcut_->infer(float_input());
  } else {
    sc = float_input();
  }
  // u8 out, projection shortcut: conv3 adds its float32 output by a binary post-op
  if (u8_out && shortcut_) return {Tensor(), conv3_->infer_requantized_sum(conv3_input(), {nullptr, &sc}, act_, *next)};
  // conv3 adds onto the shortcut's output in place when nobody else holds it (not the caller's input,
  // unless the caller handed it over)
  const bool own = shortcut_ != nullptr || !in.f.defined() || input_is_scratch;
  if (body.q.defined()) return {conv3_->infer(body.q, &sc, act_, own), {}};
  return {conv3_->infer(body.f, &sc, act_, own), {}};
}

Tensor ResidualBlock::forward(const Tensor& x) {
  // ReLU's gradient mask can come from its output, so conv3's batch norm (and a projection
  // shortcut's), the add and the ReLU run as one op; other activations keep the sum for their
  // backward.
  if (act_ == Act::ReLU) {
    Tensor h = conv1_->forward(x);
    for (auto& [name, m] : body()) h = m->forward(h);
    return sum_ = shortcut_ ? conv3_->forward_add(h, *shortcut_, x, Act::ReLU) : conv3_->forward_add(h, x, Act::ReLU);
  }
  const Tensor sc = shortcut_ ? shortcut_->forward(x) : x;
  Tensor h = conv1_->forward(x);
  for (auto& [name, m] : body()) h = m->forward(h);
  sum_ = ops::add(conv3_->forward(h), sc);
  return ops::activation(sum_, act_);
}

Tensor ResidualBlock::backward(const Tensor& dy) {
  auto [dh, dsc] = backward_terms(dy, Tensor());
  ops::add_inplace(dh, dsc);
  return dh;
}

std::pair<Tensor, Tensor> ResidualBlock::backward_terms(const Tensor& dy, const Tensor& dy2) {
  RELPOS_CHECK(sum_.defined(), "internal: backward() without forward()");
  // for ReLU sum_ is the output: the same mask, applied in conv3's batch-norm backward
  Tensor ds, dh;
  if (act_ == Act::ReLU) {
    dh = conv3_->backward_relu_sum(sum_, dy, dy2, ds);
  } else {
    ds = ops::activation_backward_sum(sum_, dy, dy2, act_);
    dh = conv3_->backward(ds);
  }
  const auto layers = body();
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) dh = it->second->backward(dh);
  dh = conv1_->backward(dh);
  return {dh, shortcut_ ? shortcut_->backward(ds) : ds};
}

void ResidualBlock::prepare_inference() {
  if (shortcut_) shortcut_->prepare_inference();
  conv1_->prepare_inference();
  for (auto& [name, m] : body()) m->prepare_inference();
  conv3_->prepare_inference();
  merged_w_ = merged_b_ = Tensor();
  merged_cache_.clear();
  if (!shortcut_ || !shortcut_->folded_weight().defined() || !conv3_->folded_weight().defined() ||
      !shortcut_->folded_weight().is_cpu() || !merges_shortcut(shortcut_->in_channels(), shortcut_->stride()))
    return;
  // [W3 | Wsc] per output channel, b3 + bsc
  const std::vector<float> w3 = conv3_->folded_weight().to_vector(), ws = shortcut_->folded_weight().to_vector();
  const std::vector<float> b3 = conv3_->folded_bias().to_vector(), bs = shortcut_->folded_bias().to_vector();
  const std::size_t out = b3.size(), mid = w3.size() / out, in = ws.size() / out;
  std::vector<float> w(out * (mid + in)), b(out);
  for (std::size_t o = 0; o < out; ++o) {
    std::copy(w3.begin() + o * mid, w3.begin() + (o + 1) * mid, w.begin() + o * (mid + in));
    std::copy(ws.begin() + o * in, ws.begin() + (o + 1) * in, w.begin() + o * (mid + in) + mid);
    b[o] = b3[o] + bs[o];
  }
  const auto n = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  merged_w_ = Tensor::from_vector({n(out), n(mid + in), 1, 1}, w);
  merged_b_ = Tensor::from_vector({n(out)}, b);
}

void ResidualBlock::quantizables(std::vector<Quantizable*>& out) {
  if (shortcut_) shortcut_->quantizables(out);
  conv1_->quantizables(out);
  for (auto& [name, m] : body()) m->quantizables(out);
  conv3_->quantizables(out);
}

void ResidualBlock::release_saved() {
  sum_ = Tensor();
  if (shortcut_) shortcut_->release_saved();
  conv1_->release_saved();
  for (auto& [name, m] : body()) m->release_saved();
  conv3_->release_saved();
}

Shape ResidualBlock::summarize(const std::string& p, const Shape& in, std::vector<LayerRow>* rows) const {
  const Shape sc = shortcut_ ? shortcut_->summarize(p + "shortcut.", in, rows) : in;
  Shape s = conv1_->summarize(p + "conv1_1x1.", in, rows);
  for (auto& [name, m] : body()) s = m->summarize(p + name + ".", s, rows);
  s = conv3_->summarize(p + "conv3_1x1.", s, rows);
  // a stride-2 attention pools 2x2 (an odd side rounds down) where a stride-2 shortcut rounds up
  RELPOS_CHECK(sc[2] == s[2] && sc[3] == s[3],
               p.substr(0, p.size() - 1) << " gets a " << in[2] << "x" << in[3] << " map, which its body takes to "
                                         << s[2] << "x" << s[3] << " and its shortcut to " << sc[2] << "x" << sc[3]
                                         << ": a stride-2 attention block needs even sides");
  return s;
}

}  // namespace relpos
