// Post-training int8 quantization (relpos/quantize.hpp, docs/int8.md): calibration passes over
// the images record each quantizable layer's input range, the layers are switched to int8 with
// the scales the method picks, and each layer's sensitivity is measured with only it in int8.
#include "relpos/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/ops_internal.hpp"
#include "core/runtime_internal.hpp"
#include "io/json_reader.hpp"
#include "layers/activation_observer.hpp"
#include "quant/activation_range.hpp"
#include "relpos/error.hpp"

namespace relpos {

namespace {

constexpr detail::EnumName<Calibration> kMethods[] = {
    {Calibration::MinMax, "minmax"}, {Calibration::Percentile, "percentile"}, {Calibration::Mse, "mse"}};

enum class Pass { MinMax, Histogram };

class RangeObserver : public detail::ActivationObserver {
 public:
  std::map<std::string, detail::ActivationRange> ranges;
  Pass pass = Pass::MinMax;
  void observe(const std::string& layer, const Tensor& input) override {
    const Tensor x = input.to(Device::CPU);
    auto& r = ranges[layer];
    if (pass == Pass::MinMax) r.add_minmax(x.data(), x.numel());
    else r.add_histogram(x.data(), x.numel());
  }
};

// Sets the observer for the calling thread while it lives.
struct Observing {
  explicit Observing(detail::ActivationObserver* o) { detail::set_activation_observer(o); }
  ~Observing() { detail::set_activation_observer(nullptr); }
  Observing(const Observing&) = delete;
  Observing& operator=(const Observing&) = delete;
};

// Relative RMS difference of logits b from a.
double relative_error(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    num += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    den += static_cast<double>(x[i]) * x[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::vector<int> top1(const Tensor& logits) {
  const auto v = logits.to_vector();
  const std::int64_t n = logits.dim(0), c = logits.dim(1);
  std::vector<int> out;
  for (std::int64_t i = 0; i < n; ++i)
    out.push_back(static_cast<int>(std::max_element(v.begin() + i * c, v.begin() + (i + 1) * c) - (v.begin() + i * c)));
  return out;
}

// The first `images` images of the calibration batches, as one batch.
Tensor check_batch(const std::vector<Tensor>& calibration, std::int64_t images) {
  const Tensor& first = calibration.front();
  Shape s = first.shape();
  s[0] = 0;
  std::vector<Tensor> parts;
  for (const Tensor& b : calibration) {
    if (s[0] >= images) break;
    parts.push_back(b.to(Device::CPU).contiguous());
    s[0] += std::min(b.dim(0), images - (s[0]));
  }
  Tensor out(s);
  std::int64_t per = numel_of({1, s[1], s[2], s[3]}), at = 0;
  for (const Tensor& p : parts) {
    const std::int64_t take = std::min(p.dim(0), s[0] - at);
    std::copy(p.data(), p.data() + take * per, out.data() + at * per);
    at += take;
  }
  return out;
}

}  // namespace

Calibration parse_calibration(const std::string& s) { return detail::parse_enum(s, kMethods, "calibration method"); }
std::string to_string(Calibration c) { return detail::enum_name(c, kMethods); }

QuantizeReport quantize(Model& model, const std::vector<Tensor>& calibration, const QuantizeOptions& options) {
  Network& net = model.network();
  const ModelConfig& config = net.config();
  RELPOS_CHECK(!calibration.empty(), "quantize: no calibration images");
  RELPOS_CHECK(model.device() == Device::CPU, "quantize: the model must be on the CPU (int8 runs on the CPU only)");
  RELPOS_CHECK(net.int8_layers().empty(), "quantize: " << config.name << " is already int8; quantize its float model");
  RELPOS_CHECK(options.method != Calibration::Percentile || (options.percentile > 0.0 && options.percentile <= 100.0),
               "quantize: the percentile must be in (0, 100], got " << options.percentile);
  RELPOS_CHECK(options.sensitivity_images >= 0, "quantize: sensitivity_images must be >= 0");
  QuantizeReport report;
  for (const Tensor& b : calibration) {
    RELPOS_CHECK(b.ndim() == 4 && b.dim(1) == config.in_chans && b.dim(0) > 0,
                 "quantize: calibration batches must be (N, " << config.in_chans << ", H, W), got " << b.describe());
    report.calibration_images += b.dim(0);
  }
  const std::vector<std::string> names = net.quantizable_layers();
  std::set<std::string> keep;
  for (const std::string& k : options.keep_float) {
    RELPOS_CHECK(std::find(names.begin(), names.end(), k) != names.end(),
                 "--keep-float: '" << k << "' is not a layer of " << config.name
                                   << " that can run in int8 (relpos quantize lists them)");
    keep.insert(k);
  }
  RELPOS_CHECK(keep.size() < names.size(), "quantize: every layer is kept in float32; nothing to quantize");
  const detail::ThreadScope relpos_threads_;

  // calibration: ranges, then (for percentile and MSE) histograms
  RangeObserver obs;
  {
    Observing on(&obs);
    for (const Tensor& b : calibration) net.infer(b);
    if (options.method != Calibration::MinMax) {
      obs.pass = Pass::Histogram;
      for (const Tensor& b : calibration) net.infer(b);
    }
  }
  std::vector<Int8Layer> chosen;
  const float lowest = detail::lowest_input(model.preprocess());  // what the first layer takes at least
  for (const std::string& n : names) {
    LayerQuantization l;
    l.name = n;
    auto it = obs.ranges.find(n);
    RELPOS_CHECK(it != obs.ranges.end(), "quantize: calibration never reached layer " << n);
    const detail::ActivationRange& r = it->second;
    l.input_min = r.min();
    l.input_max = r.max();
    l.input_signed = r.is_signed();
    l.input_scale = r.scale(options.method, options.percentile);
    // the first layer takes the preprocessed image: a black pixel gives its lowest value, seen in
    // calibration or not (a few bright images would make it u8, and every dark pixel 0)
    if (n == names.front() && !l.input_signed && lowest < 0.0f) {
      l.input_signed = true;
      const float t = std::max(r.threshold(options.method, options.percentile), -lowest);
      l.input_scale = ops::usable_int8_scale(t / 127.0f) ? t / 127.0f : 1.0f;
    }
    l.int8 = keep.count(n) == 0;
    if (l.int8) chosen.push_back({n, l.input_scale, l.input_signed});
    report.layers.push_back(l);
  }

  // per-layer sensitivity and the whole model's error, on the first calibration images
  const std::int64_t check = std::min<std::int64_t>(options.sensitivity_images, report.calibration_images);
  Tensor x, ref;
  if (check > 0) {
    x = check_batch(calibration, check);
    ref = net.infer(x);
    report.check_images = check;
    for (LayerQuantization& l : report.layers) {
      if (!l.int8) continue;
      net.set_int8_layers({{l.name, l.input_scale, l.input_signed}});
      l.sensitivity = relative_error(ref, net.infer(x));
    }
  }
  net.set_int8_layers(chosen);
  if (check > 0) {
    const Tensor q = net.infer(x);
    report.logits_error = relative_error(ref, q);
    const auto a = top1(ref), b = top1(q);
    std::int64_t same = 0;
    for (std::size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
    report.top1_agreement = static_cast<double>(same) / static_cast<double>(a.size());
  }
  return report;
}

}  // namespace relpos
