// Internal: timm's ConvNormAct: conv (no bias) -> BatchNorm2d -> activation. Names:
// <p>.conv.weight, <p>.bn.{weight,bias,running_mean,running_var}. For inference the batch norm
// is folded into the convolution's weights and bias, and a residual add and activation can be
// fused into the same oneDNN/cuDNN call.
#pragma once

#include <memory>

#include "core/ops_internal.hpp"
#include "layers/int8_conv.hpp"
#include "layers/module.hpp"

namespace relpos {

// timm's symmetric padding for a kernel and stride
inline int same_padding(int kernel, int stride) { return ((stride - 1) + (kernel - 1)) / 2; }

class ConvNormAct : public Module, public Quantizable {
 public:
  ConvNormAct(int in, int out, int kernel, int stride, int groups, Act act);

  void collect(const std::string& prefix, std::vector<ParamRef>& out) override;
  Tensor infer(const Tensor& x) const override { return infer(x, nullptr, act_); }
  // act(bn(conv(x)) + residual): the residual is added before the activation.
  // act(conv(x) + residual); with overwrite_residual the output may be written over the residual
  // (the caller no longer needs it).
  Tensor infer(const Tensor& x, const Tensor* residual, Act act, bool overwrite_residual = false) const;
  Tensor forward(const Tensor& x) override;
  // Training, a layer without activation: act(bn(conv(x)) + residual), act ReLU or none, the sum
  // and the activation in the batch norm's pass. backward() takes the gradient of the sum.
  Tensor forward_add(const Tensor& x, const Tensor& residual, Act act);
  // The same with a projection shortcut's layer (no activation either): act(bn(conv(x)) +
  // shortcut's bn(conv(shortcut_x))), the shortcut's batch norm folded into this one's pass. Each
  // layer's backward() then takes the gradient of the sum.
  Tensor forward_add(const Tensor& x, ConvNormAct& shortcut, const Tensor& shortcut_x, Act act);
  Tensor backward(const Tensor& dy) override;
  // After forward_add with ReLU, whose output y got the gradient dy_a + dy_b (dy_b may be
  // undefined): the gradient of the sum into ds (the residual's gradient) and backward() of it.
  Tensor backward_relu_sum(const Tensor& y, const Tensor& dy_a, const Tensor& dy_b, Tensor& ds);
  void prepare_inference() override;
  void release_saved() override;
  Shape summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const override;
  void quantizables(std::vector<Quantizable*>& out) override { out.push_back(this); }
  const std::string& layer_name() const override { return name_; }
  void set_int8(const Int8Input* input) override;
  const Int8Conv* int8() const override { return int8_.get(); }
  // int8 layers chained without float32 between them (docs/int8.md): whether this layer can write
  // its output as u8 for `next` (both int8, a ReLU here, u8 input there), and the forms that take
  // or give quantized activations.
  bool can_feed(const Int8Conv* next) const { return int8_ && next && act_ == Act::ReLU && !next->input_signed(); }
  ops::QuantizedTensor quantize_input(const Tensor& x) const;
  Tensor infer(const ops::QuantizedTensor& x, const Tensor* residual, Act act, bool overwrite_residual = false) const;
  Tensor infer(const ops::QuantizedTensor& x) const { return infer(x, nullptr, act_); }
  ops::QuantizedTensor infer_requantized(const ops::QuantizedTensor& x, const Int8Conv& next) const;
  // A block's last convolution: act(conv(x) + bias + residual) as u8 for `next`, the residual u8
  // in its own scale or float32; act must be ReLU (this layer itself has no activation).
  ops::QuantizedTensor infer_requantized_sum(const ops::QuantizedTensor& x, const ops::Residual& residual,
                                             Act act, const Int8Conv& next) const;

  using Module::init;  // the one-argument form stays visible
  void init(Init& init, bool zero_gamma);
  int out_channels() const { return out_; }
  int in_channels() const { return in_; }
  int stride() const { return spec_.stride; }
  // Inference's weights and bias with the batch norm folded in (prepare_inference()).
  const Tensor& folded_weight() const { return folded_w_; }
  const Tensor& folded_bias() const { return folded_b_; }
  // The first layer of a network needs no input gradient.
  void set_need_input_grad(bool need) { need_input_grad_ = need; }

  static constexpr float kEps = 1e-5f;
  static constexpr float kMomentum = 0.1f;

 private:
  // Training: x and conv(x) into x_ and y_ for the batch norm and the backward; before_residual:
  // this layer must have no activation of its own (forward_add's).
  void conv_forward(const Tensor& x, bool before_residual);
  Tensor keep(ops::BatchNormConvGrads g);  // stores the gradients, returns d input
  int in_, out_, kernel_;
  ops::ConvSpec spec_;
  Act act_;
  bool need_input_grad_ = true;
  Tensor weight_, dweight_;
  Tensor gamma_, beta_, mean_, var_, dgamma_, dbeta_;
  Tensor folded_w_, folded_b_;  // inference weights
  std::string name_;              // set by collect()
  std::unique_ptr<Int8Conv> int8_;  // int8 inference, when set
  mutable OpCache cache_;
  // saved by forward()
  Tensor x_, y_;
  ops::BatchStats stats_;
};

// timm's BatchNormAct2d (post_attn): names <p>.{weight,bias,running_mean,running_var}.
// Inference's batch norm as y = scale * x + shift per channel: scale = gamma / sqrt(var + eps),
// shift = beta - mean * scale, from the running statistics (float32, as folded into convolutions).
void batchnorm_affine(const Tensor& gamma, const Tensor& beta, const Tensor& mean, const Tensor& var,
                      std::vector<float>& scale, std::vector<float>& shift);

class BatchNormAct : public Module {
 public:
  BatchNormAct(int channels, Act act);
  void collect(const std::string& prefix, std::vector<ParamRef>& out) override;
  Tensor infer(const Tensor& x) const override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  void release_saved() override;
  Shape summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const override;
  // Inference's y = act(scale * x + shift) (batchnorm_affine).
  void affine(std::vector<float>& scale, std::vector<float>& shift) const;
  Act act() const { return act_; }

 private:
  int channels_;
  Act act_;
  Tensor gamma_, beta_, mean_, var_, dgamma_, dbeta_;
  Tensor x_;
  ops::BatchStats stats_;
};

}  // namespace relpos
