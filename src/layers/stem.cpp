#include "layers/stem_and_head.hpp"
#include "relpos/error.hpp"

namespace relpos {

namespace {
const ops::PoolSpec kStemPool{ops::PoolKind::Max, 3, 2, 1};
}

Stem::Stem(const StemConfig& cfg, int in_chans, Act act) {
  if (cfg.type == StemType::Tiered) {
    const int c = cfg.chs;
    convs_.emplace_back("conv1", std::make_unique<ConvNormAct>(in_chans, 3 * c / 8, 3, 2, 1, act));
    convs_.emplace_back("conv2", std::make_unique<ConvNormAct>(3 * c / 8, c / 2, 3, 1, 1, act));
    convs_.emplace_back("conv3", std::make_unique<ConvNormAct>(c / 2, c, 3, cfg.pool == StemPool::StridedConv3 ? 2 : 1, 1, act));
  } else {
    RELPOS_CHECK(cfg.pool != StemPool::StridedConv3, "stem: pool \"conv3\" needs a tiered stem");
    // timm: a single-conv stem is the ConvNormAct itself (stem.conv.weight, stem.bn.*)
    convs_.emplace_back("", std::make_unique<ConvNormAct>(in_chans, cfg.chs, cfg.kernel, cfg.stride, 1, act));
  }
  convs_.front().second->set_need_input_grad(false);
  pool_ = cfg.pool == StemPool::MaxPool;
}

void Stem::collect(const std::string& p, std::vector<ParamRef>& out) {
  for (auto& [name, c] : convs_) c->collect(name.empty() ? p : p + name + ".", out);
}

void Stem::init(Init& init) {
  for (auto& [name, c] : convs_) c->init(init, false);
}

Tensor Stem::infer(const Tensor& x, Tensor* pre_pool) const {
  if (!pre_pool) return infer_flow(x, nullptr).f;
  const BlockFlow h = convs(x, nullptr);
  *pre_pool = h.f;
  return pool_ ? ops::pool2d(h.f, kStemPool) : h.f;
}

BlockFlow Stem::infer_flow(const Tensor& x, const Int8Conv* next) const {
  const BlockFlow h = convs(x, next);
  if (h.q.defined()) return {Tensor(), pool_ ? ops::max_pool2d_quantized(h.q, kStemPool) : h.q};
  return {pool_ ? ops::pool2d(h.f, kStemPool) : h.f, {}};
}

BlockFlow Stem::convs(const Tensor& x, const Int8Conv* after) const {
  Tensor h = x;
  ops::QuantizedTensor q;  // set while int8 convolutions pass u8 along (docs/int8.md)
  for (std::size_t i = 0; i < convs_.size(); ++i) {
    const ConvNormAct& c = *convs_[i].second;
    const Int8Conv* next = i + 1 < convs_.size() ? convs_[i + 1].second->int8() : after;
    if (c.can_feed(next)) {
      q = c.infer_requantized(q.defined() ? q : c.quantize_input(h), *next);
    } else if (q.defined()) {
      h = c.infer(q);
      q = {};
    } else {
      h = c.infer(h);
    }
  }
  if (q.defined()) return {Tensor(), q};
  return {h, {}};
}

Tensor Stem::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& [name, c] : convs_) h = c->forward(h);
  pre_pool_ = h;
  return pool_ ? ops::pool2d(h, kStemPool) : h;
}

Tensor Stem::backward(const Tensor& dy) {
  Tensor d = pool_ ? ops::pool2d_backward(pre_pool_, dy, kStemPool) : dy;
  for (auto it = convs_.rbegin(); it != convs_.rend(); ++it) d = it->second->backward(d);
  return d;
}

void Stem::prepare_inference() {
  for (auto& [name, c] : convs_) c->prepare_inference();
}

void Stem::release_saved() {
  pre_pool_ = Tensor();
  for (auto& [name, c] : convs_) c->release_saved();
}

Shape Stem::summarize(const std::string& p, const Shape& in, std::vector<LayerRow>* rows) const {
  Shape s = in;
  for (const auto& [name, c] : convs_) s = c->summarize(name.empty() ? p : p + name + ".", s, rows);
  if (pool_) {
    s[2] = (s[2] + 2 - 3) / 2 + 1;
    s[3] = (s[3] + 2 - 3) / 2 + 1;
    if (rows) rows->push_back({p + "pool", "maxpool3x3/2", s, 0, 0});
  }
  return s;
}

}  // namespace relpos
