#include "layers/stem_and_head.hpp"
#include "relpos/error.hpp"

namespace relpos {

ClassifierHead::ClassifierHead(int in_features, int num_classes) : in_(in_features), classes_(num_classes) {
  w_ = Tensor::zeros({num_classes, in_features});
  b_ = Tensor::zeros({num_classes});
}

void ClassifierHead::collect(const std::string& p, std::vector<ParamRef>& out) {
  out.push_back({p + "fc.weight", &w_, &dw_, false});
  out.push_back({p + "fc.bias", &b_, &db_, true});
}

void ClassifierHead::init(Init& init) {
  init.normal(w_, 0.01f);  // timm byobnet _init_weights for nn.Linear
  Init::constant(b_, 0.0f);
}

Tensor ClassifierHead::infer(const Tensor& x) const { return ops::linear(ops::global_avg_pool(x), w_, &b_); }

Tensor ClassifierHead::forward(const Tensor& x) {
  x_shape_ = x.shape();
  pooled_ = ops::global_avg_pool(x);
  return ops::linear(pooled_, w_, &b_);
}

Tensor ClassifierHead::backward(const Tensor& dy) {
  RELPOS_CHECK(pooled_.defined(), "internal: backward() without forward()");
  ops::LinearGrads g = ops::linear_backward(pooled_, w_, dy);
  dw_ = g.dw;
  db_ = g.db;
  return ops::global_avg_pool_backward(g.dx, x_shape_);
}

void ClassifierHead::release_saved() { pooled_ = Tensor(); }

Shape ClassifierHead::summarize(const std::string& p, const Shape& in, std::vector<LayerRow>* rows) const {
  RELPOS_CHECK(in.size() == 4 && in[1] == in_, p << ": expects " << in_ << " channels");
  if (rows) rows->push_back({p + "fc", "avgpool+linear", {in[0], classes_}, w_.numel() + b_.numel(), in[0] * w_.numel()});
  return {in[0], classes_};
}

}  // namespace relpos
