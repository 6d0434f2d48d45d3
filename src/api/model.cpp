#include "relpos/model.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "relpos/error.hpp"
#include "relpos/ops.hpp"

namespace relpos {

Model::Model(Network network, std::vector<std::string> labels, Preprocess preprocess)
    : network_(std::move(network)) {
  set_labels(std::move(labels));
  set_preprocess(preprocess);
}

void Model::set_labels(std::vector<std::string> labels) {
  RELPOS_CHECK(labels.empty() || static_cast<int>(labels.size()) == network_.config().num_classes,
               labels.size() << " labels for a model with " << network_.config().num_classes << " classes");
  labels_ = std::move(labels);
}

void Model::set_preprocess(const Preprocess& p) {
  RELPOS_CHECK(p.in_chans() == network_.config().in_chans,
               "preprocessing gives " << p.in_chans() << "-channel input (" << p.channels << ") but "
                                      << network_.config().name << " takes " << network_.config().in_chans);
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
  detail::apply_thread_setting();
  Tensor out = network_.infer(batch.to(network_.device())).to(Device::CPU);
  if (preprocess_.tta == "hflip") {
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
  const auto v = logits.to_vector();
  const std::int64_t n = logits.dim(0), c = logits.dim(1);
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
  detail::apply_thread_setting();
  return top_k(logits(make_batch(images, preprocess_)), topk);
}

std::vector<Prediction> Model::classify(const cv::Mat& image, int topk) const {
  return classify(std::vector<cv::Mat>{image}, topk).front();
}

std::vector<Tensor> Model::features(const std::vector<cv::Mat>& images) const {
  RELPOS_CHECK(!images.empty(), "features: no images");
  detail::apply_thread_setting();
  auto maps = network_.infer_features(make_batch(images, preprocess_).to(network_.device()));
  for (auto& m : maps) m = m.to(Device::CPU).contiguous();
  return maps;
}

std::vector<Tensor> Model::features(const cv::Mat& image) const { return features(std::vector<cv::Mat>{image}); }

}  // namespace relpos
