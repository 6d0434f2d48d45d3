// The relpos command line: options shared by several commands.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "relpos/model.hpp"

namespace relpos::cli {

// --model / --config / --device / --threads
struct ModelOptions {
  std::string model;
  std::string config;
  std::string device = "cpu";
  int threads = 0;
  void add(CLI::App* app, bool model_required = true);
  // Sets the thread count and loads the model (weights file, or a config for random weights).
  Model load() const;
};

// Overrides of the model file's preprocessing, named as in OpenCV's dnn samples.
struct PreprocessOptions {
  std::optional<int> width, height;
  std::vector<float> mean, std;
  std::optional<float> scale;
  std::optional<bool> rgb, crop;
  std::optional<std::string> interpolation, tta;
  std::string labels;
  void add(CLI::App* app);
  void apply(Model& model) const;
};

void set_threads(int threads);
int threads_in_use();
// The process exit status a command asks for (0 unless it reported failures).
int& exit_status();
// Files named on the command line, with folders expanded (recursively) to the image files they
// hold, in sorted order. Paths that do not exist, and folders without images, go to errors.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs, std::vector<std::string>& errors);

void register_classify(CLI::App& app);
void register_info(CLI::App& app);
void register_convert(CLI::App& app);
void register_bench(CLI::App& app);
void register_train(CLI::App& app);
void register_eval(CLI::App& app);

}  // namespace relpos::cli
