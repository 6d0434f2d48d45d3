#include "layers/conv_norm_act.hpp"

#include <cmath>

#include "layers/activation_observer.hpp"
#include "relpos/error.hpp"

namespace relpos {

ConvNormAct::ConvNormAct(int in, int out, int kernel, int stride, int groups, Act act)
    : in_(in), out_(out), kernel_(kernel), act_(act) {
  RELPOS_CHECK(in > 0 && out > 0 && kernel > 0 && stride > 0 && groups > 0 && in % groups == 0 && out % groups == 0,
               "bad convolution: " << in << " -> " << out << " channels, kernel " << kernel << ", stride " << stride
                                   << ", groups " << groups);
  spec_.stride = stride;
  spec_.pad = same_padding(kernel, stride);
  spec_.groups = groups;
  weight_ = Tensor::zeros({out, in / groups, kernel, kernel});
  gamma_ = Tensor::full({out}, 1.0f);
  beta_ = Tensor::zeros({out});
  mean_ = Tensor::zeros({out});
  var_ = Tensor::full({out}, 1.0f);
}

void ConvNormAct::collect(const std::string& p, std::vector<ParamRef>& out) {
  name_ = p.substr(0, p.size() - 1);
  if (int8_) return int8_->collect(p + "conv.", out);
  out.push_back({p + "conv.weight", &weight_, &dweight_, false});
  out.push_back({p + "bn.weight", &gamma_, &dgamma_, true});
  out.push_back({p + "bn.bias", &beta_, &dbeta_, true});
  out.push_back({p + "bn.running_mean", &mean_, nullptr, true});
  out.push_back({p + "bn.running_var", &var_, nullptr, true});
}

void ConvNormAct::init(Init& init, bool zero_gamma) {
  // timm byobnet: normal(0, sqrt(2 / fan_out)), fan_out = k*k*out/groups; BN ones/zeros.
  const float fan_out = static_cast<float>(kernel_ * kernel_ * out_ / spec_.groups);
  init.normal(weight_, std::sqrt(2.0f / fan_out));
  Init::constant(gamma_, zero_gamma ? 0.0f : 1.0f);
  Init::constant(beta_, 0.0f);
  Init::constant(mean_, 0.0f);
  Init::constant(var_, 1.0f);
}

void ConvNormAct::set_int8(const Int8Input* input) {
  int8_.reset();
  prepare_inference();  // folds the batch norm of the current weights
  if (input) int8_ = std::make_unique<Int8Conv>(folded_w_, &folded_b_, *input);
}

void batchnorm_affine(const Tensor& gamma, const Tensor& beta, const Tensor& mean, const Tensor& var,
                      std::vector<float>& scale, std::vector<float>& shift) {
  const auto g = gamma.to(Device::CPU).to_vector(), b = beta.to(Device::CPU).to_vector();
  const auto m = mean.to(Device::CPU).to_vector(), v = var.to(Device::CPU).to_vector();
  scale.resize(g.size());
  shift.resize(g.size());
  for (std::size_t c = 0; c < g.size(); ++c) {
    scale[c] = g[c] / std::sqrt(v[c] + ConvNormAct::kEps);
    shift[c] = b[c] - m[c] * scale[c];
  }
}

void ConvNormAct::prepare_inference() {
  if (int8_) return int8_->prepare_inference();
  // w' = w * g / sqrt(v + eps), b' = beta - mean * g / sqrt(v + eps)
  const auto w = weight_.to_vector();
  std::vector<float> scale, fb;
  batchnorm_affine(gamma_, beta_, mean_, var_, scale, fb);
  std::vector<float> fw(w.size());
  const std::size_t per = w.size() / static_cast<std::size_t>(out_);
  for (std::size_t o = 0; o < fb.size(); ++o)
    for (std::size_t i = 0; i < per; ++i) fw[o * per + i] = w[o * per + i] * scale[o];
  folded_w_ = Tensor::from_vector(weight_.shape(), fw).to(weight_.device());
  folded_b_ = Tensor::from_vector({out_}, fb).to(weight_.device());
  cache_.clear();
}

Tensor ConvNormAct::infer(const Tensor& x, const Tensor* residual, Act act, bool overwrite_residual) const {
  if (int8_) return int8_->infer(x, spec_, {residual, act, overwrite_residual});
  detail::observe_input(name_, x);
  RELPOS_CHECK(folded_w_.defined(), "internal: prepare_inference() was not called");
  return ops::conv2d(x, folded_w_, &folded_b_, spec_, {residual, act, overwrite_residual}, &cache_);
}

ops::QuantizedTensor ConvNormAct::quantize_input(const Tensor& x) const {
  RELPOS_CHECK(int8_, "internal: " << name_ << " is not int8");
  return int8_->quantize(x);
}

Tensor ConvNormAct::infer(const ops::QuantizedTensor& x, const Tensor* residual, Act act,
                          bool overwrite_residual) const {
  RELPOS_CHECK(int8_, "internal: " << name_ << " is not int8");
  return int8_->infer(x, spec_, {residual, act, overwrite_residual});
}

ops::QuantizedTensor ConvNormAct::infer_requantized(const ops::QuantizedTensor& x, const Int8Conv& next) const {
  RELPOS_CHECK(can_feed(&next), "internal: " << name_ << " cannot write u8 for the next layer");
  return int8_->infer_requantized(x, spec_, next);
}

ops::QuantizedTensor ConvNormAct::infer_requantized_sum(const ops::QuantizedTensor& x, const ops::Residual& residual,
                                                        Act act, const Int8Conv& next) const {
  RELPOS_CHECK(int8_ && act == Act::ReLU && !next.input_signed(),
               "internal: " << name_ << " cannot write its sum as u8 for the next layer");
  return int8_->infer_requantized(x, spec_, next, residual);
}

void ConvNormAct::conv_forward(const Tensor& x, bool before_residual) {
  RELPOS_CHECK(!int8_, name_ << ": an int8 layer cannot be trained (train the float model, then quantize it)");
  RELPOS_CHECK(!before_residual || act_ == Act::None,
               "internal: " << name_ << " adds a residual after its own activation");
  x_ = x;
  y_ = ops::conv2d(x, weight_, nullptr, spec_);
}

Tensor ConvNormAct::forward(const Tensor& x) {
  conv_forward(x, false);
  return ops::batchnorm_train(y_, gamma_, beta_, mean_, var_, kEps, kMomentum, act_, stats_);
}

Tensor ConvNormAct::forward_add(const Tensor& x, const Tensor& residual, Act act) {
  conv_forward(x, true);
  return ops::batchnorm_train_add(y_, gamma_, beta_, mean_, var_, kEps, kMomentum, residual, act, stats_);
}

Tensor ConvNormAct::forward_add(const Tensor& x, ConvNormAct& shortcut, const Tensor& shortcut_x, Act act) {
  shortcut.conv_forward(shortcut_x, true);
  conv_forward(x, true);
  return ops::batchnorm_train_add_normed(y_, gamma_, beta_, mean_, var_, stats_, shortcut.y_, shortcut.gamma_,
                                         shortcut.beta_, shortcut.mean_, shortcut.var_, shortcut.stats_, kEps,
                                         kMomentum, act);
}

Tensor ConvNormAct::backward(const Tensor& dy) {
  RELPOS_CHECK(x_.defined(), "internal: backward() without forward()");
  return keep(ops::batchnorm_conv_backward(y_, gamma_, stats_, dy, x_, weight_, spec_, need_input_grad_));
}

Tensor ConvNormAct::backward_relu_sum(const Tensor& y, const Tensor& dy_a, const Tensor& dy_b, Tensor& ds) {
  RELPOS_CHECK(x_.defined(), "internal: backward() without forward()");
  return keep(ops::batchnorm_relu_sum_conv_backward(y_, gamma_, stats_, y, dy_a, dy_b, ds, x_, weight_, spec_,
                                                    need_input_grad_));
}

Tensor ConvNormAct::keep(ops::BatchNormConvGrads g) {
  dgamma_ = std::move(g.dgamma);
  dbeta_ = std::move(g.dbeta);
  dweight_ = std::move(g.dw);
  return g.dx;
}

void ConvNormAct::release_saved() {
  x_ = y_ = Tensor();
  stats_ = {};
}

Shape ConvNormAct::summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const {
  RELPOS_CHECK(in.size() == 4 && in[1] == in_, prefix << ": expects " << in_ << " input channels, got shape "
                                                      << to_string(in));
  const std::int64_t oh = (in[2] + 2 * spec_.pad - kernel_) / spec_.stride + 1;
  const std::int64_t ow = (in[3] + 2 * spec_.pad - kernel_) / spec_.stride + 1;
  Shape out{in[0], out_, oh, ow};
  if (rows) {
    const std::int64_t params = int8_ ? int8_->params() : weight_.numel() + 2 * out_;
    const std::int64_t macs = weight_.numel() * oh * ow * in[0];
    rows->push_back({prefix.substr(0, prefix.size() - 1),
                     "conv" + std::to_string(kernel_) + "x" + std::to_string(kernel_) + "/" +
                         std::to_string(spec_.stride) + "+bn" + (act_ == Act::None ? "" : "+" + to_string(act_)) +
                         (int8_ ? (int8_->input_signed() ? " int8 (s8 in)" : " int8 (u8 in)") : ""),
                     out, params, macs});
  }
  return out;
}

BatchNormAct::BatchNormAct(int channels, Act act) : channels_(channels), act_(act) {
  gamma_ = Tensor::full({channels}, 1.0f);
  beta_ = Tensor::zeros({channels});
  mean_ = Tensor::zeros({channels});
  var_ = Tensor::full({channels}, 1.0f);
}

void BatchNormAct::collect(const std::string& p, std::vector<ParamRef>& out) {
  out.push_back({p + "weight", &gamma_, &dgamma_, true});
  out.push_back({p + "bias", &beta_, &dbeta_, true});
  out.push_back({p + "running_mean", &mean_, nullptr, true});
  out.push_back({p + "running_var", &var_, nullptr, true});
}

Tensor BatchNormAct::infer(const Tensor& x) const {
  return ops::batchnorm_infer(x, gamma_, beta_, mean_, var_, ConvNormAct::kEps, act_);
}

void BatchNormAct::affine(std::vector<float>& scale, std::vector<float>& shift) const {
  batchnorm_affine(gamma_, beta_, mean_, var_, scale, shift);
}

Tensor BatchNormAct::forward(const Tensor& x) {
  x_ = x;
  return ops::batchnorm_train(x, gamma_, beta_, mean_, var_, ConvNormAct::kEps, ConvNormAct::kMomentum, act_, stats_);
}

Tensor BatchNormAct::backward(const Tensor& dy) {
  RELPOS_CHECK(x_.defined(), "internal: backward() without forward()");
  ops::BatchNormGrads bn = ops::batchnorm_backward(x_, gamma_, stats_, dy);
  dgamma_ = bn.dgamma;
  dbeta_ = bn.dbeta;
  return bn.dx;
}

void BatchNormAct::release_saved() {
  x_ = Tensor();
  stats_ = {};
}

Shape BatchNormAct::summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const {
  RELPOS_CHECK(in.size() == 4 && in[1] == channels_, prefix << ": expects " << channels_ << " channels");
  if (rows)
    rows->push_back({prefix.substr(0, prefix.size() - 1), "bn" + (act_ == Act::None ? std::string() : "+" + to_string(act_)),
                     in, 2 * channels_, 0});
  return in;
}

}  // namespace relpos
