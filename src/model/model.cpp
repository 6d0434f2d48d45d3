// Model: a network with its class labels and preprocessing; loading, creating and saving it
// (through the file formats of src/io/weights_file.cpp) and running it on images.
#include "relpos/model.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <numeric>
#include <set>

#include "core/runtime_internal.hpp"
#include "io/atomic_file.hpp"
#include "io/json_reader.hpp"
#include "io/weights_file.hpp"
#include "quant/activation_range.hpp"
#include "relpos/error.hpp"
#include "relpos/safetensors.hpp"

namespace relpos {

Model::Model(Network network, std::vector<std::string> labels, Preprocess preprocess)
    : network_(std::move(network)) {
  set_labels(std::move(labels));
  set_preprocess(preprocess);
}

void Model::set_labels(std::vector<std::string> labels) {
  RELPOS_CHECK(labels.empty() || static_cast<int>(labels.size()) == network_.config().num_classes,
               labels.size() << " labels for a model with " << network_.config().num_classes << " classes");
  // Labels are stored as JSON text. (They need not be unique: ImageNet's have 'crane' twice.)
  for (std::size_t i = 0; i < labels.size(); ++i)
    RELPOS_CHECK(detail::valid_utf8(labels[i]), "label " << i << " ('" << detail::printable_utf8(labels[i])
                                                         << "') is not valid UTF-8 text");
  labels_ = std::move(labels);
}

void Model::set_preprocess(const Preprocess& p) {
  p.check();
  RELPOS_CHECK(p.in_chans() == network_.config().in_chans,
               "preprocessing gives " << p.in_chans() << "-channel input (" << to_string(p.channels) << ") but "
                                      << network_.config().name << " takes " << network_.config().in_chans);
  const ModelConfig& c = network_.config();
  RELPOS_CHECK(!c.fixed_input_size() || (p.height == c.input_size[0] && p.width == c.input_size[1]),
               "preprocess.input_size [" << p.height << ", " << p.width << "] does not fit " << c.name << ", which takes "
                                         << c.input_size[0] << "x" << c.input_size[1]
                                         << " input (its position tables fix the feature size)");
  // The network's memory was checked at its config's input size; the model runs at this one (a
  // model file whose preprocessing said 2048x2048 ran out of memory, unchecked)
  if (p.height != c.input_size[0] || p.width != c.input_size[1]) {
    ModelConfig at = c;
    at.input_size = {p.height, p.width};
    try {
      at.check_memory();
    } catch (const Error& e) {
      RELPOS_FAIL("preprocess.input_size [" << p.height << ", " << p.width << "]: " << e.what());
    }
  }
  // An int8 first layer that takes u8 (its calibration never saw a negative input) turns every
  // negative value this preprocessing gives into 0: answers, but wrong ones.
  const std::vector<std::string> order = network_.quantizable_layers();
  for (const Int8Layer& l : network_.int8_layers())
    RELPOS_CHECK(order.empty() || l.name != order.front() || l.input_signed || detail::lowest_input(p) >= 0.0f,
                 "the int8 layer " << l.name << " takes u8 input (never negative), but this preprocessing gives values "
                                   << "down to " << detail::lowest_input(p)
                                   << " (-mean / std); quantize the float model with this preprocessing instead");
  preprocess_ = p;
}

namespace {
// The batch with every image mirrored left to right (on the CPU, at the edge of the network).
Tensor mirrored(const Tensor& batch) {
  RELPOS_CHECK(batch.ndim() == 4, "logits needs an (N, C, H, W) batch, got " << batch.describe());
  const Tensor src = batch.to(Device::CPU).contiguous();
  Tensor out(src.shape());
  const std::int64_t rows = src.dim(0) * src.dim(1) * src.dim(2), w = src.dim(3);
  for (std::int64_t r = 0; r < rows; ++r)
    std::reverse_copy(src.data() + r * w, src.data() + (r + 1) * w, out.data() + r * w);
  return out.to_layout(batch.layout());
}
}  // namespace

Tensor Model::logits(const Tensor& batch) const {
  const detail::ThreadScope relpos_threads_;
  if (batch.is_cpu()) {
    // A NaN in the input does not always reach the logits (a ReLU maps it to 0): refused here, as
    // classify() refuses images with one (a batch on the GPU is not copied back to be checked).
    // One vectorised pass (x * 0 is NaN exactly for NaN and infinity); the place only on failure.
    const float* v = batch.data();
    const std::int64_t n = batch.numel();
    float probe = 0.0f;
#pragma omp simd reduction(+ : probe)
    for (std::int64_t i = 0; i < n; ++i) probe += v[i] * 0.0f;
    if (probe != 0.0f) {
      const std::int64_t per = batch.ndim() >= 1 && batch.dim(0) > 0 ? n / batch.dim(0) : n;
      for (std::int64_t i = 0; i < n; ++i)
        RELPOS_CHECK(std::isfinite(v[i]), "logits: the batch holds a non-finite value ("
                                              << v[i] << ") in image " << i / std::max<std::int64_t>(per, 1));
    }
  }
  Tensor out = network_.infer(batch.to(network_.device())).to(Device::CPU);
  if (preprocess_.tta == Tta::HFlip) {
    const Tensor flipped = network_.infer(mirrored(batch).to(network_.device())).to(Device::CPU);
    float* o = out.data();
    const float* f = flipped.data();
    for (std::int64_t i = 0; i < out.numel(); ++i) o[i] = 0.5f * (o[i] + f[i]);
  }
  return out;
}

std::vector<std::vector<Prediction>> Model::top_k(const Tensor& logits, int k) const {
  RELPOS_CHECK(k >= 1, "topk must be at least 1, got " << k);
  RELPOS_CHECK(logits.ndim() == 2, "top_k needs (N, classes) logits, got " << logits.describe());
  RELPOS_CHECK(logits.dim(1) == network_.config().num_classes,
               "top_k: logits " << logits.describe() << " do not fit " << network_.config().name << ", which has "
                                << network_.config().num_classes << " classes");
  const auto v = logits.to_vector();
  const std::int64_t n = logits.dim(0), c = logits.dim(1);
  for (std::size_t i = 0; i < v.size(); ++i)
    RELPOS_CHECK(std::isfinite(v[i]), "top_k: the logits of image " << i / static_cast<std::size_t>(c)
                                                                    << " are not finite (" << v[i] << ")");
  k = std::max(1, std::min<int>(k, static_cast<int>(c)));
  std::vector<std::vector<Prediction>> out(static_cast<std::size_t>(n));
  std::vector<int> order(static_cast<std::size_t>(c));
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = v.data() + i * c;
    const float m = *std::max_element(row, row + c);
    double sum = 0.0;
    for (std::int64_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(row[j] - m));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) { return row[a] > row[b]; });
    for (int r = 0; r < k; ++r) {
      const int j = order[static_cast<std::size_t>(r)];
      Prediction p;
      p.index = j;
      p.label = labels_.empty() ? "class " + std::to_string(j) : labels_[static_cast<std::size_t>(j)];
      p.logit = row[j];
      p.probability = static_cast<float>(std::exp(static_cast<double>(row[j] - m)) / sum);
      out[static_cast<std::size_t>(i)].push_back(p);
    }
  }
  return out;
}

std::vector<std::vector<Prediction>> Model::classify(const std::vector<cv::Mat>& images, int topk) const {
  if (images.empty()) return {};
  const detail::ThreadScope relpos_threads_;
  return top_k(logits(make_batch(images, preprocess_)), topk);
}

std::vector<Prediction> Model::classify(const cv::Mat& image, int topk) const {
  return classify(std::vector<cv::Mat>{image}, topk).front();
}

std::vector<Tensor> Model::features(const std::vector<cv::Mat>& images) const {
  RELPOS_CHECK(!images.empty(), "features: no images");
  const detail::ThreadScope relpos_threads_;
  auto maps = network_.infer_features(make_batch(images, preprocess_).to(network_.device()));
  for (auto& m : maps) m = m.to(Device::CPU).contiguous();
  return maps;
}

std::vector<Tensor> Model::features(const cv::Mat& image) const { return features(std::vector<cv::Mat>{image}); }

std::vector<AttentionMaps> Model::attention(const cv::Mat& image) const {
  const detail::ThreadScope relpos_threads_;
  return network_.infer_attention(make_batch({image}, preprocess_).to(network_.device()));
}

namespace {
// The network a file's config builds; an error (a network too large, a block that cannot take its
// map) names the file.
Network network_of_file(const std::string& path, const ModelConfig& config, std::uint32_t seed, bool initialize) {
  try {
    return Network(config, seed, initialize);
  } catch (const Error& e) {
    RELPOS_FAIL(path << ": " << e.what());
  }
}

// The model a file describes, with its labels and preprocessing (the config's defaults where it has
// none); labels or preprocessing that do not fit the network are errors naming the file.
Model model_of_file(const std::string& path, Network net, detail::ModelFile& fc) {
  const Preprocess pre = fc.preprocess ? *fc.preprocess : default_preprocess(fc.config);
  try {
    return Model(std::move(net), std::move(fc.labels), pre);
  } catch (const Error& e) {
    RELPOS_FAIL(path << ": " << e.what());
  }
}
}  // namespace

Model Model::load(const std::string& path, const LoadOptions& options) {
  detail::ModelFile fc = detail::read_weights_file(path, options.config);
  Network net = network_of_file(path, fc.config, 0, /*initialize=*/false);
  if (!fc.int8_layers.empty()) {
    RELPOS_CHECK(options.device == Device::CPU, path << ": an int8 model runs on the CPU only");
    try {
      net.set_int8_layers(fc.int8_layers);
    } catch (const Error& e) {
      RELPOS_FAIL(path << ": quantization: " << e.what());
    }
  }
  detail::assign_tensors(net, fc.tensors, path, &fc.int8_tensors);
  Model m = model_of_file(path, std::move(net), fc);
  m.to(options.device);
  return m;
}

namespace {
// The file open() reads: the path itself, else the name of a shipped model or config
// (models/<name>.json); a path (with '/' or '.') that is not there is "no such file", and a folder
// of a shipped model's name does not hide it.
std::string model_path(const std::string& path_or_name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool looks_like_path = path_or_name.find('/') != std::string::npos || path_or_name.find('.') != std::string::npos;
  if (fs::exists(path_or_name, ec) && (looks_like_path || !fs::is_directory(path_or_name, ec))) return path_or_name;
  // (a folder of that name stays the error it is when there is no such shipped model)
  RELPOS_CHECK(!looks_like_path, path_or_name << ": no such file");
  return find_config(path_or_name);
}
}  // namespace

Model Model::create(const std::string& config, std::uint32_t seed) {
  // a weights file's config inside it made a model of random weights with the file's labels and
  // preprocessing: a classifier that looked trained
  // (a file that is no config says so first: holds_weights takes anything but a config for weights)
  const auto refuse_weights = [&] {
    RELPOS_FAIL(config << ": holds trained weights, which Model::create would not use (it makes random weights from "
                          "a model config); Model::load or Model::open reads them");
  };
  detail::ModelFile fc;
  try {
    fc = detail::read_config_file(config);
  } catch (const Error&) {
    bool safetensors = false;
    try {
      safetensors = holds_weights(config) && detail::is_relpos_model_file(model_path(config));
    } catch (const Error&) {
    }
    if (safetensors) refuse_weights();
    throw;
  }
  if (holds_weights(config)) refuse_weights();
  return model_of_file(config, network_of_file(config, fc.config, seed, /*initialize=*/true), fc);
}


Model Model::open(const std::string& path_or_name, const LoadOptions& options) {
  const std::string path = model_path(path_or_name);
  if (detail::model_file_kind(path) != detail::ModelFileKind::Config) return load(path, options);
  Model m = create(path, options.seed);
  m.to(options.device);
  return m;
}

bool is_relpos_model_file(const std::string& path) { return detail::is_relpos_model_file(path); }

bool holds_weights(const std::string& path_or_name) {
  return detail::model_file_kind(model_path(path_or_name)) != detail::ModelFileKind::Config;  // as open() reads it
}

void Model::save_json(const std::string& path, TensorEncoding encoding) const {
  const std::string text = detail::weights_json_text(*this, encoding);
  detail::write_atomically(path, [&](std::ostream& out) { out << text << '\n'; });
}

void Model::save_safetensors(const std::string& path) const {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::set<std::string> int8;
  for (const ParamRef& p : network_.params()) {
    tensors.emplace_back(p.name, *p.value);
    if (p.int8) int8.insert(p.name);
  }
  write_safetensors(path, tensors, detail::model_metadata(*this, "relpos-weights"), int8);
}

Preprocess default_preprocess(const ModelConfig& config) {
  Preprocess p;
  p.height = config.input_size[0];
  p.width = config.input_size[1];
  if (config.in_chans == 1) {
    p.channels = ChannelOrder::Gray;
    p.mean = {0.5f, 0.5f, 0.5f};
    p.std = {0.5f, 0.5f, 0.5f};
  }
  return p;
}

std::vector<std::string> read_labels(const std::string& path) {
  std::error_code ec;
  RELPOS_CHECK(std::filesystem::exists(path, ec), path << ": no such labels file");
  RELPOS_CHECK(!std::filesystem::is_directory(path, ec), path << ": is a folder; expected a labels file (one label per line)");
  detail::check_regular_file(path, "labels files", /*allow_pipe=*/true);  // <(cut -f2 classes.tsv) reads
  std::ifstream in(path, std::ios::binary);
  RELPOS_CHECK(in, path << ": cannot open the labels file");
  // A label list is small: more than 64 MiB is a mistake, read in blocks so that one without end
  // (a pipe from /dev/zero) stops there instead of filling the memory.
  constexpr std::size_t kMax = std::size_t{64} << 20;
  std::string text;
  char block[1 << 16];
  while (in.read(block, sizeof(block)) || in.gcount() > 0) {
    text.append(block, static_cast<std::size_t>(in.gcount()));
    RELPOS_CHECK(text.size() <= kMax, path << ": more than 64 MiB, too large for a labels file");
  }
  std::istringstream lines(text);
  std::vector<std::string> out;
  std::string line;
  long number = 0, blank = 0;  // the first blank line's number
  while (std::getline(lines, line)) {
    ++number;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) {
      if (blank == 0) blank = number;
      continue;
    }
    // a blank line among the labels would shift every later label by one class if kept, and
    // dropping it silently left the count one short, with no word of where
    RELPOS_CHECK(blank == 0, path << ": line " << blank << " is blank; a labels file has one label per line, in "
                                                         "class order (blank lines only at the end)");
    out.push_back(line);
  }
  RELPOS_CHECK(!out.empty(), path << ": no labels in the file");
  return out;
}

}  // namespace relpos
