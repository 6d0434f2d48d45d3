// Position tables resampled for another input size, and Model::at_input_size, which uses them.
#include "model/position_resample.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "relpos/error.hpp"
#include "relpos/model.hpp"

namespace relpos::detail {

namespace {
// For each new index along a side: the two old indices read and the weight of the second.
struct Tap {
  int lo = 0, hi = 0;
  float t = 0.0f;
};
std::vector<Tap> taps(int old_size, int new_size) {
  std::vector<Tap> out(static_cast<std::size_t>(new_size));
  const double ratio = static_cast<double>(old_size) / new_size;
  for (int n = 0; n < new_size; ++n) {
    double s = (n + 0.5) * ratio - 0.5;
    s = std::min(std::max(s, 0.0), static_cast<double>(old_size - 1));
    Tap& tap = out[static_cast<std::size_t>(n)];
    tap.lo = static_cast<int>(std::floor(s));
    tap.hi = std::min(tap.lo + 1, old_size - 1);
    tap.t = static_cast<float>(s - tap.lo);
  }
  return out;
}
}  // namespace

Tensor resample_position_grid(const Tensor& table, int h, int w, int nh, int nw) {
  RELPOS_CHECK(h >= 1 && w >= 1 && nh >= 1 && nw >= 1, "position table: bad grid " << h << "x" << w << " -> " << nh << "x" << nw);
  RELPOS_CHECK(table.ndim() >= 2 && table.dim(table.ndim() - 2) == static_cast<std::int64_t>(h) * w,
               "position table " << to_string(table.shape()) << " is no " << h << "x" << w << " grid");
  const Tensor src = table.to(Device::CPU).contiguous();
  const std::int64_t d = src.dim(src.ndim() - 1), lead = src.numel() / (static_cast<std::int64_t>(h) * w * d);
  Shape shape = src.shape();
  shape[shape.size() - 2] = static_cast<std::int64_t>(nh) * nw;
  Tensor out(shape);
  const std::vector<Tap> ty = taps(h, nh), tx = taps(w, nw);
  for (std::int64_t l = 0; l < lead; ++l) {
    const float* in = src.data() + l * h * w * d;
    float* o = out.data() + l * nh * nw * d;
    for (int y = 0; y < nh; ++y)
      for (int x = 0; x < nw; ++x) {
        const Tap& a = ty[static_cast<std::size_t>(y)];
        const Tap& b = tx[static_cast<std::size_t>(x)];
        const float* p00 = in + (static_cast<std::int64_t>(a.lo) * w + b.lo) * d;
        const float* p01 = in + (static_cast<std::int64_t>(a.lo) * w + b.hi) * d;
        const float* p10 = in + (static_cast<std::int64_t>(a.hi) * w + b.lo) * d;
        const float* p11 = in + (static_cast<std::int64_t>(a.hi) * w + b.hi) * d;
        float* q = o + (static_cast<std::int64_t>(y) * nw + x) * d;
        for (std::int64_t c = 0; c < d; ++c) {
          const float top = p00[c] + b.t * (p01[c] - p00[c]);
          const float bottom = p10[c] + b.t * (p11[c] - p10[c]);
          q[c] = top + a.t * (bottom - top);
        }
      }
  }
  return out.to(table.device());
}

std::vector<std::pair<std::string, std::pair<int, int>>> attention_map_sizes(const Network& net) {
  // a self_attn layer attends over its block's conv1_1x1 output (the layers' own shape rules)
  const std::vector<LayerRow> rows = net.summarize(1);
  std::vector<std::pair<std::string, std::pair<int, int>>> out;
  for (const LayerRow& r : rows) {
    const std::string tail = ".self_attn";
    if (r.name.size() <= tail.size() || r.name.compare(r.name.size() - tail.size(), tail.size(), tail) != 0) continue;
    const std::string prefix = r.name.substr(0, r.name.size() - tail.size() + 1);
    const auto in = std::find_if(rows.begin(), rows.end(), [&](const LayerRow& x) { return x.name == prefix + "conv1_1x1"; });
    RELPOS_CHECK(in != rows.end(), "internal: no " << prefix << "conv1_1x1 before " << r.name);
    out.push_back({prefix, {static_cast<int>(in->out_shape[2]), static_cast<int>(in->out_shape[3])}});
  }
  return out;
}

}  // namespace relpos::detail

namespace relpos {

Model Model::at_input_size(int height, int width, std::string* note) const {
  const ModelConfig& old_config = network_.config();
  RELPOS_CHECK(height >= 1 && width >= 1 && height <= 4096 && width <= 4096,
               "input size must be 1 to 4096 on each side, got " << height << "x" << width);
  ModelConfig config = old_config;
  config.input_size = {height, width};
  Network net(config, 0, /*initialize=*/false);
  const auto old_maps = detail::attention_map_sizes(network_), new_maps = detail::attention_map_sizes(net);
  // an int8 model's layers are int8 at the new size too (their weights, scales and folded batch
  // norms are what the copy below takes by name)
  if (const std::vector<Int8Layer> int8 = network_.int8_layers(); !int8.empty()) net.set_int8_layers(int8);
  std::ostringstream said;
  int resampled = 0;
  for (const ParamRef& p : net.params()) {
    const ParamRef* src = network_.find(p.name);
    RELPOS_CHECK(src, "internal: " << p.name << " missing at the old input size");
    if (src->value->shape() == p.value->shape()) {
      p.value->copy_from(src->value->to(Device::CPU));
      continue;
    }
    // a position table sized for the old input: which block, and which kind
    std::size_t k = 0;
    while (k < old_maps.size() && p.name.rfind(old_maps[k].first, 0) != 0) ++k;
    RELPOS_CHECK(k < old_maps.size(), "internal: " << p.name << " changes shape with the input size");
    const auto [oh, ow] = old_maps[k].second;
    const auto [nh, nw] = new_maps[k].second;
    Tensor t;
    if (p.name.size() >= 3 && p.name.compare(p.name.size() - 3, 3, "abs") == 0)
      t = detail::resample_position_grid(*src->value, oh, ow, nh, nw);
    else if (p.name.find("height_rel") != std::string::npos)
      t = detail::resample_position_grid(*src->value, 2 * oh - 1, 1, 2 * nh - 1, 1);
    else
      t = detail::resample_position_grid(*src->value, 2 * ow - 1, 1, 2 * nw - 1, 1);
    RELPOS_CHECK(t.shape() == p.value->shape(), "internal: resampled " << p.name << " to " << to_string(t.shape())
                                                                       << ", needs " << to_string(p.value->shape()));
    p.value->copy_from(t);
    if (resampled++ == 0)
      said << "position tables resampled from the " << old_config.input_size[0] << "x" << old_config.input_size[1]
           << " input to " << height << "x" << width << " (";
    else
      said << ", ";
    said << p.name << " " << to_string(src->value->shape()) << " -> " << to_string(t.shape());
  }
  if (resampled) said << ")";
  if (note) *note = said.str();
  net.prepare_inference();
  Preprocess pre = preprocess_;
  pre.height = height;
  pre.width = width;
  Model m(std::move(net), labels_, pre);
  m.to(device());
  return m;
}

}  // namespace relpos
