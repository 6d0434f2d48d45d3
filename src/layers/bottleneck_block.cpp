#include "layers/blocks.hpp"

namespace relpos {

namespace {
int mid_of(int out, float br) { return make_divisible(out * static_cast<double>(br)); }
}  // namespace

BottleneckBlock::BottleneckBlock(int in, int out, int stride, float bottle_ratio, int group_size, Act act)
    : ResidualBlock(in, mid_of(out, bottle_ratio), out, stride, act) {
  const int mid = mid_of(out, bottle_ratio);
  const int groups = group_size > 0 ? mid / group_size : 1;
  conv2_ = std::make_unique<ConvNormAct>(mid, mid, 3, stride, groups, act);
}

std::vector<std::pair<std::string, Module*>> BottleneckBlock::body() const { return {{"conv2_kxk", conv2_.get()}}; }

BlockFlow BottleneckBlock::infer_body_int8(const ops::QuantizedTensor& qx) const {
  if (!conv1_->can_feed(conv2_->int8())) return {conv2_->infer(conv1_->infer(qx)), {}};
  const ops::QuantizedTensor h1 = conv1_->infer_requantized(qx, *conv2_->int8());
  if (!conv2_->can_feed(conv3_->int8())) return {conv2_->infer(h1), {}};
  return {Tensor(), conv2_->infer_requantized(h1, *conv3_->int8())};
}

void BottleneckBlock::init(Init& init, bool zero_init_last) {
  ResidualBlock::init(init, zero_init_last);
  conv2_->init(init, false);
}

}  // namespace relpos
