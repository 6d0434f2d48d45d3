// Internal: the model config a parsed config file (or weights JSON, which carries its config under
// "config") describes, with errors naming the file. ModelConfig::load and io/weights_file's
// read_config_file both go through it, so a file parsed once serves both.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "relpos/model_config.hpp"

namespace relpos::detail {

ModelConfig config_in_file(nlohmann::json file, const std::string& path);

}  // namespace relpos::detail
