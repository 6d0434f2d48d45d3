// relpos: a loaded model ready for a vision pipeline: network + class labels + preprocessing.
//
//   auto model = relpos::Model::load("models/botnet-fmnist.json");   // or a .safetensors file
//   auto top5 = model.classify(relpos::read_image("shirt.png"));      // OpenCV in (any BGR cv::Mat)
//   auto maps = model.features(image);                                // feature map per stage
//
// classify(), features() and logits() are const and may be called from many threads on one
// loaded model at the same time.
#pragma once

#include <opencv2/core.hpp>
#include <string>
#include <vector>

#include "relpos/error.hpp"  // relpos::Error, what every call here throws
#include "relpos/network.hpp"
#include "relpos/runtime.hpp"
#include "relpos/preprocess.hpp"

namespace relpos {

struct Prediction {
  int index = 0;
  std::string label;
  float probability = 0.0f;
  float logit = 0.0f;
};

struct LoadOptions {
  // Architecture for a file that does not carry one (a timm .safetensors checkpoint): a config
  // path or the name of a shipped config ("botnet26t_256").
  std::string config;
  Device device = Device::CPU;
  std::uint32_t seed = 0;  // Model::open of a config: the random weights' seed
};

enum class TensorEncoding { Base64, Numbers };

class Model {
 public:
  // A relpos weights JSON file, or a safetensors file (written by relpos, or timm's with
  // options.config). Throws relpos::Error naming the problem (unknown, missing or mis-shaped
  // tensor, wrong format or version, ...).
  static Model load(const std::string& path, const LoadOptions& options = {});
  // A fresh model (random weights drawn with `seed`) from a config path or shipped name (a file
  // holding trained weights is refused: load or open reads it).
  static Model create(const std::string& config, std::uint32_t seed = 0);
  // Whatever the argument names: a weights file (as load), or a config file or shipped config
  // name (as create, with random weights). What a file holds is read from its contents, not its
  // name. Implemented with the rest of Model in src/model/model.cpp.
  static Model open(const std::string& path_or_name, const LoadOptions& options = {});
  Model(Network network, std::vector<std::string> labels, Preprocess preprocess);

  // The weights JSON of docs/formats.md (written atomically).
  void save_json(const std::string& path, TensorEncoding encoding = TensorEncoding::Base64) const;
  // safetensors with timm's tensor names; config, labels and preprocessing in __metadata__.
  void save_safetensors(const std::string& path) const;

  std::vector<Prediction> classify(const cv::Mat& image, int topk = 5) const;
  std::vector<std::vector<Prediction>> classify(const std::vector<cv::Mat>& images, int topk = 5) const;
  // Feature maps (stem, then every stage), each (1, C, h, w) contiguous on the CPU.
  std::vector<Tensor> features(const cv::Mat& image) const;
  // The same for a batch in one pass: per stage, (N, C, h, w) for the N images.
  std::vector<Tensor> features(const std::vector<cv::Mat>& images) const;
  // What every attention layer computed for the image (relpos/attention_maps.hpp), one view (no
  // test-time mirror averaging), in network order; empty for a model without attention.
  std::vector<AttentionMaps> attention(const cv::Mat& image) const;
  // Logits for a preprocessed batch (N, C, H, W); with the preprocessing's tta "hflip", the mean
  // of the batch's and its mirror image's.
  Tensor logits(const Tensor& batch) const;
  // Top-k predictions from logits (N, classes).
  std::vector<std::vector<Prediction>> top_k(const Tensor& logits, int k) const;

  // This model built for another input size (height x width: its config's input_size and its
  // preprocessing's size). Every tensor is kept, except the position tables sized for the old input
  // (relative positions without clip, absolute positions), which are resampled: bilinear over the
  // 2D grid for absolute tables, linear over the offsets for relative ones (docs/attention.md).
  // `note`, when given, gets a sentence naming the resampled tables ("" when none was).
  Model at_input_size(int height, int width, std::string* note = nullptr) const;

  Network& network() { return network_; }
  const Network& network() const { return network_; }
  const std::vector<std::string>& labels() const { return labels_; }
  void set_labels(std::vector<std::string> labels);
  const Preprocess& preprocess() const { return preprocess_; }
  void set_preprocess(const Preprocess& p);
  void to(Device device) { network_.to(device); }
  Device device() const { return network_.device(); }

 private:
  Network network_;
  std::vector<std::string> labels_;
  Preprocess preprocess_;
};

// Whether Model::open(path_or_name) would load trained weights (a weights file or a training
// checkpoint) rather than create random ones (a config file or shipped config name).
bool holds_weights(const std::string& path_or_name);
// Whether path holds a model file relpos wrote (weights JSON, or safetensors whose metadata says
// relpos-weights): what relpos's commands replace when told to write a model there. False for
// anything else (a config, a timm checkpoint, a training checkpoint, an image) and for a file that
// cannot be read.
bool is_relpos_model_file(const std::string& path);

// The default preprocessing for a config (ImageNet statistics, or 0.5/0.5 for one channel).
Preprocess default_preprocess(const ModelConfig& config);
// Reads class labels, one per line (blank lines ignored).
std::vector<std::string> read_labels(const std::string& path);

}  // namespace relpos
