// Internal: position tables resampled for another input size (Model::at_input_size;
// docs/attention.md, "Running at another input size").
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "relpos/model_config.hpp"
#include "relpos/network.hpp"
#include "relpos/tensor.hpp"

namespace relpos::detail {

// A table of (..., h*w, d), a row-major h x w grid of d-vectors (one grid per leading index),
// resampled to (..., nh*nw, d) by bilinear interpolation with half-pixel centres: grid point n of a
// side of `size` reads the old side at (n + 0.5) * old / new - 0.5, clamped to [0, old - 1] (PyTorch's
// F.interpolate with align_corners=False and no antialiasing). The same size gives the table back.
// An unclipped relative table of (..., 2H-1, d) is the grid (2H-1) x 1: 1D linear over offsets.
Tensor resample_position_grid(const Tensor& table, int h, int w, int nh, int nw);

// The (height, width) of the map each self_attn block of `net` attends over at its config's
// input_size, by its parameter prefix ("stages.2.1."), in network order.
std::vector<std::pair<std::string, std::pair<int, int>>> attention_map_sizes(const Network& net);

}  // namespace relpos::detail
