// relpos: training and evaluation data. Datasets (Fashion-MNIST's IDX files, or a folder with
// one subfolder per class), augmentation, and a loader that assembles batches on background
// threads. Batches depend only on (seed, epoch, position), never on thread timing, so a run
// resumed from a checkpoint sees exactly the batches the uninterrupted run would have.
#pragma once

#include <cstdint>
#include <memory>
#include <opencv2/core.hpp>
#include <string>
#include <utility>
#include <vector>

#include "relpos/preprocess.hpp"
#include "relpos/tensor.hpp"

namespace relpos {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::size_t size() const = 0;
  virtual int label(std::size_t i) const = 0;
  // The image (8-bit, 1 or 3 channels); throws relpos::Error if it cannot be decoded.
  virtual cv::Mat image(std::size_t i) const = 0;
  virtual std::string name(std::size_t i) const = 0;  // for messages
  virtual const std::vector<std::string>& classes() const = 0;
};

// IDX files (optionally gzip-compressed), as Fashion-MNIST and MNIST ship them.
class IdxDataset : public Dataset {
 public:
  IdxDataset(const std::string& images_path, const std::string& labels_path, std::vector<std::string> classes);
  std::size_t size() const override { return labels_.size(); }
  int label(std::size_t i) const override { return labels_[i]; }
  cv::Mat image(std::size_t i) const override;
  std::string name(std::size_t i) const override;
  const std::vector<std::string>& classes() const override { return classes_; }

 private:
  std::string path_;
  int rows_ = 0, cols_ = 0;
  std::vector<std::uint8_t> pixels_;
  std::vector<int> labels_;
  std::vector<std::string> classes_;
};

// How the class folders of a dataset find a model's classes (given its labels).
enum class ClassFolders {
  ByLabel,  // a folder is named as its class's label, with '/' written as '_'
  // The folders in sorted name order are classes 0, 1, ... (torchvision's ImageFolder, as timm's
  // validate.py reads ImageNet's val/ of WordNet-ID folders); as many folders as classes.
  Sorted,
};

// root/<class>/<image files>; classes in sorted folder-name order.
class ImageFolderDataset : public Dataset {
 public:
  // Each subfolder of root is a class. With `labels` (a model's class labels) folders are matched
  // to labels by name: a folder is named as its label, with '/' written as '_' ("T-shirt/top" ->
  // "T-shirt_top"); a folder that is no label, or a label without a folder, is an error naming it.
  // With ClassFolders::Sorted the sorted folders are the labels' classes in order instead.
  // Without labels the classes are the folder names in alphabetical order.
  explicit ImageFolderDataset(const std::string& root, const std::vector<std::string>& labels = {},
                              ClassFolders order = ClassFolders::ByLabel);
  std::size_t size() const override { return files_.size(); }
  int label(std::size_t i) const override { return labels_[i]; }
  cv::Mat image(std::size_t i) const override;
  std::string name(std::size_t i) const override { return files_[i]; }
  const std::vector<std::string>& classes() const override { return classes_; }

 private:
  std::vector<std::string> files_;
  std::vector<int> labels_;
  std::vector<std::string> classes_;
};

inline const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
const std::vector<std::string>& fashion_mnist_classes();
// "fashion-mnist" (Debian's dataset-fashion-mnist package) or a folder of class folders. For a
// folder, split "train"/"test" uses root/train and root/test when they exist, else root itself;
// split "val" uses root/val (an error when there is none).
// With `labels` (a model's), classes are matched by name, or by sorted order (see ImageFolderDataset).
std::unique_ptr<Dataset> open_dataset(const std::string& spec, const std::string& split,
                                      const std::vector<std::string>& labels = {},
                                      ClassFolders order = ClassFolders::ByLabel);
// The folder name that holds a class label's images: the label with '/' written as '_'.
std::string label_folder_name(const std::string& label);

struct Augment {
  int pad = 0;              // random crop of the padded image back to its size (0: off)
  bool hflip = false;       // horizontal flip with probability 1/2
  float erase_prob = 0.0f;  // random erasing (Zhong et al.) with this probability
  float erase_min_area = 0.02f, erase_max_area = 0.25f;
  // > 0: before preprocessing, each image is placed on a black canvas x canvas square at a random
  // position drawn per (seed, epoch, sample) (place_on_canvas); the other augmentations follow.
  int canvas = 0;
};

struct Batch {
  Tensor images;  // (N, C, H, W) channels-last, preprocessed
  std::vector<int> labels;
  std::size_t first = 0;  // position of the first sample in the epoch's order
};

// Produces the batches of one epoch on `workers` background threads (in order). Samples that
// fail to decode are reported once (relpos::set_log_handler) and skipped.
class DataLoader {
 public:
  struct Options {
    int batch = 128;
    bool shuffle = true;
    bool drop_last = true;
    Augment augment;
    std::uint64_t seed = 0;
    int workers = 2;
    int prefetch = 4;
    // Data-parallel training: the epoch's order is cut into global batches of batch x shards
    // images, and this loader yields part `shard` (0-based) of each; batches_per_epoch() counts the
    // global batches. Every shard sees the same order, so shards 0..shards-1 of a batch together
    // hold the images (and augmentations) that one loader with batch x shards would. A shard's
    // part can come out empty (all of its images unreadable): next() then yields the empty batch,
    // where an unsharded loader skips it, so that every shard yields the same number of batches.
    int shards = 1, shard = 0;
  };
  DataLoader(const Dataset& data, const Preprocess& pre, Options options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  std::size_t batches_per_epoch() const;
  // Starts an epoch at batch `start_batch` (to resume in the middle of one).
  void start_epoch(int epoch, std::size_t start_batch = 0);
  // The next batch of the epoch, or false at its end.
  bool next(Batch& out);
  std::size_t skipped() const;  // samples found unreadable so far (reported once each, skipped)

 private:
  struct Impl;  // threads, queue and locks: src/train/data_loader.cpp
  std::unique_ptr<Impl> impl_;
};

// The translation data of the position experiment: `item` (8-bit, 1 or 3 channels, at most
// canvas x canvas) copied onto a black canvas x canvas image of its type with its top-left corner at
// (y, x) = canvas_offset(...). Throws relpos::Error when the item does not fit.
cv::Mat place_on_canvas(const cv::Mat& item, int canvas, std::uint64_t seed);
// Where place_on_canvas puts an item of h x w: y uniform in [0, canvas - h], x in [0, canvas - w],
// drawn from `seed`.
std::pair<int, int> canvas_offset(int h, int w, int canvas, std::uint64_t seed);

// Throws relpos::Error naming --canvas when the data's first image is larger than the canvas.
void check_fits_canvas(const Dataset& data, int canvas);

// A dataset whose images are placed on a canvas x canvas black square at a position fixed per
// sample (drawn from the sample's index and `seed`, the same in every run): the evaluation side of
// Augment::canvas. `base` must outlive it.
class CanvasDataset : public Dataset {
 public:
  static constexpr std::uint64_t kDefaultSeed = 0x63616e766173ull;  // "canvas"
  CanvasDataset(const Dataset& base, int canvas, std::uint64_t seed = kDefaultSeed);
  std::size_t size() const override { return base_.size(); }
  int label(std::size_t i) const override { return base_.label(i); }
  cv::Mat image(std::size_t i) const override;
  std::string name(std::size_t i) const override { return base_.name(i); }
  const std::vector<std::string>& classes() const override { return base_.classes(); }
  std::uint64_t sample_seed(std::size_t i) const;  // the seed place_on_canvas gets for sample i

 private:
  const Dataset& base_;
  int canvas_;
  std::uint64_t seed_;
};

// Deterministic per-sample randomness: a generator seeded from (seed, epoch, index).
std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t epoch, std::uint64_t index);

// Applies the augmentation to one preprocessed image (H, W, C floats, in place); padding
// takes the per-channel value `fill`, erased areas become 0.
void augment_image(float* hwc, int h, int w, int c, const Augment& aug, const float* fill, std::uint64_t seed);

}  // namespace relpos
