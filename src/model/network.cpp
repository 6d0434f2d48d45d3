#include "relpos/network.hpp"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <tuple>

#include "core/environment.hpp"
#include "core/op_profile.hpp"
#include "layers/attention_layers.hpp"
#include "layers/blocks.hpp"
#include "layers/stem_and_head.hpp"
#include "relpos/error.hpp"

namespace relpos {

struct Network::Impl {
  ModelConfig config;
  std::unique_ptr<Stem> stem;
  std::vector<std::vector<std::unique_ptr<ResidualBlock>>> stages;
  std::unique_ptr<ClassifierHead> head;
  std::vector<std::vector<std::string>> block_names;  // "stages.I.J", for per-layer profiling
  const std::string stem_name = "stem", head_name = "head";
  std::vector<ParamRef> params;
  // where each block's and the head's parameters start in params (the stem's start at 0)
  std::vector<std::vector<std::size_t>> block_first;
  std::size_t head_first = 0;
  Device device = Device::CPU;
  bool prepared = false;
  // the last input size whose feature maps every block takes ((h << 32) | w; 0: none yet)
  mutable std::atomic<std::uint64_t> sizes_checked{0};

  // Walks the layers' shapes at an h x w input: a block whose two paths disagree (a stride-2
  // attention on an odd map) is an error naming the config, the input size and the block, before
  // any op fails in the middle of a forward pass.
  void check_map_sizes(std::int64_t h, std::int64_t w) const {
    const std::uint64_t key = (static_cast<std::uint64_t>(h) << 32) | static_cast<std::uint64_t>(w);
    if (sizes_checked.load(std::memory_order_relaxed) == key) return;
    try {
      Shape s = stem->summarize("stem.", {1, config.in_chans, h, w}, nullptr);
      for (std::size_t i = 0; i < stages.size(); ++i)
        for (std::size_t j = 0; j < stages[i].size(); ++j)
          s = stages[i][j]->summarize(block_names[i][j] + ".", s, nullptr);
    } catch (const Error& e) {
      RELPOS_FAIL(config.name << ": at " << h << "x" << w << " input, " << e.what());
    }
    sizes_checked.store(key, std::memory_order_relaxed);
  }

  std::unique_ptr<ResidualBlock> make_block(const BlockConfig& b, const StageConfig& st, int in, int feat_h,
                                            int feat_w, const std::string& where) const {
    if (b.type == BlockType::Bottle)
      return std::make_unique<BottleneckBlock>(in, b.chs, b.stride, static_cast<float>(b.br), b.group_size, config.act);
    const int mid = make_divisible(b.chs * b.br);
    const bool bot = b.type == BlockType::SelfAttn;
    const HeadDims d = head_dims(mid, bot ? st.self_attn.heads : st.sasa.heads,
                                 bot ? st.self_attn.qk_ratio : st.sasa.qk_ratio, where);
    std::unique_ptr<QkvAttention> attn;
    if (bot) {
      const SelfAttnConfig& a = st.self_attn;
      BotAttnSpec spec;
      spec.heads = a.heads;
      spec.dqk = d.dqk;
      spec.dv = d.dv;
      spec.pos = a.pos;
      spec.clip = a.clip;
      spec.per_head = a.per_head;
      spec.scale_pos_embed = a.scale_pos_embed;
      attn = std::make_unique<BotAttention>(mid, spec, feat_h, feat_w, b.stride);
    } else {
      SasaSpec spec;
      spec.heads = st.sasa.heads;
      spec.dqk = d.dqk;
      spec.dv = d.dv;
      spec.kernel = st.sasa.kernel;
      RELPOS_CHECK(spec.dqk % 2 == 0, where << ": local attention needs an even dqk per head, got " << spec.dqk);
      attn = std::make_unique<SasaAttention>(mid, spec, b.stride);
    }
    return std::make_unique<SelfAttnBlock>(in, mid, b.chs, b.stride, std::move(attn), config.act);
  }

  // every parameter and buffer in timm's order (again after layers switched to or from int8)
  void collect_params() {
    params.clear();
    stem->collect("stem.", params);
    block_first.assign(stages.size(), {});
    for (std::size_t i = 0; i < stages.size(); ++i)
      for (std::size_t j = 0; j < stages[i].size(); ++j) {
        block_first[i].push_back(params.size());
        stages[i][j]->collect("stages." + std::to_string(i) + "." + std::to_string(j) + ".", params);
      }
    head_first = params.size();
    head->collect("head.", params);
  }

  std::vector<Quantizable*> quantizables() const {
    std::vector<Quantizable*> out;
    stem->quantizables(out);
    for (const auto& stage : stages)
      for (const auto& b : stage) b->quantizables(out);
    return out;
  }

  void check_input(const Tensor& x, bool need_prepared = true) const {
    RELPOS_CHECK(x.ndim() == 4 && x.dim(1) == config.in_chans,
                 config.name << " takes (N, " << config.in_chans << ", H, W) input, got " << x.describe());
    RELPOS_CHECK(x.device() == device, config.name << " is on " << to_string(device) << " but the input is on "
                                                   << to_string(x.device()));
    RELPOS_CHECK(x.dim(0) > 0, "empty batch");
    if (config.fixed_input_size())
      RELPOS_CHECK(x.dim(2) == config.input_size[0] && x.dim(3) == config.input_size[1],
                   config.name << " takes " << config.input_size[0] << "x" << config.input_size[1]
                               << " input (its position tables fix the feature size), got " << x.dim(2) << "x" << x.dim(3));
    RELPOS_CHECK(prepared || !need_prepared, "internal: prepare_inference() was not called after the weights changed");
    check_map_sizes(x.dim(2), x.dim(3));
  }
};

Network::Network(const ModelConfig& config, std::uint32_t seed, bool initialize) : impl_(std::make_unique<Impl>()) {
  // a RELPOS_* setting it does not take: said once, before any work (not for each image a loader
  // skips when make_batch finds it)
  detail::check_environment();
  Impl& m = impl();
  config.check_memory();  // before anything is allocated
  m.config = config;
  m.stem = std::make_unique<Stem>(config.stem, config.in_chans, config.act);
  int prev = m.stem->out_channels();
  // Each block's map size (its position tables fit the map it gets) by the layers' own shape rules:
  // a stride-2 convolution or max pool of an odd side rounds up.
  const auto walk = [&](const Module& layer, const std::string& prefix, const Shape& in) {
    try {
      return layer.summarize(prefix, in, nullptr);
    } catch (const Error& e) {
      RELPOS_FAIL(config.name << ": at " << config.input_size[0] << "x" << config.input_size[1] << " input, " << e.what());
    }
  };
  Shape map = walk(*m.stem, "stem.", {1, config.in_chans, config.input_size[0], config.input_size[1]});
  for (std::size_t i = 0; i < config.stages.size(); ++i) {
    const StageConfig& st = config.stages[i];
    std::vector<std::unique_ptr<ResidualBlock>> blocks;
    for (std::size_t j = 0; j < st.blocks.size(); ++j) {
      const BlockConfig& b = st.blocks[j];
      const std::string where = "stages." + std::to_string(i) + "." + std::to_string(j);
      blocks.push_back(m.make_block(b, st, prev, static_cast<int>(map[2]), static_cast<int>(map[3]), where));
      if (m.block_names.size() <= i) m.block_names.resize(i + 1);
      m.block_names[i].push_back(where);
      prev = b.chs;
      map = walk(*blocks.back(), where + ".", map);
    }
    m.stages.push_back(std::move(blocks));
  }
  m.head = std::make_unique<ClassifierHead>(prev, config.num_classes);
  m.check_map_sizes(config.input_size[0], config.input_size[1]);

  m.collect_params();

  if (initialize) {
    Init init(seed);
    m.stem->init(init);
    for (auto& stage : m.stages)
      for (auto& b : stage) b->init(init, config.zero_init_last);
    m.head->init(init);
  }
  prepare_inference();
}

Network::Impl& Network::impl() const {
  RELPOS_CHECK(impl_, "this network (or model) is empty: it was moved from; assign a loaded one to it first");
  return *impl_;
}

Network::~Network() = default;
Network::Network(Network&&) noexcept = default;
Network& Network::operator=(Network&&) noexcept = default;

const ModelConfig& Network::config() const { return impl().config; }
const std::vector<ParamRef>& Network::params() const { return impl().params; }

const ParamRef* Network::find(const std::string& name) const {
  for (const auto& p : impl().params)
    if (p.name == name) return &p;
  return nullptr;
}

std::int64_t Network::num_params() const {
  std::int64_t n = 0;
  for (const auto& p : impl().params)
    if (p.grad || p.int8) n += p.value->numel();
  return n;
}

Device Network::device() const { return impl().device; }

void Network::to(Device device) {
  if (device == impl().device) return;
  RELPOS_CHECK(device == Device::CPU || int8_layers().empty(), config().name << " has int8 layers, which run on the CPU only");
  release_saved();
  for (auto& p : impl().params) {
    *p.value = p.value->to(device);
    if (p.grad) *p.grad = Tensor();
  }
  impl().device = device;
  prepare_inference();
}

void Network::prepare_inference() {
  Impl& m = impl();
  m.stem->prepare_inference();
  for (auto& stage : m.stages)
    for (auto& b : stage) b->prepare_inference();
  m.head->prepare_inference();
  m.prepared = true;
}

Tensor Network::infer(const Tensor& x) const {
  const Impl& m = impl();
  m.check_input(x);
  // int8 layers hand u8 from block to block where both ends allow it (docs/int8.md)
  std::vector<const ResidualBlock*> blocks;
  for (const auto& stage : m.stages)
    for (const auto& b : stage) blocks.push_back(b.get());
  auto u8_input = [&](std::size_t k) { return k < blocks.size() ? blocks[k]->u8_input() : nullptr; };
  BlockFlow h;
  {
    detail::ScopedLayer layer(m.stem_name);
    h = m.stem->infer_flow(x, u8_input(0));
  }
  // h is the stem's output or the last block's, which nobody else holds, so a block may write its
  // output over it (unless a stem without layers handed back the caller's x itself)
  const bool stem_made_new = !h.f.defined() || h.f.data() != x.data();
  std::size_t k = 0;
  for (std::size_t i = 0; i < m.stages.size(); ++i)
    for (std::size_t j = 0; j < m.stages[i].size(); ++j, ++k) {
      detail::ScopedLayer layer(m.block_names[i][j]);
      h = blocks[k]->infer_flow(h, u8_input(k + 1), k > 0 || stem_made_new);
    }
  detail::ScopedLayer layer(m.head_name);
  return m.head->infer(h.f);
}

std::vector<Tensor> Network::infer_features(const Tensor& x) const {
  const Impl& m = impl();
  m.check_input(x);
  std::vector<Tensor> feats(1);
  Tensor h = m.stem->infer(x, &feats[0]);
  for (const auto& stage : m.stages) {
    for (const auto& b : stage) h = b->infer(h);
    feats.push_back(h);
  }
  return feats;
}

std::vector<AttentionMaps> Network::infer_attention(const Tensor& x, Tensor* logits) const {
  const Impl& m = impl();
  m.check_input(x);
  std::vector<AttentionMaps> maps;
  Tensor h = m.stem->infer(x);
  for (std::size_t i = 0; i < m.stages.size(); ++i)
    for (std::size_t j = 0; j < m.stages[i].size(); ++j)
      h = m.stages[i][j]->infer_attention(h, "stages." + std::to_string(i) + "." + std::to_string(j) + ".", maps);
  for (AttentionMaps& a : maps) {
    a.input_scale_y = static_cast<double>(x.dim(2)) / a.height;
    a.input_scale_x = static_cast<double>(x.dim(3)) / a.width;
  }
  if (logits) *logits = m.head->infer(h);
  return maps;
}

Tensor Network::forward(const Tensor& x) {
  Impl& m = impl();
  m.check_input(x, /*need_prepared=*/false);
  m.prepared = false;  // the weights are about to change: infer() must be re-prepared
  Tensor h;
  {
    detail::ScopedLayer layer(m.stem_name);
    h = m.stem->forward(x);
  }
  for (std::size_t i = 0; i < m.stages.size(); ++i)
    for (std::size_t j = 0; j < m.stages[i].size(); ++j) {
      detail::ScopedLayer layer(m.block_names[i][j]);
      h = m.stages[i][j]->forward(h);
    }
  detail::ScopedLayer layer(m.head_name);
  return m.head->forward(h);
}

void Network::backward(const Tensor& dlogits, const std::function<void(std::size_t first)>& ready) {
  Impl& m = impl();
  Tensor d;
  {
    detail::ScopedLayer layer(m.head_name);
    d = m.head->backward(dlogits);
  }
  if (ready) ready(m.head_first);
  // Each block hands back its input gradient as two terms (body and shortcut); the block before
  // adds them inside its activation's backward, the stem in its own pass.
  Tensor d2;
  for (std::size_t i = m.stages.size(); i-- > 0;)
    for (std::size_t j = m.stages[i].size(); j-- > 0;) {
      {
        detail::ScopedLayer layer(m.block_names[i][j]);
        std::tie(d, d2) = m.stages[i][j]->backward_terms(d, d2);
      }
      if (ready) ready(m.block_first[i][j]);
    }
  {
    detail::ScopedLayer layer(m.stem_name);
    if (d2.defined()) ops::add_inplace(d, d2);
    m.stem->backward(d);
  }
  if (ready) ready(0);
}

void Network::release_saved() {
  Impl& m = impl();
  m.stem->release_saved();
  for (auto& stage : m.stages)
    for (auto& b : stage) b->release_saved();
  m.head->release_saved();
}

std::vector<std::string> Network::quantizable_layers() const {
  std::vector<std::string> out;
  for (const Quantizable* q : impl().quantizables()) out.push_back(q->layer_name());
  return out;
}

void Network::set_int8_layers(const std::vector<Int8Layer>& layers) {
  Impl& m = impl();
  std::map<std::string, const Int8Layer*> wanted;
  for (const Int8Layer& l : layers) {
    RELPOS_CHECK(wanted.emplace(l.name, &l).second, "int8 layer '" << l.name << "' is named twice");
    RELPOS_CHECK(ops::usable_int8_scale(l.input_scale),
                 "int8 layer '" << l.name << "': input scale must be a positive normal float below 1e30, got " << l.input_scale);
  }
  RELPOS_CHECK(layers.empty() || m.device == Device::CPU,
               "int8 layers run on the CPU only; move the model to the CPU first");
  const auto all = m.quantizables();
  std::size_t found = 0;
  for (Quantizable* q : all) found += wanted.count(q->layer_name());
  if (found != wanted.size())
    for (const auto& [name, l] : wanted) {
      bool known = false;
      for (const Quantizable* q : all) known = known || q->layer_name() == name;
      RELPOS_CHECK(known, "'" << name << "' is not a layer of " << m.config.name
                              << " that can run in int8 (relpos info lists the layers)");
    }
  release_saved();
  for (Quantizable* q : all) {
    auto it = wanted.find(q->layer_name());
    if (it == wanted.end()) {
      if (q->int8()) q->set_int8(nullptr);
    } else {
      const Int8Input in{it->second->input_scale, it->second->input_signed};
      q->set_int8(&in);
    }
  }
  m.collect_params();
  prepare_inference();
}

std::vector<Int8Layer> Network::int8_layers() const {
  std::vector<Int8Layer> out;
  for (const Quantizable* q : impl().quantizables())
    if (const Int8Conv* c = q->int8()) out.push_back({q->layer_name(), c->input_scale(), c->input_signed()});
  return out;
}

std::vector<LayerRow> Network::summarize(int batch, int height, int width) const {
  const Impl& m = impl();
  RELPOS_CHECK(batch > 0 && height >= 0 && width >= 0 && (height == 0) == (width == 0),
               "summarize: batch " << batch << ", input " << height << "x" << width);
  if (height == 0) height = m.config.input_size[0], width = m.config.input_size[1];
  RELPOS_CHECK(!m.config.fixed_input_size() || (height == m.config.input_size[0] && width == m.config.input_size[1]),
               m.config.name << " takes " << m.config.input_size[0] << "x" << m.config.input_size[1]
                             << " input (its position tables fix the feature size), not " << height << "x" << width);
  m.check_map_sizes(height, width);
  std::vector<LayerRow> rows;
  Shape s{batch, m.config.in_chans, height, width};
  s = m.stem->summarize("stem.", s, &rows);
  for (std::size_t i = 0; i < m.stages.size(); ++i)
    for (std::size_t j = 0; j < m.stages[i].size(); ++j)
      s = m.stages[i][j]->summarize("stages." + std::to_string(i) + "." + std::to_string(j) + ".", s, &rows);
  m.head->summarize("head.", s, &rows);
  return rows;
}

}  // namespace relpos
