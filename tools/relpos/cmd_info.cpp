// relpos info: layers, parameters and multiply-adds of a model.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli_common.hpp"

namespace relpos::cli {

namespace {
struct InfoArgs {
  ModelOptions model;
  int batch = 1;
  bool layers = true;
};

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  for (std::size_t i = 1; i < s.size(); ++i) os << (i > 1 ? "x" : "") << s[i];
  return os.str();
}

void run(const InfoArgs& a) {
  Model model = a.model.load();
  const Network& net = model.network();
  const ModelConfig& c = net.config();
  // the input the model runs on: its preprocessing's size (a model of any input size may have been
  // given another than its config's, by convert --width/--height)
  const int height = model.preprocess().height, width = model.preprocess().width;
  const auto rows = net.summarize(a.batch, height, width);
  std::int64_t macs = 0;
  for (const auto& r : rows) macs += r.macs;
  std::cout << c.name << ": " << c.in_chans << "x" << height << "x" << width << " -> " << c.num_classes << " classes"
            << (c.fixed_input_size() ? " (fixed input size)" : " (any input size; this is its preprocessing's)") << "\n";
  if (a.layers) {
    // columns as wide as their longest entry needs, with two spaces between (an int8 layer's kind is long)
    int name_w = 40, kind_w = 34;
    for (const auto& r : rows) {
      name_w = std::max(name_w, static_cast<int>(r.name.size()) + 2);
      kind_w = std::max(kind_w, static_cast<int>(r.kind.size()) + 2);
    }
    std::cout << std::left << std::setw(name_w) << "layer" << std::setw(kind_w) << "kind" << std::setw(16) << "output"
              << std::right << std::setw(12) << "params"
              << std::setw(14) << (a.batch == 1 ? std::string("MMACs") : "MMACs (b" + std::to_string(a.batch) + ")") << "\n";
    for (const auto& r : rows)
      std::cout << std::left << std::setw(name_w) << r.name << std::setw(kind_w) << r.kind << std::setw(16)
                << shape_str(r.out_shape) << std::right << std::setw(12) << r.params << std::setw(14) << std::fixed
                << std::setprecision(2) << static_cast<double>(r.macs) / 1e6 << "\n";
  }
  std::cout << std::fixed << std::setprecision(2) << "total: " << static_cast<double>(net.num_params()) / 1e6
            << " M parameters, " << static_cast<double>(macs) / 1e9 / a.batch << " GMACs per image";
  if (a.batch > 1) std::cout << " (" << static_cast<double>(macs) / 1e9 << " for the batch of " << a.batch << ")";
  std::cout << "\n";
  {
    ModelConfig at_size = c;
    at_size.input_size = {height, width};
    const ModelConfig::Estimate e = at_size.estimate();
    std::cout << std::setprecision(1) << "memory estimate: " << e.param_bytes / (1 << 20) << " MiB of parameters + "
              << e.working_bytes / (1 << 20) << " MiB working set per image (checked against RELPOS_MAX_MODEL_GB, "
              << "default 16 GiB, before a network is built)\n";
    // an int8 model's weights take a byte each where the estimate counts float32 ones
    if (!net.int8_layers().empty()) {
      double bytes = 0.0;
      for (const ParamRef& p : net.params()) bytes += static_cast<double>(p.value->numel()) * (p.int8 ? 1.0 : 4.0);
      std::cout << "int8 model: " << net.int8_layers().size() << " int8 layers; its tensors take " << bytes / (1 << 20)
                << " MiB as loaded (int8 weights a byte each; the estimate above counts float32)\n";
    }
  }
  std::cout << "preprocessing: " << model.preprocess().describe() << "\n";
  std::cout << "as flags: " << preprocess_flags(model.preprocess()) << "\n";
  std::cout << "labels: ";
  if (model.labels().empty()) {
    std::cout << "none (classes print as 'class N')\n";
  } else {
    const auto& l = model.labels();
    std::cout << l.size() << " (";
    for (std::size_t i = 0; i < l.size() && i < 5; ++i) std::cout << (i ? "; " : "") << l[i];
    std::cout << (l.size() > 5 ? "; ...)" : ")") << "\n";
  }
}
}  // namespace

void register_info(CLI::App& app) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* sub = app.add_subcommand("info", "Show a model's layers, parameters and multiply-adds");
  sub->add_option("model", args->model.model, "Weights file, model config or shipped config name")->required();
  sub->add_option("--config", args->model.config, "Architecture for a timm .safetensors file");
  args->model.run.add(sub);
  sub->add_option("--batch", args->batch, "Batch size for the multiply-add count")
      ->check(at_least_one("--batch", "images for the count"));
  sub->add_flag("!--no-layers", args->layers, "Only print the totals");
  sub->callback([args] { run(*args); });
}

}  // namespace relpos::cli
