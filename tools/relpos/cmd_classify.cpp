// relpos classify: top-k classes of images and folders of images.
#include <chrono>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "relpos/error.hpp"

namespace relpos::cli {

namespace {

struct ClassifyArgs {
  ModelOptions model;
  PreprocessOptions pre;
  std::vector<std::string> inputs;
  int topk = 5;
  int batch = 8;
  bool json = false;
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

void report_error(const ClassifyArgs& a, const std::string& image, const std::string& message) {
  if (a.json)
    std::cout << nlohmann::json{{"image", image}, {"error", message}}.dump() << std::endl;
  std::cerr << "relpos: skipped " << image << ": " << message << "\n";
}

void print_result(const ClassifyArgs& a, const std::string& image, const std::vector<Prediction>& preds) {
  if (a.json) {
    nlohmann::json top = nlohmann::json::array();
    for (std::size_t r = 0; r < preds.size(); ++r)
      top.push_back({{"rank", r + 1}, {"index", preds[r].index}, {"label", preds[r].label},
                     {"probability", preds[r].probability}, {"logit", preds[r].logit}});
    std::cout << nlohmann::json{{"image", image}, {"predictions", top}}.dump() << "\n";
    return;
  }
  std::cout << image << "\n";
  for (const Prediction& p : preds)
    std::cout << "  " << std::fixed << std::setprecision(2) << std::setw(6) << 100.0f * p.probability << "%  "
              << p.label << "\n";
}

void run(const ClassifyArgs& a) {
  RELPOS_CHECK(a.batch >= 1, "--batch must be at least 1");
  auto t_load = Clock::now();
  Model model = a.model.load();
  a.pre.apply(model);
  const double load_ms = ms_since(t_load);
  std::vector<std::string> errors;
  const std::vector<std::string> files = expand_inputs(a.inputs, errors);
  for (const auto& e : errors) {
    const auto colon = e.rfind(": ");
    report_error(a, e.substr(0, colon), e.substr(colon + 2));
  }
  const Preprocess& pre = model.preprocess();
  const std::size_t per_image = static_cast<std::size_t>(pre.height) * pre.width * pre.in_chans();
  std::size_t done = 0, failed = errors.size();
  double prep_ms = 0.0, infer_ms = 0.0;
  for (std::size_t start = 0; start < files.size(); start += static_cast<std::size_t>(a.batch)) {
    const std::size_t end = std::min(files.size(), start + static_cast<std::size_t>(a.batch));
    auto t0 = Clock::now();
    std::vector<std::string> names;
    std::vector<Tensor> inputs;
    for (std::size_t i = start; i < end; ++i) {
      try {
        inputs.push_back(make_batch({read_image(files[i])}, pre));
        names.push_back(files[i]);
      } catch (const std::exception& e) {
        report_error(a, files[i], e.what());
        ++failed;
      }
    }
    if (inputs.empty()) continue;
    Tensor batch({static_cast<std::int64_t>(inputs.size()), pre.in_chans(), pre.height, pre.width}, Device::CPU,
                 Layout::ChannelsLast);
    for (std::size_t i = 0; i < inputs.size(); ++i)
      std::memcpy(batch.data() + i * per_image, inputs[i].data(), per_image * sizeof(float));
    prep_ms += ms_since(t0);
    auto t1 = Clock::now();
    const Tensor logits = model.logits(batch);
    infer_ms += ms_since(t1);
    const auto preds = model.top_k(logits, a.topk);
    for (std::size_t i = 0; i < names.size(); ++i) print_result(a, names[i], preds[i]);
    done += names.size();
  }
  std::cerr << std::fixed << std::setprecision(1) << "relpos: " << done << " image" << (done == 1 ? "" : "s")
            << " classified";
  if (done > 0)
    std::cerr << " in " << (prep_ms + infer_ms) << " ms (" << done * 1000.0 / (prep_ms + infer_ms)
              << " img/s): decode+preprocess " << prep_ms << " ms, inference " << infer_ms << " ms = "
              << infer_ms / static_cast<double>(done) << " ms/img";
  std::cerr << "; model load " << load_ms << " ms; batch " << a.batch << ", " << threads_in_use() << " threads, "
            << to_string(model.device());
  if (failed) std::cerr << "; " << failed << " failed";
  std::cerr << "\n";
  if (failed > 0 || done == 0) exit_status() = 1;
}

}  // namespace

void register_classify(CLI::App& app) {
  auto args = std::make_shared<ClassifyArgs>();
  CLI::App* sub = app.add_subcommand("classify", "Print the top-k classes of images (files or folders)");
  args->model.add(sub);
  sub->add_option("inputs", args->inputs, "Image files or folders of images")->required();
  sub->add_option("-k,--topk", args->topk, "How many classes to print per image")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("-b,--batch", args->batch, "Images per forward pass")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_flag("--json", args->json, "One JSON object per image on stdout");
  args->pre.add(sub);
  sub->callback([args] { run(*args); });
}

}  // namespace relpos::cli
