#include "cli_common.hpp"

#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/atomic_file.hpp"
#include "relpos/error.hpp"

namespace relpos::cli {

namespace fs = std::filesystem;

void ModelOptions::add(CLI::App* app, bool model_required) {
  auto* m = app->add_option("-m,--model", model,
                            "Model: relpos weights (.json), a .safetensors file, or a model config / shipped config name "
                            "(random weights)");
  if (model_required) m->required();
  app->add_option("--config", config, "Architecture for a timm .safetensors file (config path or shipped name)");
  app->add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda", "cuda:0", "gpu"}));
  app->add_option("--threads", threads, "CPU threads (default: all cores)")->check(CLI::NonNegativeNumber);
}

void set_threads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

int threads_in_use() { return omp_get_max_threads(); }

int& exit_status() {
  static int status = 0;
  return status;
}

Model ModelOptions::load() const {
  set_threads(threads);
  LoadOptions opt;
  opt.config = config;
  opt.device = parse_device(device);
  // A config (file with "stages", or a shipped name) gives a model with random weights.
  bool is_config = !fs::exists(model);
  if (!is_config && model.size() > 5 && model.compare(model.size() - 5, 5, ".json") == 0) {
    const auto j = nlohmann::json::parse(detail::read_file(model), nullptr, false);
    is_config = j.is_object() && j.contains("stages") && !j.contains("tensors");
  }
  if (is_config) {
    Model m = Model::create(model);
    m.to(opt.device);
    return m;
  }
  return Model::load(model, opt);
}

void PreprocessOptions::add(CLI::App* app) {
  const std::string g = "Preprocessing (overrides the model file; OpenCV dnn sample names)";
  app->add_option("--width", width, "Network input width")->group(g);
  app->add_option("--height", height, "Network input height")->group(g);
  app->add_option("--mean", mean, "Mean to subtract, in pixel units (0..255), model channel order")->group(g)->expected(1, 3);
  app->add_option("--std", std, "Standard deviation to divide by, after scaling")->group(g)->expected(1, 3);
  app->add_option("--scale", scale, "Pixel scale factor (e.g. 0.00392 = 1/255)")->group(g);
  app->add_flag("--rgb,!--bgr", rgb, "Model takes RGB (or BGR) input")->group(g);
  app->add_flag("--crop,!--no-crop", crop, "Resize keeping the aspect ratio and centre-crop (or stretch)")->group(g);
  app->add_option("--interpolation", interpolation, "nearest, bilinear, bicubic or area")
      ->group(g)
      ->check(CLI::IsMember({"nearest", "bilinear", "bicubic", "area"}));
  app->add_option("--tta", tta, "Test-time augmentation: none, or hflip (mean logits of the image and its mirror)")
      ->group(g)
      ->check(CLI::IsMember({"none", "hflip"}));
  app->add_option("--labels", labels, "Class labels file, one per line");
}

void PreprocessOptions::apply(Model& model) const {
  Preprocess p = model.preprocess();
  if (width) p.width = *width;
  if (height) p.height = *height;
  if (scale) p.scale = *scale;
  // OpenCV's (pixel - mean) * scale / std: our mean is after scaling.
  for (std::size_t c = 0; c < 3 && !mean.empty(); ++c) p.mean[c] = mean[mean.size() == 1 ? 0 : c] * p.scale;
  for (std::size_t c = 0; c < 3 && !std.empty(); ++c) p.std[c] = std[std.size() == 1 ? 0 : c];
  for (float s : p.std) RELPOS_CHECK(s != 0.0f, "--std must not be zero");
  if (rgb && p.channels != "GRAY") p.channels = *rgb ? "RGB" : "BGR";
  if (crop) p.crop = *crop;
  if (interpolation) p.interpolation = *interpolation;
  if (tta) p.tta = *tta;
  model.set_preprocess(p);
  if (!labels.empty()) model.set_labels(read_labels(labels));
}


std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs, std::vector<std::string>& errors) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, fs::directory_options::skip_permission_denied, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file(ec) && has_image_extension(it->path().string())) found.push_back(it->path().string());
      if (found.empty()) errors.push_back(in + ": folder holds no images");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(in, ec)) {
      files.push_back(in);
    } else {
      errors.push_back(in + ": no such file or folder");
    }
  }
  return files;
}

}  // namespace relpos::cli
