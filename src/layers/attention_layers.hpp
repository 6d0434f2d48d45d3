// Internal: the self-attention layers a SelfAttnBlock holds, each with its qkv projection (1x1
// conv without bias) and, at stride 2, a 2x2/2 average pool after the attention.
//  - BotAttention (timm's BottleneckAttn): global attention with relative (or absolute, or no)
//    position embeddings. Names: qkv.weight, pos_embed.height_rel, pos_embed.width_rel
//    (absolute: pos_embed.abs).
//  - SasaAttention: k x k local attention. Names: qkv.weight, r_row, r_col.
#pragma once

#include "layers/module.hpp"
#include "relpos/attention_ops.hpp"

namespace relpos {

class BotAttention : public Module {
 public:
  // feat_h x feat_w: the map size the tables are built for (ignored with clip > 0).
  BotAttention(int dim, const BotAttnSpec& spec, int feat_h, int feat_w, int stride);

  void collect(const std::string& prefix, std::vector<ParamRef>& out) override;
  Tensor infer(const Tensor& x) const override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  void prepare_inference() override { cache_.clear(); }
  void release_saved() override;
  Shape summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const override;
  void init(Init& init) override;

 private:
  int dim_, stride_;
  BotAttnSpec spec_;
  Tensor qkv_w_, dqkv_w_, pos_h_, dpos_h_, pos_w_, dpos_w_;
  mutable OpCache cache_;
  Tensor x_, qkv_, probs_, att_;
};

class SasaAttention : public Module {
 public:
  SasaAttention(int dim, const SasaSpec& spec, int stride);

  void collect(const std::string& prefix, std::vector<ParamRef>& out) override;
  Tensor infer(const Tensor& x) const override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  void prepare_inference() override { cache_.clear(); }
  void release_saved() override;
  Shape summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const override;
  void init(Init& init) override;

 private:
  int dim_, stride_;
  SasaSpec spec_;
  Tensor qkv_w_, dqkv_w_, r_row_, dr_row_, r_col_, dr_col_;
  mutable OpCache cache_;
  Tensor x_, qkv_, probs_, att_;
};

}  // namespace relpos
