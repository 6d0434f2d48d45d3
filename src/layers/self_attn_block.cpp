#include "layers/blocks.hpp"

namespace relpos {

SelfAttnBlock::SelfAttnBlock(int in, int mid, int out, int stride, std::unique_ptr<Module> attn, Act act)
    : ResidualBlock(in, mid, out, stride, act), attn_(std::move(attn)) {
  post_attn_ = std::make_unique<BatchNormAct>(mid, act);
}

std::vector<std::pair<std::string, Module*>> SelfAttnBlock::body() const {
  return {{"self_attn", attn_.get()}, {"post_attn", post_attn_.get()}};
}

void SelfAttnBlock::init(Init& init, bool zero_init_last) {
  ResidualBlock::init(init, zero_init_last);
  attn_->init(init);
}

}  // namespace relpos
