#include "layers/attention_layers.hpp"
#include "layers/blocks.hpp"

namespace relpos {

SelfAttnBlock::SelfAttnBlock(int in, int mid, int out, int stride, std::unique_ptr<QkvAttention> attn, Act act)
    : ResidualBlock(in, mid, out, stride, act), attn_(std::move(attn)) {
  post_attn_ = std::make_unique<BatchNormAct>(mid, act);
}

std::vector<std::pair<std::string, Module*>> SelfAttnBlock::body() const {
  return {{"self_attn", attn_.get()}, {"post_attn", post_attn_.get()}};
}

SelfAttnBlock::~SelfAttnBlock() = default;

void SelfAttnBlock::prepare_inference() {
  ResidualBlock::prepare_inference();  // (drops a fold made for earlier weights)
  if (!attn_->fuses_act() || attn_->int8()) return;
  std::vector<float> scale, shift;
  post_attn_->affine(scale, shift);
  attn_->fold_norm(scale, shift);
}

Tensor SelfAttnBlock::infer_body(const Tensor& h) const {
  if (!attn_->folded()) return ResidualBlock::infer_body(h);
  return attn_->infer_folded(h, post_attn_->act());
}

BlockFlow SelfAttnBlock::infer_body_int8(const ops::QuantizedTensor& qx) const {
  const Tensor att = conv1_->can_feed(attn_->int8()) ? attn_->infer(conv1_->infer_requantized(qx, *attn_->int8()))
                                                     : attn_->infer(conv1_->infer(qx));
  return {post_attn_->infer(att), {}};
}

void SelfAttnBlock::init(Init& init, bool zero_init_last) {
  ResidualBlock::init(init, zero_init_last);
  attn_->init(init);
}

}  // namespace relpos
