// relpos quantize: a float model to an int8 one (docs/int8.md), calibrated on images.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli_common.hpp"
#include "relpos/data.hpp"
#include "relpos/quantize.hpp"

namespace relpos::cli {

namespace {
struct QuantizeArgs {
  ModelOptions model;
  std::string calib, out, method = "percentile";
  std::vector<std::string> keep_float;
  double percentile = 99.99;
  int samples = 1000, batch = 50, sensitivity = 32;
  bool quiet = false;
};

// `samples` images spread evenly over the calibration source, preprocessed in batches.
std::vector<Tensor> calibration_batches(const QuantizeArgs& a, const Model& model) {
  const Preprocess& pre = model.preprocess();
  std::vector<cv::Mat> images;
  std::vector<Tensor> batches;
  std::size_t skipped = 0;
  const auto flush = [&] {
    if (!images.empty()) batches.push_back(make_batch(images, pre));
    images.clear();
  };
  const auto add = [&](const cv::Mat& m) {
    images.push_back(m);
    if (static_cast<int>(images.size()) == a.batch) flush();
  };
  if (a.calib == "fashion-mnist") {
    const auto data = open_dataset("fashion-mnist", "train");
    const std::size_t n = std::min<std::size_t>(data->size(), static_cast<std::size_t>(a.samples));
    for (std::size_t i = 0; i < n; ++i) add(data->image(i * data->size() / n));
  } else {
    std::error_code ec;
    RELPOS_CHECK(std::filesystem::is_directory(a.calib, ec),
                 "--calib " << a.calib << ": not a folder (expected a folder of images or fashion-mnist)");
    std::vector<std::pair<std::string, std::string>> errors;
    const std::vector<std::string> files = expand_inputs({a.calib}, errors);
    RELPOS_CHECK(!files.empty(), "--calib " << a.calib << ": "
                                            << (errors.empty() ? "no images"
                                                               : errors.front().first + ": " + errors.front().second));
    for (const auto& [path, why] : errors) std::cerr << "relpos: skipped calibration image " << path << ": " << why << "\n";
    if (!errors.empty()) exit_status() = 1;  // as classify and eval: the failures reported, the work done
    const std::size_t n = std::min<std::size_t>(files.size(), static_cast<std::size_t>(a.samples));
    for (std::size_t i = 0; i < n; ++i) {
      const std::string& f = files[i * files.size() / n];
      try {
        add(read_image(f));
      } catch (const std::exception& e) {
        std::cerr << "relpos: skipped calibration image " << e.what() << "\n";
        ++skipped;
        exit_status() = 1;
      }
    }
    RELPOS_CHECK(skipped < n, "--calib " << a.calib << ": none of its " << n << " images could be read");
  }
  flush();
  return batches;
}

void run(const QuantizeArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  RELPOS_USAGE_CHECK(ends_with(a.out, ".json") || ends_with(a.out, ".safetensors"),
                     "--out '" << a.out << "' must end in .json or .safetensors");
  check_output_file(a.out, "--out", "the int8 model", a.model.model, /*model=*/true);  // now, not after the calibration
  QuantizeOptions opt;
  try {
    opt.method = parse_calibration(a.method);
  } catch (const Error& e) {
    RELPOS_USAGE_CHECK(false, "--method: " << e.what());
  }
  opt.percentile = a.percentile;
  opt.sensitivity_images = a.sensitivity;
  for (std::string item : a.keep_float) {  // "a, b" and repeated flags as "a,b"
    const auto space = [](unsigned char c) { return std::isspace(c) != 0; };
    while (!item.empty() && space(static_cast<unsigned char>(item.back()))) item.pop_back();
    std::size_t first = 0;
    while (first < item.size() && space(static_cast<unsigned char>(item[first]))) ++first;
    if (first < item.size()) opt.keep_float.push_back(item.substr(first));
  }
  Model model = a.model.load();
  RELPOS_CHECK(model.device() == Device::CPU, "quantize runs on the CPU (int8 models run on the CPU only)");
  // a bad value of the flag: a usage error, before the calibration images are read
  const std::vector<std::string> layers = model.network().quantizable_layers();
  for (const std::string& k : opt.keep_float)
    RELPOS_USAGE_CHECK(std::find(layers.begin(), layers.end(), k) != layers.end(),
                       "--keep-float: '" << k << "' is not a layer of " << model.network().config().name
                                         << " that can run in int8 (relpos quantize lists them)");
  const std::vector<Tensor> calib = calibration_batches(a, model);
  QuantizeReport r;
  try {
    r = quantize(model, calib, opt);
  } catch (const Error& e) {
    RELPOS_FAIL(a.model.model << ": " << e.what());
  }
  if (!a.quiet) {
    std::cout << "calibration: " << r.calibration_images << " images from " << a.calib << ", method "
              << to_string(opt.method);
    if (opt.method == Calibration::Percentile) std::cout << " (" << opt.percentile << "%)";
    std::cout << "\n"
              << std::left << std::setw(40) << "layer" << std::setw(7) << "type" << std::right << std::setw(12)
              << "input min" << std::setw(12) << "input max" << std::setw(13) << "scale" << std::setw(14)
              << "sensitivity" << "\n";
    for (const LayerQuantization& l : r.layers) {
      std::cout << std::left << std::setw(40) << l.name << std::setw(7)
                << (l.int8 ? (l.input_signed ? "s8" : "u8") : "float") << std::right << std::setprecision(4)
                << std::setw(12) << l.input_min << std::setw(12) << l.input_max << std::setw(13)
                << std::scientific << std::setprecision(3) << l.input_scale << std::defaultfloat;
      if (l.sensitivity >= 0) std::cout << std::setw(14) << std::setprecision(3) << std::scientific << l.sensitivity
                                        << std::defaultfloat;
      std::cout << "\n";
    }
    if (r.check_images > 0)
      std::cout << "(sensitivity: relative RMS error of the logits with only that layer in int8, on "
                << r.check_images << " calibration images)\n";
    if (r.check_images > 0)
      std::cout << std::fixed << std::setprecision(4) << "int8 model on those images: logits error "
                << r.logits_error << ", top-1 agreement with float " << std::setprecision(2)
                << 100 * r.top1_agreement << "%\n";
  }
  if (ends_with(a.out, ".safetensors")) model.save_safetensors(a.out);
  else model.save_json(a.out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::size_t n8 = 0;
  for (const LayerQuantization& l : r.layers) n8 += l.int8;
  std::cerr << std::fixed << std::setprecision(1) << "relpos: wrote " << a.out << " (" << n8 << " of "
            << r.layers.size() << " layers int8) in " << s << " s\n";
}
}  // namespace

void register_quantize(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* sub = app.add_subcommand("quantize", "Quantize a float model to int8, calibrated on images");
  a->model.add(sub);
  sub->add_option("--calib", a->calib, "Calibration images: a folder (searched recursively) or fashion-mnist (train)")
      ->required();
  sub->add_option("-n,--samples", a->samples, "How many calibration images (spread evenly over the source)")
      ->check(at_least_one("--samples", "calibration images"))
      ->capture_default_str();
  sub->add_option("-o,--out", a->out, "The int8 model: .json or .safetensors")->required();
  sub->add_option("--method", a->method, "Activation range: minmax, percentile or mse")->capture_default_str();
  sub->add_option("--percentile", a->percentile, "Percentile of |x| taken as the range (--method percentile)")
      ->check(kPercentile)
      ->capture_default_str();
  sub->add_option("--keep-float", a->keep_float, "Layers to keep in float32, comma-separated or repeated (names as listed)")
      ->delimiter(',')
      ->type_name("LAYER[,LAYER...]");
  sub->add_option("--sensitivity-images", a->sensitivity,
                  "Calibration images to measure each layer's sensitivity on (0: skip)")
      ->check(kNonNegative)
      ->capture_default_str();
  sub->add_option("-b,--batch", a->batch, "Images per calibration pass")
      ->check(at_least_one("--batch", "images per pass"))
      ->capture_default_str();
  sub->add_flag("-q,--quiet", a->quiet, "Only the summary line");
  sub->callback([a] { run(*a); });
}

}  // namespace relpos::cli
