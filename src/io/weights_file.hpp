// Internal: the model file formats of docs/formats.md, read and written without a Network: the
// relpos weights JSON, safetensors files (relpos's own with its __metadata__, timm's, and the model
// part of a training checkpoint) and model configs with their optional labels and preprocessing.
// Model (src/model/model.cpp) builds on these.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "relpos/model.hpp"

namespace relpos::detail {

enum class ModelFileKind { WeightsJson, Config, Safetensors };
// What a file holds, from its first bytes and its JSON keys; errors name the path (missing,
// a directory, empty, JSON that is neither a weights file nor a config).
ModelFileKind model_file_kind(const std::string& path);

// True for a model file relpos wrote (weights JSON, or safetensors whose metadata says
// relpos-weights), which --save may replace; false for anything else (a config, a timm
// checkpoint, an image, a training checkpoint) or a file that cannot be read.
bool is_relpos_model_file(const std::string& path);

struct ModelFile {
  ModelConfig config;
  std::vector<std::string> labels;
  std::optional<Preprocess> preprocess;
  // The preprocessing keys the file gives itself (a config's preprocess holds defaults for the rest).
  std::set<std::string> preprocess_keys;
  std::vector<std::pair<std::string, Tensor>> tensors;  // empty for a config
  // An int8 model (format version 2, docs/int8.md): its int8 layers (their input scales are
  // tensors, filled in by assign_tensors) and the names of the tensors the file stores as int8.
  std::vector<Int8Layer> int8_layers;
  std::set<std::string> int8_tensors;
};
// A weights file (JSON or safetensors). `config` (a path or shipped name) gives the architecture
// of a safetensors file without one (timm's) and, when the file has none, its labels and
// preprocessing.
ModelFile read_weights_file(const std::string& path, const std::string& config);
// A model config (a path or shipped name) with the labels and preprocessing it may carry.
ModelFile read_config_file(const std::string& path_or_name);

// The weights JSON text of a model.
std::string weights_json_text(const Model& model, TensorEncoding encoding);
// The safetensors __metadata__ that describes a model (relpos.config, .labels, .preprocess).
std::map<std::string, std::string> model_metadata(const Model& model, const std::string& format);

// Every parameter and buffer of the network must be given exactly once (num_batches_tracked
// entries are ignored) and hold finite values; errors name the tensor and the source. With
// int8_tensors (a file's), a tensor is stored as int8 exactly when it is an int8 layer's weights.
void assign_tensors(Network& net, std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& source,
                    const std::set<std::string>* int8_tensors = nullptr);

// The "quantization" object of an int8 model's file (JSON, and safetensors' relpos.quantization)
// and back; `where` names the file in errors.
nlohmann::ordered_json quantization_json(const Network& net);
std::vector<Int8Layer> int8_layers_from_json(const nlohmann::json& q, const std::string& where);

}  // namespace relpos::detail
