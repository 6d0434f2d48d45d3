// Datasets: IDX files (Fashion-MNIST) and folders of class folders.
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>

#include "core/environment.hpp"
#include "core/checked_math.hpp"
#include "core/name_list.hpp"
#include "io/json_reader.hpp"
#include "relpos/data.hpp"
#include "relpos/error.hpp"

namespace relpos {

namespace fs = std::filesystem;

namespace {

std::vector<std::uint8_t> read_maybe_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files too
  RELPOS_CHECK(f != nullptr, "cannot open '" << path << "'");
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.insert(out.end(), buf, buf + n);
  int err = 0;
  const char* msg = gzerror(f, &err);
  const std::string message = msg ? msg : "";
  gzclose(f);
  RELPOS_CHECK(n == 0 && err == Z_OK, path << ": cannot decompress (" << message << "); truncated or corrupt file?");
  return out;
}

std::uint32_t be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

// Returns the dimensions of an unsigned-byte IDX array and the offset of its data.
std::vector<std::uint32_t> idx_header(const std::vector<std::uint8_t>& b, const std::string& path, int want_dims) {
  RELPOS_CHECK(b.size() >= 4 && b[0] == 0 && b[1] == 0, path << ": not an IDX file (bad magic number)");
  RELPOS_CHECK(b[2] == 0x08, path << ": IDX data type " << int{b[2]} << " is not unsigned bytes");
  RELPOS_CHECK(b[3] == want_dims, path << ": IDX array has " << int{b[3]} << " dimensions, expected " << want_dims);
  RELPOS_CHECK(b.size() >= 4 + 4u * static_cast<std::size_t>(want_dims), path << ": truncated IDX header");
  std::vector<std::uint32_t> dims;
  std::uint64_t total = 1;
  for (int i = 0; i < want_dims; ++i) {
    dims.push_back(be32(b.data() + 4 + 4 * i));
    total = checked_mul(total, dims.back(), path + ": IDX dimension " + std::to_string(i));
  }
  // images: rows and columns become cv::Mat ints; keep them positive and small enough for any image
  for (int i = 1; i < want_dims; ++i)
    RELPOS_CHECK(dims[static_cast<std::size_t>(i)] >= 1 && dims[static_cast<std::size_t>(i)] <= 65536,
                 path << ": IDX dimension " << i << " is " << dims[static_cast<std::size_t>(i)]
                      << ", outside 1..65536");
  const std::size_t have = b.size() - 4 - 4u * static_cast<std::size_t>(want_dims);
  RELPOS_CHECK(have == total, path << ": IDX header promises " << total << " bytes of data, the file holds " << have);
  return dims;
}

}  // namespace

IdxDataset::IdxDataset(const std::string& images_path, const std::string& labels_path, std::vector<std::string> classes)
    : path_(images_path), classes_(std::move(classes)) {
  const auto img = read_maybe_gzip(images_path);
  const auto lab = read_maybe_gzip(labels_path);
  const auto d = idx_header(img, images_path, 3);
  const auto dl = idx_header(lab, labels_path, 1);
  RELPOS_CHECK(d[0] == dl[0], images_path << " holds " << d[0] << " images but " << labels_path << " " << dl[0]
                                          << " labels");
  rows_ = static_cast<int>(d[1]), cols_ = static_cast<int>(d[2]);
  pixels_.assign(img.begin() + 16, img.end());
  for (std::size_t i = 0; i < dl[0]; ++i) {
    const int y = lab[8 + i];
    RELPOS_CHECK(y < static_cast<int>(classes_.size()), labels_path << ": label " << y << " of sample " << i
                                                                    << " is not one of the " << classes_.size()
                                                                    << " classes");
    labels_.push_back(y);
  }
}

cv::Mat IdxDataset::image(std::size_t i) const {
  RELPOS_CHECK(i < size(), "sample " << i << " out of range");
  // a copy: a view into the dataset's pixels would outlive it in a caller's batch (quantize's last,
  // partial calibration batch did, and crashed)
  return cv::Mat(rows_, cols_, CV_8UC1, const_cast<std::uint8_t*>(pixels_.data() + i * static_cast<std::size_t>(rows_) * cols_))
      .clone();
}

std::string IdxDataset::name(std::size_t i) const { return path_ + "[" + std::to_string(i) + "]"; }

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> c = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                             "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return c;
}


std::string label_folder_name(const std::string& label) {
  std::string f = label;
  for (char& ch : f)
    if (ch == '/') ch = '_';
  return f;
}

ImageFolderDataset::ImageFolderDataset(const std::string& root, const std::vector<std::string>& labels,
                                       ClassFolders order) {
  RELPOS_CHECK(fs::is_directory(root), "'" << root << "' is not a folder");
  std::vector<std::string> folders;
  std::error_code list_ec;
  fs::directory_iterator listing(root, list_ec);
  RELPOS_CHECK(!list_ec, root << ": cannot read the folder (" << list_ec.message() << ")");
  for (const auto& e : listing) {
    std::error_code ec;
    if (e.path().filename().string().rfind('.', 0) == 0) continue;  // hidden (.ipynb_checkpoints/): not a class
    if (e.is_directory(ec)) folders.push_back(e.path().filename().string());
    // a class folder's link whose target is gone would silently drop that class
    RELPOS_CHECK(!(e.is_symlink(ec) && !fs::exists(e.path(), ec)),
                 e.path().string() << ": broken symbolic link: its target '" << fs::read_symlink(e.path(), ec).string()
                                   << "' does not exist");
  }
  std::sort(folders.begin(), folders.end());
  RELPOS_CHECK(!folders.empty(), root << ": no class folders (expected " << root << "/<class>/<images>)");
  for (const std::string& f : folders)  // a folder's name becomes a label, which a model file stores as JSON text
    RELPOS_CHECK(detail::valid_utf8(f), (fs::path(root) / detail::printable_utf8(f)).string()
                                            << ": a class folder's name must be valid UTF-8 (it is the class's label)");
  // Which class each folder holds: by name when the labels are known, else alphabetical.
  std::vector<int> class_of(folders.size());
  const auto label_of = [&](const std::string& folder) {  // the label a folder is named as (-1: none)
    for (std::size_t l = 0; l < labels.size(); ++l)
      if (folder == labels[l] || folder == label_folder_name(labels[l])) return static_cast<int>(l);
    return -1;
  };
  if (labels.empty() || order == ClassFolders::Sorted) {
    RELPOS_CHECK(labels.empty() || folders.size() == labels.size(),
                 root << ": " << folders.size() << " class folders, but the model has " << labels.size()
                      << " classes (in sorted order the folders are classes 0 to " << labels.size() - 1
                      << ", so there must be as many)");
    // folders named as the labels, in another order than the classes': sorted order would give each
    // folder another class's number
    if (!labels.empty()) {
      std::size_t named = 0, misplaced = 0;
      for (std::size_t f = 0; f < folders.size(); ++f)
        if (const int l = label_of(folders[f]); l >= 0) {
          ++named;
          misplaced += static_cast<std::size_t>(l) != f;
        }
      RELPOS_CHECK(named < folders.size() || misplaced == 0,
                   root << ": the class folders are named as the model's labels, but their sorted order is not the "
                           "classes' order; match them by name (ClassFolders::ByLabel, relpos eval --class-order labels)");
    }
    classes_ = labels.empty() ? folders : labels;
    for (std::size_t f = 0; f < folders.size(); ++f) class_of[f] = static_cast<int>(f);
  } else {
    classes_ = labels;
    // a folder holds one class: two labels with one folder name cannot both be found
    std::map<std::string, std::size_t> class_in;
    for (std::size_t l = 0; l < labels.size(); ++l) {
      const auto [it, fresh] = class_in.emplace(label_folder_name(labels[l]), l);
      RELPOS_CHECK(fresh, root << ": the model's classes " << it->second << " ('" << labels[it->second] << "') and " << l
                               << " ('" << labels[l] << "') would both be in folder '" << it->first
                               << "'; give them different labels (--labels) to use class folders");
    }
    std::vector<bool> found(labels.size(), false);
    std::size_t named = 0;
    for (std::size_t f = 0; f < folders.size(); ++f) named += label_of(folders[f]) >= 0;
    for (std::size_t f = 0; f < folders.size(); ++f) {
      const int c = label_of(folders[f]);
      // folders none of which names a label may hold the classes in sorted order (ImageNet's WordNet IDs)
      RELPOS_CHECK(c >= 0, root << ": folder '" << folders[f] << "' is not one of the model's " << labels.size()
                                << " class labels (" << detail::listed_names(labels, 8) << "; a label names its folder, with '/' written as '_'"
                                << (named == 0 && folders.size() == labels.size()
                                        ? "; folders that hold the classes in sorted order, as ImageNet's WordNet IDs do: "
                                          "ClassFolders::Sorted, relpos eval --class-order sorted"
                                        : "")
                                << ")");
      class_of[f] = c;
      found[static_cast<std::size_t>(c)] = true;
    }
    for (std::size_t l = 0; l < labels.size(); ++l)
      RELPOS_CHECK(found[l], root << ": no folder for class '" << labels[l] << "' (expected " << root << "/"
                                  << label_folder_name(labels[l]) << "/"
                                  << (label_folder_name(labels[l]).rfind('.', 0) == 0
                                          ? "; a folder whose name starts with '.' is hidden, never a class"
                                          : "")
                                  << ")");
  }
  // A link inside a class folder may lead into another class's folder (or above it): its images would
  // then count for two classes. Every folder images come from, links resolved, belongs to one class.
  std::map<std::string, std::pair<std::size_t, std::string>> owner;  // real folder -> class folder, path
  std::map<std::string, std::string> real_of;                        // folder as listed -> real folder
  for (std::size_t f = 0; f < folders.size(); ++f) {
    std::vector<std::string> images = find_images((fs::path(root) / folders[f]).string());
    RELPOS_CHECK(!images.empty(), root << ": class folder '" << folders[f] << "' holds no images");
    for (const auto& i : images) {
      const std::string dir = fs::path(i).parent_path().string();
      auto [r, fresh] = real_of.emplace(dir, std::string());
      if (!fresh) continue;
      std::error_code ec;
      r->second = fs::canonical(dir, ec).string();
      if (ec) r->second = dir;
      const auto [o, first] = owner.emplace(r->second, std::make_pair(f, dir));
      RELPOS_CHECK(first || o->second.first == f,
                   root << ": the images in " << r->second << " are reached both from class folder '" << folders[o->second.first]
                        << "' (as " << o->second.second << ") and from '" << folders[f] << "' (as " << dir
                        << "): a symbolic link leads from one class folder into another; each image must belong to one class");
    }
    for (auto& i : images) {
      files_.push_back(std::move(i));
      labels_.push_back(class_of[f]);
    }
  }
  // so can a link to one image: its target's folder, if a class's, must be the link's class's
  for (std::size_t k = 0; k < files_.size(); ++k) {
    std::error_code ec;
    if (!fs::is_symlink(files_[k], ec)) continue;
    const fs::path target = fs::canonical(files_[k], ec);
    if (ec) continue;  // reading it will say what is wrong
    const auto o = owner.find(target.parent_path().string());
    RELPOS_CHECK(o == owner.end() || class_of[o->second.first] == labels_[static_cast<std::size_t>(k)],
                 root << ": " << files_[k] << " is a symbolic link to " << target.string() << ", an image of class folder '"
                      << folders[o->second.first] << "'; each image must belong to one class");
  }
}

cv::Mat ImageFolderDataset::image(std::size_t i) const { return read_image(files_[i]); }

namespace {
// A dataset whose classes are given in another order (a model's labels): label i of the inner
// dataset is class to_[i] here.
class ReorderedClasses : public Dataset {
 public:
  ReorderedClasses(std::unique_ptr<Dataset> inner, std::vector<std::string> classes)
      : inner_(std::move(inner)), classes_(std::move(classes)) {
    for (const std::string& c : inner_->classes())
      to_.push_back(static_cast<int>(std::find(classes_.begin(), classes_.end(), c) - classes_.begin()));
  }
  std::size_t size() const override { return inner_->size(); }
  int label(std::size_t i) const override { return to_[static_cast<std::size_t>(inner_->label(i))]; }
  cv::Mat image(std::size_t i) const override { return inner_->image(i); }
  std::string name(std::size_t i) const override { return inner_->name(i); }
  const std::vector<std::string>& classes() const override { return classes_; }

 private:
  std::unique_ptr<Dataset> inner_;
  std::vector<std::string> classes_;
  std::vector<int> to_;
};
}  // namespace

std::unique_ptr<Dataset> open_dataset(const std::string& spec, const std::string& split,
                                      const std::vector<std::string>& labels, ClassFolders order) {
  RELPOS_CHECK(split == "train" || split == "test" || split == "val",
               "split must be train, val or test, got '" << split << "'");
  if (spec == "fashion-mnist" || spec == "fmnist") {
    RELPOS_CHECK(split != "val", "Fashion-MNIST has no val split (hold out part of train with --val-split)");
    const char* env = detail::setting("RELPOS_FASHION_MNIST");
    const std::string dir = env ? env : kFashionMnistDir;
    const std::string stem = split == "train" ? "train" : "t10k";
    const std::string images = dir + "/" + stem + "-images-idx3-ubyte.gz";
    RELPOS_CHECK(fs::exists(images),
                 "Fashion-MNIST not found at " << dir
                                               << (env ? " (RELPOS_FASHION_MNIST): no " + stem + "-images-idx3-ubyte.gz there"
                                                       : std::string(" (install it: apt-get install dataset-fashion-mnist)")));
    // the model's labels may be Fashion-MNIST's in another order (a model trained on class folders
    // in sorted order): matched by name, as class folders are
    std::vector<std::string> sorted_labels = labels, sorted_classes = fashion_mnist_classes();
    std::sort(sorted_labels.begin(), sorted_labels.end());
    std::sort(sorted_classes.begin(), sorted_classes.end());
    RELPOS_CHECK(labels.empty() || sorted_labels == sorted_classes,
                 "the model's " << labels.size() << " class labels are not Fashion-MNIST's (first: '"
                                << (labels.empty() ? "" : labels[0]) << "'; expected 'T-shirt/top', 'Trouser', ...)");
    auto idx = std::make_unique<IdxDataset>(images, dir + "/" + stem + "-labels-idx1-ubyte.gz", fashion_mnist_classes());
    if (labels.empty() || labels == fashion_mnist_classes()) return idx;
    return std::make_unique<ReorderedClasses>(std::move(idx), labels);
  }
  const fs::path sub = fs::path(spec) / split;
  if (fs::is_directory(sub)) return std::make_unique<ImageFolderDataset>(sub.string(), labels, order);
  // DIR itself holds the class folders only when it has no split folders at all: with test/ but no
  // train/, asking for train is an error, not DIR's split folders taken for classes.
  std::string splits;
  for (const char* s : {"train", "test", "val"})
    if (fs::is_directory(fs::path(spec) / s)) splits += std::string(splits.empty() ? "" : ", ") + s + "/";
  RELPOS_CHECK(split != "val" && splits.empty(),
               spec << ": no " << split << "/ folder" << (splits.empty() ? "" : " (it has " + splits + ")"));
  return std::make_unique<ImageFolderDataset>(spec, labels, order);
}

}  // namespace relpos
