#include "layers/int8_conv.hpp"

#include <algorithm>
#include <cmath>

#include "relpos/error.hpp"

namespace relpos {

QuantizedWeights quantize_per_channel(const Tensor& w_in) {
  RELPOS_CHECK(w_in.ndim() >= 1 && w_in.dim(0) > 0, "quantize_per_channel: weights need an output dimension, got "
                                                         << w_in.describe());
  const Tensor w = w_in.to(Device::CPU).contiguous();
  const std::int64_t out = w.dim(0), per = w.numel() / out;
  QuantizedWeights r{Tensor(w.shape()), Tensor({out})};
  const float* src = w.data();
  float* q = r.q.data();
  float* s = r.scale.data();
  for (std::int64_t o = 0; o < out; ++o) {
    float amax = 0.0f;
    for (std::int64_t i = 0; i < per; ++i) amax = std::max(amax, std::fabs(src[o * per + i]));
    RELPOS_CHECK(std::isfinite(amax), "quantize_per_channel: output channel " << o << " holds a non-finite weight");
    // an all-zero channel (or one so small that its scale would be subnormal, which a model file
    // may not hold): scale 1, every weight 0
    s[o] = ops::usable_int8_scale(amax / 127.0f) ? amax / 127.0f : 1.0f;
    for (std::int64_t i = 0; i < per; ++i)
      q[o * per + i] = std::clamp(std::nearbyint(src[o * per + i] / s[o]), -127.0f, 127.0f);
  }
  return r;
}

Tensor dequantize_per_channel(const Tensor& q_in, const Tensor& scale_in) {
  const Tensor q = q_in.to(Device::CPU).contiguous(), scale = scale_in.to(Device::CPU).contiguous();
  RELPOS_CHECK(q.ndim() >= 1 && scale.numel() == q.dim(0),
               "dequantize_per_channel: " << scale.numel() << " scales for weights " << q.describe());
  Tensor w(q.shape());
  const std::int64_t out = q.dim(0), per = out > 0 ? q.numel() / out : 0;
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < per; ++i) w.data()[o * per + i] = q.data()[o * per + i] * scale.data()[o];
  return w;
}

Int8Conv::Int8Conv(const Tensor& w, const Tensor* bias, Int8Input input) : signed_(input.is_signed) {
  QuantizedWeights qw = quantize_per_channel(w);
  weight_ = std::move(qw.q);
  scale_ = std::move(qw.scale);
  if (bias) bias_ = bias->to(Device::CPU).contiguous().clone();
  input_scale_ = Tensor::full({1}, input.scale);
}

float Int8Conv::input_scale() const { return input_scale_.to_vector()[0]; }

void Int8Conv::collect(const std::string& p, std::vector<ParamRef>& out) {
  ParamRef w{p + "weight", &weight_, nullptr, false};
  w.int8 = true;
  out.push_back(w);
  out.push_back({p + "weight_scale", &scale_, nullptr, true});
  if (bias_.defined()) out.push_back({p + "bias", &bias_, nullptr, true});
  out.push_back({p + "input_scale", &input_scale_, nullptr, true});
}

ops::Int8ConvWeights Int8Conv::weights() const {
  ops::Int8ConvWeights w;
  w.weight = &weight_;
  w.scale = &scale_;
  w.bias = bias_.defined() ? &bias_ : nullptr;
  RELPOS_CHECK(input_scale_.is_cpu(), "int8 layers run on the CPU only");
  w.input_scale = input_scale_.data()[0];
  w.input_signed = signed_;
  return w;
}

Tensor Int8Conv::infer(const Tensor& x, const ops::ConvSpec& spec, const ops::Epilogue& ep) const {
  return ops::conv2d_int8(x, weights(), spec, ep, &cache_);
}

ops::QuantizedTensor Int8Conv::quantize(const Tensor& x) const {
  return ops::quantize_activation(x, input_scale(), signed_);
}

Tensor Int8Conv::infer(const ops::QuantizedTensor& x, const ops::ConvSpec& spec, const ops::Epilogue& ep) const {
  return ops::conv2d_int8(x, weights(), spec, ep, &cache_);
}

ops::QuantizedTensor Int8Conv::infer_requantized(const ops::QuantizedTensor& x, const ops::ConvSpec& spec,
                                                 const Int8Conv& next, const ops::Residual& residual) const {
  RELPOS_CHECK(!next.input_signed(), "internal: requantizing for a layer that takes s8");
  return ops::conv2d_int8_requantized(x, weights(), spec, Act::ReLU, next.input_scale(), residual, &cache_);
}

}  // namespace relpos
