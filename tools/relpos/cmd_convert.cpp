// relpos convert: between relpos JSON weights and safetensors (timm names), or a config to a
// weights file with random initial weights.
#include <iostream>
#include <memory>

#include "cli_common.hpp"
#include "relpos/error.hpp"

namespace relpos::cli {

namespace {
struct ConvertArgs {
  ModelOptions model;
  PreprocessOptions pre;
  std::string output;
  bool numbers = false;
};

void run(const ConvertArgs& a) {
  const bool safetensors = ends_with(a.output, ".safetensors");
  RELPOS_USAGE_CHECK(safetensors || ends_with(a.output, ".json"),
                     "output '" << a.output << "' must end in .json or .safetensors");
  RELPOS_USAGE_CHECK(!safetensors || !a.numbers, "--numbers applies to JSON output only");
  check_output_file(a.output, "convert's output", "the model", a.model.model, /*model=*/true);
  Model model = a.model.load();
  a.pre.apply(model);
  if (safetensors) {
    model.save_safetensors(a.output);
  } else {
    model.save_json(a.output, a.numbers ? TensorEncoding::Numbers : TensorEncoding::Base64);
  }
  std::cerr << "relpos: wrote " << a.output << " (" << model.network().config().name << ", "
            << model.network().num_params() << " parameters)\n";
}
}  // namespace

void register_convert(CLI::App& app) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* sub = app.add_subcommand(
      "convert", "Convert weights between relpos JSON and safetensors (timm names); a config gives random weights");
  sub->add_option("input", args->model.model, "Weights (.json / .safetensors) or a model config")->required();
  sub->add_option("output", args->output, "Output file: .json or .safetensors")->required();
  sub->add_option("--config", args->model.config, "Architecture for a timm .safetensors file");
  args->model.run.add(sub);
  sub->add_flag("--numbers", args->numbers, "Write tensors as plain JSON numbers instead of base64");
  args->pre.add(sub);
  sub->callback([args] { run(*args); });
}

}  // namespace relpos::cli
