// Internal: the self-attention layers a SelfAttnBlock holds. Both are a qkv projection (1x1 conv
// without bias, "qkv.weight"), an attention op, and at stride 2 a 2x2/2 average pool; they differ
// in the op and its position parameters:
//  - BotAttention (timm's BottleneckAttn): global attention with relative (or absolute, or no)
//    position embeddings: pos_embed.height_rel, pos_embed.width_rel (absolute: pos_embed.abs).
//  - SasaAttention: k x k local attention: r_row, r_col.
#pragma once

#include <memory>

#include "core/ops_internal.hpp"
#include "layers/int8_conv.hpp"
#include "layers/module.hpp"
#include "relpos/attention_ops.hpp"

namespace relpos {

class QkvAttention : public Module, public Quantizable {
 public:
  void collect(const std::string& prefix, std::vector<ParamRef>& out) override;
  Tensor infer(const Tensor& x) const override;
  // infer() recording the qkv projection, the probabilities and the op's output.
  Tensor infer_attention(const Tensor& x, const std::string& prefix, std::vector<AttentionMaps>& maps) const override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  void prepare_inference() override;
  void release_saved() override;
  void init(Init& init) override;
  // The qkv projection can run in int8 (the attention itself stays float32).
  void quantizables(std::vector<Quantizable*>& out) override { out.push_back(this); }
  const std::string& layer_name() const override { return qkv_name_; }
  void set_int8(const Int8Input* input) override;
  const Int8Conv* int8() const override { return int8_.get(); }
  // infer() from the input already quantized for the int8 qkv projection.
  Tensor infer(const ops::QuantizedTensor& x) const;
  // Inference with the batch norm that follows the layer (y = act(scale * att + shift), per output
  // channel) folded into the value projection: each output is a convex combination of values (the
  // probabilities sum to 1 over the keys taken), so scaling the values and adding the shift as
  // their bias gives scale * att + shift. Where the op can apply `act` as it writes (fuses_act()),
  // the block's batch-norm pass goes away. fold_norm() makes the folded projection (again after
  // the weights change: prepare_inference() drops it); infer_folded() runs it.
  virtual bool fuses_act() const { return false; }
  void fold_norm(const std::vector<float>& scale, const std::vector<float>& shift);
  bool folded() const { return fold_w_.defined() && !int8_; }
  Tensor infer_folded(const Tensor& x, Act act) const;

 protected:
  QkvAttention(int dim, int qkv_channels, int stride);
  // The attention op on a qkv tensor (probs receives what attend_backward needs).
  virtual Tensor attend(const Tensor& qkv, Tensor* probs) const = 0;
  // attend() for inference with `act` on the output (a separate pass unless the op applies it).
  virtual Tensor attend_act(const Tensor& qkv, Act act) const { return ops::activation(attend(qkv, nullptr), act); }
  // act(attention of the projection w of x, plus v_bias on each output channel, then the layer's
  // 2x2 average pool at stride 2) in one op, with no qkv tensor in between; undefined where the
  // layer has no such op for x's device (or map). `cache`: where the op keeps its plans (the
  // caller's cache for the weights w).
  virtual Tensor attend_projected(const Tensor& /*x*/, const Tensor& /*w*/, const Tensor& /*v_bias*/, Act /*act*/,
                                  OpCache* /*cache*/) const {
    return Tensor();
  }
  // d qkv from d attention output, given the saved qkv and probs; sets the position gradients.
  virtual Tensor attend_backward(const Tensor& qkv, const Tensor& probs, const Tensor& datt) = 0;
  virtual void collect_positions(const std::string& prefix, std::vector<ParamRef>& out) = 0;
  virtual void init_positions(Init& init) = 0;
  // Fills the kind, spec and position tables of a record; probs is the op's as attend() gave it.
  virtual void describe(AttentionMaps& m, const Tensor& probs) const = 0;
  Shape pooled(Shape s) const;
  // " qkv int8 (u8 in)" for an int8 projection, else empty: appended to summarize()'s kind.
  std::string int8_tag() const;
  std::int64_t qkv_params() const { return int8_ ? int8_->params() : qkv_w_.numel(); }

  int dim_, stride_;

 private:
  Tensor qkv_w_, dqkv_w_;
  mutable OpCache cache_;
  Tensor fold_w_, fold_b_;  // fold_norm()'s projection and its bias (zero for q and k)
  Tensor fold_vb_;          // fold_b_'s value rows: the output channels' shift
  mutable OpCache fold_cache_;
  std::string qkv_name_;  // "<prefix>qkv", set by collect()
  std::unique_ptr<Int8Conv> int8_;
  Tensor project(const Tensor& x) const;  // the qkv projection, float32 or int8
  Tensor x_, qkv_, probs_, att_;  // saved by forward()
};

class BotAttention : public QkvAttention {
 public:
  // feat_h x feat_w: the map size the tables are built for (ignored with clip > 0).
  BotAttention(int dim, const BotAttnSpec& spec, int feat_h, int feat_w, int stride);
  Shape summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const override;

 protected:
  Tensor attend(const Tensor& qkv, Tensor* probs) const override;
  Tensor attend_backward(const Tensor& qkv, const Tensor& probs, const Tensor& datt) override;
  void collect_positions(const std::string& prefix, std::vector<ParamRef>& out) override;
  void init_positions(Init& init) override;
  void describe(AttentionMaps& m, const Tensor& probs) const override;

 private:
  BotAttnSpec spec_;
  Tensor pos_h_, dpos_h_, pos_w_, dpos_w_;
  int map_h_ = 0, map_w_ = 0;  // the feature map the position tables fit (0: any map)
};

class SasaAttention : public QkvAttention {
 public:
  SasaAttention(int dim, const SasaSpec& spec, int stride);
  Shape summarize(const std::string& prefix, const Shape& in, std::vector<LayerRow>* rows) const override;
  bool fuses_act() const override { return true; }

 protected:
  Tensor attend(const Tensor& qkv, Tensor* probs) const override;
  Tensor attend_act(const Tensor& qkv, Act act) const override;
  Tensor attend_projected(const Tensor& x, const Tensor& w, const Tensor& v_bias, Act act,
                          OpCache* cache) const override;
  Tensor attend_backward(const Tensor& qkv, const Tensor& probs, const Tensor& datt) override;
  void collect_positions(const std::string& prefix, std::vector<ParamRef>& out) override;
  void init_positions(Init& init) override;
  void describe(AttentionMaps& m, const Tensor& probs) const override;

 private:
  SasaSpec spec_;
  Tensor r_row_, dr_row_, r_col_, dr_col_;
};

}  // namespace relpos
