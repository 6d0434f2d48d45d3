// Internal: the trainer's learning-curve picture (plot_confusion is public, in relpos/trainer.hpp).
#pragma once

#include <string>
#include <vector>

#include "relpos/trainer.hpp"

namespace relpos {

// loss and accuracy per epoch as a PNG (OpenCV drawing).
void plot_learning_curves(const std::vector<EpochLog>& history, const std::string& path);

}  // namespace relpos
