// Internal: the network's first and last layers.
//  Stem "tiered" (timm's ResNet-T stem): stem.conv1 3x3/2 -> stem.conv2 3x3 -> stem.conv3 3x3 to
//  3c/8, c/2, c channels; stem "conv": one kxk ConvNormAct (stem.conv.weight, stem.bn.*, as
//  timm names a single-conv stem). Then an optional 3x3/2
//  max pool (pad 1).
//  ClassifierHead: global average pool -> head.fc (linear with bias).
#pragma once

#include <memory>

#include "layers/conv_norm_act.hpp"

namespace relpos {

class Stem : public Module {
 public:
  Stem(const StemConfig& cfg, int in_chans, Act act);
  void collect(const std::string& prefix, std::vector<ParamRef>& out) override;
  Tensor infer(const Tensor& x) const override { return infer(x, nullptr); }
  // pre_pool (if given) receives the last convolution's output, before the max pool.
  Tensor infer(const Tensor& x, Tensor* pre_pool) const;
  // int8 inference (docs/int8.md): with `next` (the first block's conv1, taking u8) and the last
  // convolution in int8 with a ReLU, the output is u8 in next's scale (max-pooled as u8), else float32.
  BlockFlow infer_flow(const Tensor& x, const Int8Conv* next) const;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  void prepare_inference() override;
  void release_saved() override;
  void init(Init& init) override;
  Shape summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const override;
  void quantizables(std::vector<Quantizable*>& out) override {
    for (auto& [name, c] : convs_) c->quantizables(out);
  }
  int out_channels() const { return convs_.back().second->out_channels(); }

 private:
  // The convolutions, the last writing u8 for `after` when it can.
  BlockFlow convs(const Tensor& x, const Int8Conv* after) const;
  std::vector<std::pair<std::string, std::unique_ptr<ConvNormAct>>> convs_;
  bool pool_ = false;
  Tensor pre_pool_;
};

class ClassifierHead : public Module {
 public:
  ClassifierHead(int in_features, int num_classes);
  void collect(const std::string& prefix, std::vector<ParamRef>& out) override;
  Tensor infer(const Tensor& x) const override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  void release_saved() override;
  void init(Init& init) override;
  Shape summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const override;

 private:
  int in_, classes_;
  Tensor w_, dw_, b_, db_;
  Shape x_shape_;
  Tensor pooled_;
};

}  // namespace relpos
