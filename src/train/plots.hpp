// Internal: the trainer's learning-curve picture (plot_confusion is public, in relpos/trainer.hpp).
#pragma once

#include <string>
#include <vector>

#include "relpos/trainer.hpp"

namespace relpos {

// A plot's value axis: [lo, hi] widened on each side for the markers (by 8% of the span, or, when the
// span is 0, by 5% of the value and at least min_pad: a flat 0% accuracy still gets labelled ticks),
// but never past the values the quantity can take ([floor, ceil]: 0 for a loss, 0 and 100 for an
// accuracy in percent), so that no tick reads -0.012 or 100.5.
struct AxisRange {
  double lo, hi;
};
AxisRange padded_axis(double lo, double hi, double floor, double ceil, double min_pad = 1e-3);

// loss and accuracy per epoch as a PNG (OpenCV drawing).
void plot_learning_curves(const std::vector<EpochLog>& history, const std::string& path);

}  // namespace relpos
