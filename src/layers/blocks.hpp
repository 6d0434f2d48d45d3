// Internal: timm byobnet's residual blocks.
//  ResidualBlock: out = act(conv3_1x1(body(x)) + shortcut(x)); the shortcut is identity when
//  channels and stride are unchanged, else a 1x1 ConvNormAct (no act) with the block's stride.
//  BottleneckBlock (type "bottle"): body = conv1_1x1 -> conv2_kxk (3x3, stride).
//  SelfAttnBlock (types "self_attn", "sasa"): body = conv1_1x1 -> self_attn -> post_attn (BN+act).
#pragma once

#include <memory>
#include <utility>

#include "layers/conv_norm_act.hpp"

namespace relpos {

class ResidualBlock : public Module {
 public:
  ResidualBlock(int in, int mid, int out, int stride, Act act);

  void collect(const std::string& prefix, std::vector<ParamRef>& out) override;
  Tensor infer(const Tensor& x) const override;
  Tensor infer_attention(const Tensor& x, const std::string& prefix, std::vector<AttentionMaps>& maps) const override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  // backward() with the output gradient given as two terms, dy + dy2 (dy2 may be undefined), and the
  // input gradient returned as two terms likewise (the body's and the shortcut's), not yet added:
  // a chain of blocks adds each pair inside the next activation's backward, in one pass
  // (ops::activation_backward_sum).
  std::pair<Tensor, Tensor> backward_terms(const Tensor& dy, const Tensor& dy2);
  void prepare_inference() override;
  void release_saved() override;
  Shape summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const override;
  void quantizables(std::vector<Quantizable*>& out) override;
  using Module::init;  // the one-argument form stays visible
  virtual void init(Init& init, bool zero_init_last);
  // int8 inference between blocks (docs/int8.md). u8_input(): conv1 when it runs in int8 on u8, so
  // the previous block may hand over its output as u8 in conv1's scale; else nullptr.
  const Int8Conv* u8_input() const;
  // infer() from a float32 input or a u8 one (in u8_input()'s scale). The output is u8 in the
  // scale of `next` when this block can write it so (identity shortcut, ReLU, conv3 in int8,
  // `next` takes u8), else float32. With input_is_scratch the caller holds the input only to hand it
  // over (a network passing one block's output to the next): an identity shortcut's conv3 then adds
  // onto the input's storage and returns it as the output, instead of copying it first.
  BlockFlow infer_flow(const BlockFlow& in, const Int8Conv* next, bool input_is_scratch = false) const;

 protected:
  // The layers between the block input and conv3_1x1, registered in timm's order.
  virtual std::vector<std::pair<std::string, Module*>> body() const = 0;
  // With conv1 in int8: the body from the block input quantized for conv1, up to conv3's input
  // (u8 in conv3's input scale where the layers allow it, else float32).
  virtual BlockFlow infer_body_int8(const ops::QuantizedTensor& qx) const = 0;
  // The body in float32 inference, from conv1's output to conv3's input: body()'s layers in turn.
  virtual Tensor infer_body(const Tensor& h) const;
  Act act_;
  std::unique_ptr<ConvNormAct> shortcut_;  // null: identity
  std::unique_ptr<ConvNormAct> conv1_, conv3_;

 private:
  // infer(), and with maps given also infer_attention() (the body's modules named prefix + name).
  Tensor infer_recording(const Tensor& x, const std::string* prefix, std::vector<AttentionMaps>* maps,
                         bool input_is_scratch = false) const;
  Tensor sum_;  // saved: the pre-activation sum, or for ReLU the output (same gradient mask)
  // float32 inference on the CPU, for the projection shortcuts where it is faster
  // (merges_shortcut()): conv3 and the shortcut as one 1x1 convolution over the channels of conv3's
  // input and of the shortcut's (subsampled) input, weights [W3 | Wsc], bias b3 + bsc.
  Tensor merged_w_, merged_b_;
  mutable OpCache merged_cache_;
};

class BottleneckBlock : public ResidualBlock {
 public:
  BottleneckBlock(int in, int out, int stride, float bottle_ratio, int group_size, Act act);
  void init(Init& init, bool zero_init_last) override;

 protected:
  std::vector<std::pair<std::string, Module*>> body() const override;
  BlockFlow infer_body_int8(const ops::QuantizedTensor& qx) const override;

 private:
  std::unique_ptr<ConvNormAct> conv2_;
};

class QkvAttention;

class SelfAttnBlock : public ResidualBlock {
 public:
  // attn: the self-attention layer (BotAttention or SasaAttention) working on mid channels.
  SelfAttnBlock(int in, int mid, int out, int stride, std::unique_ptr<QkvAttention> attn, Act act);
  ~SelfAttnBlock() override;
  void init(Init& init, bool zero_init_last) override;
  // With an attention op that applies the activation itself (SASA), post_attn's batch norm is
  // folded into the value projection (QkvAttention::fold_norm).
  void prepare_inference() override;

 protected:
  std::vector<std::pair<std::string, Module*>> body() const override;
  BlockFlow infer_body_int8(const ops::QuantizedTensor& qx) const override;
  Tensor infer_body(const Tensor& h) const override;

 private:
  std::unique_ptr<QkvAttention> attn_;
  std::unique_ptr<BatchNormAct> post_attn_;
};

// timm's make_divisible(v, 8): round to a multiple of 8, never more than 10% down.
int make_divisible(double v, int divisor = 8);

// Channels per head of an attention layer `mid` channels wide, as timm derives them: queries and
// keys make_divisible(mid * qk_ratio) / heads, values mid / heads. Throws (naming `where`) when
// mid does not split into the heads.
struct HeadDims {
  int dqk = 0, dv = 0;
};
HeadDims head_dims(int mid, int heads, double qk_ratio, const std::string& where);

}  // namespace relpos
