#include "layers/attention_layers.hpp"

#include <algorithm>
#include <cmath>

#include "core/ops_internal.hpp"
#include "layers/activation_observer.hpp"
#include "relpos/error.hpp"

namespace relpos {

namespace {
const ops::PoolSpec kPool2x2{ops::PoolKind::Avg, 2, 2, 0};
}  // namespace

QkvAttention::QkvAttention(int dim, int qkv_channels, int stride) : dim_(dim), stride_(stride) {
  RELPOS_CHECK(stride == 1 || stride == 2, "self-attention stride must be 1 or 2, got " << stride);
  qkv_w_ = Tensor::zeros({qkv_channels, dim, 1, 1});
}

void QkvAttention::collect(const std::string& p, std::vector<ParamRef>& out) {
  qkv_name_ = p + "qkv";
  if (int8_) int8_->collect(p + "qkv.", out);
  else out.push_back({p + "qkv.weight", &qkv_w_, &dqkv_w_, false});
  collect_positions(p, out);
}

void QkvAttention::init(Init& init) {
  // timm BottleneckAttn.reset_parameters: qkv trunc_normal(std = fan_in^-0.5)
  init.trunc_normal(qkv_w_, 1.0f / std::sqrt(static_cast<float>(dim_)));
  init_positions(init);
}

Shape QkvAttention::pooled(Shape s) const {
  if (stride_ == 2) s[2] /= 2, s[3] /= 2;
  return s;
}

void QkvAttention::prepare_inference() {
  cache_.clear();
  fold_cache_.clear();
  fold_w_ = fold_b_ = fold_vb_ = Tensor();
  if (int8_) int8_->prepare_inference();
}

void QkvAttention::set_int8(const Int8Input* input) {
  int8_.reset();
  cache_.clear();
  if (input) int8_ = std::make_unique<Int8Conv>(qkv_w_, nullptr, *input);
}

std::string QkvAttention::int8_tag() const {
  if (!int8_) return "";
  return int8_->input_signed() ? " qkv int8 (s8 in)" : " qkv int8 (u8 in)";
}

Tensor QkvAttention::project(const Tensor& x) const {
  if (int8_) return int8_->infer(x, {}, {});
  detail::observe_input(qkv_name_, x);
  return ops::conv2d(x, qkv_w_, nullptr, {}, {}, &cache_);
}

Tensor QkvAttention::infer(const Tensor& x) const {
  const Tensor att = attend(project(x), nullptr);
  return stride_ == 2 ? ops::pool2d(att, kPool2x2) : att;
}

void QkvAttention::fold_norm(const std::vector<float>& scale, const std::vector<float>& shift) {
  const std::int64_t rows = qkv_w_.dim(0), first_v = rows - static_cast<std::int64_t>(scale.size());
  RELPOS_CHECK(scale.size() == shift.size() && first_v >= 0, "internal: " << qkv_name_ << ": the folded norm has "
                                                                         << scale.size() << " channels");
  std::vector<float> w = qkv_w_.to(Device::CPU).contiguous().to_vector(), b(static_cast<std::size_t>(rows), 0.0f);
  const std::size_t in = static_cast<std::size_t>(dim_);
  for (std::size_t c = 0; c < scale.size(); ++c) {  // output channel c is value channel c
    const std::size_t row = static_cast<std::size_t>(first_v) + c;
    for (std::size_t i = 0; i < in; ++i) w[row * in + i] *= scale[c];
    b[row] = shift[c];
  }
  fold_w_ = Tensor::from_vector(qkv_w_.shape(), w).to(qkv_w_.device());
  fold_b_ = Tensor::from_vector({rows}, b).to(qkv_w_.device());
  fold_vb_ = Tensor::from_vector({static_cast<std::int64_t>(shift.size())}, shift).to(qkv_w_.device());
  fold_cache_.clear();
}

Tensor QkvAttention::infer_folded(const Tensor& x, Act act) const {
  RELPOS_CHECK(folded(), "internal: " << qkv_name_ << " has no folded norm");
  detail::observe_input(qkv_name_, x);  // (int8 calibration sees the projection's input as in infer())
  const Tensor fused = attend_projected(x, fold_w_, fold_vb_, act, &fold_cache_);
  if (fused.defined()) return fused;
  const Tensor qkv = ops::conv2d(x, fold_w_, &fold_b_, {}, {}, &fold_cache_);
  if (stride_ == 1) return attend_act(qkv, act);
  return ops::activation(ops::pool2d(attend(qkv, nullptr), kPool2x2), act);  // the activation after the pool
}

Tensor QkvAttention::infer(const ops::QuantizedTensor& x) const {
  RELPOS_CHECK(int8_, "internal: " << qkv_name_ << " is not int8");
  const Tensor att = attend(int8_->infer(x, {}, {}), nullptr);
  return stride_ == 2 ? ops::pool2d(att, kPool2x2) : att;
}

Tensor QkvAttention::infer_attention(const Tensor& x, const std::string& prefix, std::vector<AttentionMaps>& maps) const {
  const Tensor qkv = project(x);
  Tensor probs;
  const Tensor att = attend(qkv, &probs);
  AttentionMaps m;
  m.layer = prefix.substr(0, prefix.size() - 1);
  m.height = static_cast<int>(qkv.dim(2));
  m.width = static_cast<int>(qkv.dim(3));
  m.qkv = qkv.to(Device::CPU).contiguous();
  m.out = att.to(Device::CPU).contiguous();
  describe(m, probs.to(Device::CPU).contiguous());
  maps.push_back(std::move(m));
  return stride_ == 2 ? ops::pool2d(att, kPool2x2) : att;
}

Tensor QkvAttention::forward(const Tensor& x) {
  RELPOS_CHECK(!int8_, qkv_name_ << ": an int8 layer cannot be trained (train the float model, then quantize it)");
  x_ = x;
  qkv_ = ops::conv2d(x, qkv_w_, nullptr, {});
  att_ = attend(qkv_, &probs_);
  return stride_ == 2 ? ops::pool2d(att_, kPool2x2) : att_;
}

Tensor QkvAttention::backward(const Tensor& dy) {
  RELPOS_CHECK(x_.defined(), "internal: backward() without forward()");
  const Tensor datt = stride_ == 2 ? ops::pool2d_backward(att_, dy, kPool2x2) : dy;
  ops::ConvGrads cg = ops::conv2d_backward(x_, qkv_w_, attend_backward(qkv_, probs_, datt), {}, true);
  dqkv_w_ = cg.dw;
  return cg.dx;
}

void QkvAttention::release_saved() { x_ = qkv_ = probs_ = att_ = Tensor(); }

BotAttention::BotAttention(int dim, const BotAttnSpec& spec, int feat_h, int feat_w, int stride)
    : QkvAttention(dim, spec.channels_qkv(), stride), spec_(spec) {
  RELPOS_CHECK(spec.heads > 0 && spec.dqk > 0 && spec.dv > 0, "bad attention spec");
  const auto lead = [&](std::int64_t rows) {
    return spec.per_head ? Shape{spec.heads, rows, spec.dqk} : Shape{rows, spec.dqk};
  };
  if (spec.pos == PosEncoding::Relative) {
    RELPOS_CHECK(spec.clip > 0 || (feat_h > 0 && feat_w > 0),
                 "relative attention without clip needs the feature size (model input_size)");
    pos_h_ = Tensor::zeros(lead(spec.clip > 0 ? 2 * spec.clip + 1 : 2 * feat_h - 1));
    pos_w_ = Tensor::zeros(lead(spec.clip > 0 ? 2 * spec.clip + 1 : 2 * feat_w - 1));
    if (spec.clip == 0) map_h_ = feat_h, map_w_ = feat_w;
  } else if (spec.pos == PosEncoding::Absolute) {
    RELPOS_CHECK(feat_h > 0 && feat_w > 0, "absolute position embeddings need the feature size (model input_size)");
    pos_h_ = Tensor::zeros(lead(static_cast<std::int64_t>(feat_h) * feat_w));
    map_h_ = feat_h, map_w_ = feat_w;
  }
}

void BotAttention::collect_positions(const std::string& p, std::vector<ParamRef>& out) {
  if (spec_.pos == PosEncoding::Relative) {
    out.push_back({p + "pos_embed.height_rel", &pos_h_, &dpos_h_, true});
    out.push_back({p + "pos_embed.width_rel", &pos_w_, &dpos_w_, true});
  } else if (spec_.pos == PosEncoding::Absolute) {
    out.push_back({p + "pos_embed.abs", &pos_h_, &dpos_h_, true});
  }
}

void BotAttention::init_positions(Init& init) {
  // timm: trunc_normal(std = dqk^-0.5)
  if (pos_h_.defined()) init.trunc_normal(pos_h_, spec_.scale());
  if (pos_w_.defined()) init.trunc_normal(pos_w_, spec_.scale());
}

Tensor BotAttention::attend(const Tensor& qkv, Tensor* probs) const {
  return ops::bot_attention(qkv, pos_h_, pos_w_, spec_, probs);
}

void BotAttention::describe(AttentionMaps& m, const Tensor& probs) const {
  m.kind = AttentionKind::Global;
  m.bot = spec_;
  m.probs = probs;  // (B, heads, N, N) already
  if (pos_h_.defined()) m.pos_h = pos_h_.to(Device::CPU).contiguous().clone();
  if (pos_w_.defined()) m.pos_w = pos_w_.to(Device::CPU).contiguous().clone();
}

Tensor BotAttention::attend_backward(const Tensor& qkv, const Tensor& probs, const Tensor& datt) {
  ops::BotAttnGrads g = ops::bot_attention_backward(qkv, pos_h_, pos_w_, spec_, probs, datt);
  dpos_h_ = g.dpos_h;
  dpos_w_ = g.dpos_w;
  return g.dqkv;
}

Shape BotAttention::summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const {
  RELPOS_CHECK(in.size() == 4 && in[1] == dim_, prefix << ": expects " << dim_ << " channels");
  RELPOS_CHECK(map_h_ == 0 || (in[2] == map_h_ && in[3] == map_w_),
               prefix.substr(0, prefix.size() - 1) << " gets a " << in[2] << "x" << in[3] << " map, but its position tables fit "
                                                   << map_h_ << "x" << map_w_ << " only");
  const Shape out = pooled({in[0], spec_.channels_out(), in[2], in[3]});
  if (rows) {
    const std::int64_t n = in[2] * in[3], b = in[0];
    const std::int64_t params = qkv_params() + (pos_h_.defined() ? pos_h_.numel() : 0) + (pos_w_.defined() ? pos_w_.numel() : 0);
    std::int64_t macs = b * n * dim_ * spec_.channels_qkv() + b * spec_.heads * n * n * (spec_.dqk + spec_.dv);
    if (spec_.pos == PosEncoding::Relative) {
      const std::int64_t th = spec_.clip > 0 ? 2 * spec_.clip + 1 : 2 * in[2] - 1;
      const std::int64_t tw = spec_.clip > 0 ? 2 * spec_.clip + 1 : 2 * in[3] - 1;
      macs += b * spec_.heads * n * (th + tw) * spec_.dqk;
    }
    rows->push_back({prefix.substr(0, prefix.size() - 1),
                     "bot_attn(" + std::to_string(spec_.heads) + "h," + to_string(spec_.pos) +
                         (spec_.clip > 0 ? ",clip" + std::to_string(spec_.clip) : "") + ")" +
                         (stride_ == 2 ? "+avgpool" : "") + int8_tag(),
                     out, params, macs});
  }
  return out;
}

SasaAttention::SasaAttention(int dim, const SasaSpec& spec, int stride)
    : QkvAttention(dim, spec.channels_qkv(), stride), spec_(spec) {
  RELPOS_CHECK(spec.dqk % 2 == 0 && spec.kernel % 2 == 1,
               "local attention needs an even dqk and an odd window, got dqk " << spec.dqk << ", kernel " << spec.kernel);
  r_row_ = Tensor::zeros({spec.kernel, spec.dqk / 2});
  r_col_ = Tensor::zeros({spec.kernel, spec.dqk / 2});
}

void SasaAttention::collect_positions(const std::string& p, std::vector<ParamRef>& out) {
  out.push_back({p + "r_row", &r_row_, &dr_row_, true});
  out.push_back({p + "r_col", &r_col_, &dr_col_, true});
}

void SasaAttention::init_positions(Init& init) {
  init.trunc_normal(r_row_, spec_.scale());
  init.trunc_normal(r_col_, spec_.scale());
}

Tensor SasaAttention::attend(const Tensor& qkv, Tensor* probs) const {
  return ops::sasa_attention(qkv, r_row_, r_col_, spec_, probs);
}

Tensor SasaAttention::attend_act(const Tensor& qkv, Act act) const {
  return ops::sasa_attention(qkv, r_row_, r_col_, spec_, nullptr, act);
}

Tensor SasaAttention::attend_projected(const Tensor& x, const Tensor& w, const Tensor& v_bias, Act act,
                                       OpCache* cache) const {
  // (CUDA, or an odd map to pool: the projection and the op, as before)
  if (!x.is_cpu() || (stride_ == 2 && (x.dim(2) % 2 != 0 || x.dim(3) % 2 != 0))) return Tensor();
  return ops::sasa_projected_attention(x, w, &v_bias, r_row_, r_col_, spec_, act, stride_ == 2, cache);
}

void SasaAttention::describe(AttentionMaps& m, const Tensor& probs) const {
  m.kind = AttentionKind::Local;
  m.sasa = spec_;
  // the op's (B, H, W, heads, k*k) to (B, heads, N, k*k)
  const std::int64_t b = probs.dim(0), n = probs.dim(1) * probs.dim(2), heads = spec_.heads, kk = probs.dim(4);
  m.probs = Tensor({b, heads, n, kk});
  const float* src = probs.data();
  float* dst = m.probs.data();
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t p = 0; p < n; ++p)
      for (std::int64_t h = 0; h < heads; ++h)
        std::copy(src + ((i * n + p) * heads + h) * kk, src + ((i * n + p) * heads + h + 1) * kk,
                  dst + ((i * heads + h) * n + p) * kk);
  m.pos_h = r_row_.to(Device::CPU).contiguous().clone();
  m.pos_w = r_col_.to(Device::CPU).contiguous().clone();
}

Tensor SasaAttention::attend_backward(const Tensor& qkv, const Tensor& probs, const Tensor& datt) {
  ops::SasaGrads g = ops::sasa_attention_backward(qkv, r_row_, r_col_, spec_, probs, datt);
  dr_row_ = g.dr_row;
  dr_col_ = g.dr_col;
  return g.dqkv;
}

Shape SasaAttention::summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const {
  RELPOS_CHECK(in.size() == 4 && in[1] == dim_, prefix << ": expects " << dim_ << " channels");
  const Shape out = pooled({in[0], spec_.channels_out(), in[2], in[3]});
  if (rows) {
    const std::int64_t n = in[2] * in[3], b = in[0], kk = static_cast<std::int64_t>(spec_.kernel) * spec_.kernel;
    rows->push_back({prefix.substr(0, prefix.size() - 1),
                     "sasa(" + std::to_string(spec_.heads) + "h,k" + std::to_string(spec_.kernel) + ")" +
                         (stride_ == 2 ? "+avgpool" : "") + int8_tag(),
                     out, qkv_params() + r_row_.numel() + r_col_.numel(),
                     b * n * dim_ * spec_.channels_qkv() +
                         b * spec_.heads * n * (kk * (spec_.dqk + spec_.dv) + spec_.kernel * spec_.dqk)});
  }
  return out;
}

}  // namespace relpos
