// relpos train / eval are added with the training issue; registered here so --help lists them.
#include <iostream>

#include "cli_common.hpp"
#include "relpos/error.hpp"

namespace relpos::cli {
void register_train(CLI::App&) {}
void register_eval(CLI::App&) {}
}  // namespace relpos::cli
