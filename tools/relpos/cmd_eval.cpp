// relpos eval: top-1, per-class accuracy and the confusion matrix on a test set.
#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <cctype>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "cli_common.hpp"
#include "progress_bar.hpp"
#include "relpos/trainer.hpp"

namespace relpos::cli {

namespace {
struct EvalArgs {
  ModelOptions model;
  PreprocessOptions pre;
  std::string data = "fashion-mnist", split = "test", png, compare, class_order = "labels";
  std::optional<int> batch;  // default: as many images as 2 GiB of activations hold, at most 500
  int canvas = 0;
  std::string input_size;  // "N" or "HxW"
  bool json = false, quiet = false;
};

// "N" or "HxW" (--input-size)
std::pair<int, int> parse_size(const std::string& text) {
  int h = 0, w = 0;
  char x = 0, extra = 0;
  std::istringstream in(text);
  bool ok = false;
  if (text.find('x') == std::string::npos) {
    ok = static_cast<bool>(in >> h) && !(in >> extra);
    w = h;
  } else {
    ok = static_cast<bool>(in >> h >> x >> w) && x == 'x' && !(in >> extra);
  }
  RELPOS_USAGE_CHECK(ok && h >= 1 && w >= 1 && h <= 4096 && w <= 4096,
                     "--input-size takes N or HxW (1 to 4096 each), got '" << text << "'");
  return {h, w};
}

// A model as eval runs it: loaded, rebuilt for another input size when one is asked for (its position
// tables resampled when they depend on it: docs/attention.md), the preprocessing flags applied.
// --compare's model goes through the same steps, so both see the same images at the same size.
Model eval_model(const ModelOptions& options, const PreprocessOptions& pre, std::optional<std::pair<int, int>> size) {
  Model model = options.load();
  if (size && (size->first != model.network().config().input_size[0] ||
               size->second != model.network().config().input_size[1] || size->first != model.preprocess().height ||
               size->second != model.preprocess().width)) {
    std::string note;
    model = model.at_input_size(size->first, size->second, &note);
    std::cerr << "relpos: running " << options.model << " at " << size->first << "x" << size->second << " input"
              << (note.empty() ? "" : "; " + note) << "\n";
  }
  pre.apply(model);
  return model;
}

// For each class index of `other`, the index of the same class in `model` (--compare): by label when
// both have labels, else by position when the class counts agree.
std::vector<int> class_map(const Model& model, const Model& other, const std::string& other_path) {
  const int n = model.network().config().num_classes, n2 = other.network().config().num_classes;
  std::vector<int> map(static_cast<std::size_t>(n2));
  RELPOS_CHECK(n == n2, "--compare: " << other_path << " has " << n2 << " classes, the model " << n);
  if (model.labels().empty() || other.labels().empty()) {
    for (int c = 0; c < n2; ++c) map[static_cast<std::size_t>(c)] = c;
    return map;
  }
  for (int c = 0; c < n2; ++c) {
    const std::string& label = other.labels()[static_cast<std::size_t>(c)];
    const auto it = std::find(model.labels().begin(), model.labels().end(), label);
    RELPOS_CHECK(it != model.labels().end(),
                 "--compare: " << other_path << "'s class '" << label << "' is not one of the model's labels");
    map[static_cast<std::size_t>(c)] = static_cast<int>(it - model.labels().begin());
  }
  return map;
}

void run(const EvalArgs& a) {
  // a picture that cannot be written fails now, not after the evaluation
  if (!a.png.empty()) check_output_file(a.png, "--png", "the confusion matrix");
  std::optional<std::pair<int, int>> size;
  if (!a.input_size.empty()) size = parse_size(a.input_size);
  else if (a.canvas > 0) size = std::make_pair(a.canvas, a.canvas);
  Model model = eval_model(a.model, a.pre, size);
  // a confusion picture of many classes would be enormous (28 pixels a cell): refused before the work
  constexpr int kMostPictured = 100;
  RELPOS_USAGE_CHECK(a.png.empty() || model.network().config().num_classes <= kMostPictured,
                     "--png: the confusion matrix is drawn for up to " << kMostPictured << " classes; the model has "
                                                                       << model.network().config().num_classes
                                                                       << " (--json holds it as numbers)");
  // --compare's model, checked before any work
  std::optional<Model> m2;
  std::vector<int> same_class;
  if (!a.compare.empty()) {
    ModelOptions other = a.model;
    other.model = a.compare;
    m2.emplace(eval_model(other, a.pre, size));
    same_class = class_map(model, *m2, a.compare);
  }
  // Class folders are matched to the model's labels by name (docs/datasets.md).
  // a folder of class folders (no train/ or test/) is one set: scoring it as "train" would say what it is not
  if (a.split == "train" && a.data != "fashion-mnist" && a.data != "fmnist") {
    namespace fs = std::filesystem;
    std::error_code ec;
    const bool flat = fs::is_directory(a.data, ec) && !fs::is_directory(fs::path(a.data) / "train", ec) &&
                      !fs::is_directory(fs::path(a.data) / "test", ec) && !fs::is_directory(fs::path(a.data) / "val", ec);
    RELPOS_USAGE_CHECK(!flat,
                       "--split train: " << a.data << " has no train/ folder (a folder of class folders is evaluated "
                                                      "as it is, without --split)");
  }
  const auto base = open_dataset(a.data, a.split, model.labels(),
                                 a.class_order == "sorted" ? ClassFolders::Sorted : ClassFolders::ByLabel);
  // what is scored: the split's folder, or a folder of class folders as it is
  std::string scored = a.data + " " + a.split;
  if (a.data != "fashion-mnist" && a.data != "fmnist") {
    std::error_code ec;
    if (!std::filesystem::is_directory(std::filesystem::path(a.data) / a.split, ec)) scored = a.data;
  }
  std::optional<CanvasDataset> on_canvas;
  if (a.canvas > 0) on_canvas.emplace(*base, a.canvas);
  const Dataset* data = on_canvas ? static_cast<const Dataset*>(&*on_canvas) : base.get();
  // 500 images of botnet26t_256 took 7.8 GB: by default, a batch fits 2 GiB of the model's working
  // set (at the size it runs), and a larger model runs smaller batches
  // (estimated at the size the preprocessing gives, which --width/--height may have changed; with
  // --compare, for the larger of the two models)
  int batch = a.batch.value_or(0);
  if (!a.batch) {
    double per_image = 1.0;
    for (const Model* m : {&model, m2 ? &*m2 : nullptr}) {
      if (!m) continue;
      ModelConfig at = m->network().config();
      at.input_size = {m->preprocess().height, m->preprocess().width};
      per_image = std::max(per_image, at.estimate().working_bytes);
    }
    batch = static_cast<int>(std::clamp(2.0 * 1024 * 1024 * 1024 / per_image, 1.0, 500.0));
  }
  ProgressBar bar("eval", a.quiet);
  const EvalResult r = evaluate(model, *data, batch, [&](std::size_t done, std::size_t total) { bar.update(done, total); });
  bar.finish();
  // --compare: the top-1 agreement with another model (an int8 model's float one) on the same images
  double agreement = -1.0;
  if (m2) {
    ProgressBar bar2("eval " + a.compare, a.quiet);
    const EvalResult r2 =
        evaluate(*m2, *data, batch, [&](std::size_t done, std::size_t total) { bar2.update(done, total); });
    bar2.finish();
    RELPOS_CHECK(r2.predictions.size() == r.predictions.size(),
                 "--compare: " << a.compare << " scored " << r2.predictions.size() << " images, the model "
                               << r.predictions.size());
    std::size_t same = 0;
    for (std::size_t i = 0; i < r.predictions.size(); ++i)
      same += r.predictions[i] == same_class[static_cast<std::size_t>(r2.predictions[i])];
    agreement = static_cast<double>(same) / static_cast<double>(r.predictions.size());
  }
  // a class without images (all of them unreadable) has no accuracy, not 0%: null in JSON, named
  // as such in the text, never among the lowest
  std::vector<long> images_of(r.confusion.size(), 0);
  for (std::size_t c = 0; c < r.confusion.size(); ++c)
    for (long v : r.confusion[c]) images_of[c] += v;
  nlohmann::json per_class = nlohmann::json::array();
  for (std::size_t c = 0; c < r.per_class.size(); ++c)
    per_class.push_back(images_of[c] > 0 ? nlohmann::json(r.per_class[c]) : nlohmann::json(nullptr));
  if (a.json) {
    std::string data_hex;  // (a folder name that is not UTF-8: its bytes, as classify --json gives them)
    nlohmann::json j = {{"data", json_safe_name(a.data, &data_hex)}, {"split", scored == a.data ? std::string() : a.split}, {"canvas", a.canvas},
                        {"images", r.count}, {"top1", r.top1}, {"top5", r.top5}, {"loss", r.loss}, {"classes", r.classes}, {"per_class", per_class},
                        {"confusion", r.confusion}, {"skipped", r.skipped}, {"batch", batch}};
    if (!data_hex.empty()) j["data_bytes"] = data_hex;
    if (agreement >= 0) j["agreement"] = {{"model", a.compare}, {"top1", agreement}};
    std::cout << json_text(j) << "\n";
  } else {
    std::cout << std::fixed << std::setprecision(2) << terminal_safe(scored) << ": " << r.count << " images";
    if (r.skipped) std::cout << " (" << r.skipped << " unreadable, skipped)";
    std::cout << ", top-1 " << 100 * r.top1 << "%";
    if (r.classes.size() > 5) std::cout << ", top-5 " << 100 * r.top5 << "%";
    std::cout << ", loss " << std::setprecision(4) << r.loss << "\n";
    // many classes (ImageNet's 1000): the 10 lowest per-class accuracies, and no matrix of text
    constexpr std::size_t kMostListed = 30;
    std::vector<std::size_t> listed;
    for (std::size_t c = 0; c < r.classes.size(); ++c)
      if (r.classes.size() <= kMostListed || images_of[c] > 0) listed.push_back(c);
    if (r.classes.size() > kMostListed) {
      std::stable_sort(listed.begin(), listed.end(),
                       [&](std::size_t x, std::size_t y) { return r.per_class[x] < r.per_class[y]; });
      const std::size_t scored_classes = listed.size();
      listed.resize(std::min<std::size_t>(10, listed.size()));
      std::cout << "per class (the " << listed.size() << " lowest of the " << scored_classes << " classes with images; "
                << "--json has them all):\n";
    } else {
      std::cout << "per class:\n";
    }
    for (const std::size_t c : listed) {
      std::cout << "  " << padded(terminal_safe(r.classes[c]), 16) << std::setprecision(2);
      if (images_of[c] > 0) std::cout << std::setw(7) << 100 * r.per_class[c] << "%\n";
      else std::cout << "  no images\n";
    }
    if (r.classes.size() <= kMostListed) std::cout << format_confusion(r);
    else std::cout << "confusion matrix: " << r.classes.size() << " x " << r.classes.size() << ", in --json\n";
    if (agreement >= 0)
      std::cout << std::setprecision(2) << "top-1 agreement with " << a.compare << ": " << 100 * agreement << "% of "
                << r.count << " images\n";
  }
  if (!a.png.empty()) {
    plot_confusion(r, a.png);
    std::cerr << "relpos: wrote " << a.png << "\n";
  }
  // As classify: images that could not be read make the run a failure, after the results.
  if (r.skipped > 0) {
    std::cerr << "relpos: " << r.skipped << " image" << (r.skipped == 1 ? "" : "s") << " could not be read\n";
    exit_status() = kExitFailure;
  }
}
}  // namespace

void register_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand("eval", "Accuracy, per-class accuracy and confusion matrix on a test set");
  a->model.add(sub);
  sub->add_option("--data", a->data, "fashion-mnist, or a folder (with test/ or of class folders)")->capture_default_str();
  sub->add_option("--split", a->split, "test or train")->check(CLI::IsMember({"test", "train"}))->capture_default_str();
  sub->add_option("--class-order", a->class_order,
                  "How class folders find the model's classes: labels (a folder is named as its class's label) or "
                  "sorted (the folders in sorted name order are classes 0, 1, ...: torchvision's ImageFolder, as "
                  "for ImageNet's val/ of WordNet-ID folders)")
      ->check(CLI::IsMember({"labels", "sorted"}))
      ->capture_default_str();
  sub->add_option("-b,--batch", a->batch,
                  "Images per forward pass (default: as many as 2 GiB of the model's working set holds, at most 500; "
                  "relpos info shows the working set per image)")
      ->check(at_least_one("--batch", "images per forward pass"));
  sub->add_option("--canvas", a->canvas,
                  "Translation data (as train --canvas): each image on a black N x N canvas at a position fixed per "
                  "image; runs the model at N x N unless --input-size says otherwise")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--input-size", a->input_size,
                  "Run the model at this input size (N or HxW): position tables sized for its own input (relative "
                  "without clip, absolute) are resampled (docs/attention.md)");
  sub->add_flag("-q,--quiet", a->quiet, "No progress bar");
  sub->add_option("--png", a->png, "Also draw the confusion matrix into this PNG file")
      ->check(CLI::Validator(
          [](std::string& name) -> std::string {
            std::string lower = name;
            for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            const bool png = lower.size() > 4 && lower.compare(lower.size() - 4, 4, ".png") == 0;
            return png ? std::string() : "the file name must end in .png, got '" + name + "'";
          },
          "FILE.png"));
  sub->add_flag("--json", a->json, "Print one JSON object");
  sub->add_option("--compare", a->compare,
                  "Also score this model on the same images (at the same --input-size, with the same flags) and print "
                  "the top-1 agreement of the two, their classes paired by label (e.g. an int8 model and its float one)");
  a->pre.add(sub);
  sub->callback([a] { run(*a); });
}

}  // namespace relpos::cli
