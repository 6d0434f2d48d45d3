// The translation data of the position experiment (README, tools/position_experiment.sh): an item
// placed on a larger black canvas, at a seeded random position (training: per epoch and sample,
// through Augment::canvas; evaluation: fixed per sample, CanvasDataset).
#include <opencv2/core.hpp>

#include "relpos/data.hpp"
#include "relpos/error.hpp"

namespace relpos {

std::pair<int, int> canvas_offset(int h, int w, int canvas, std::uint64_t seed) {
  RELPOS_CHECK(h >= 1 && w >= 1 && h <= canvas && w <= canvas,
               "a " << h << "x" << w << " image does not fit on a " << canvas << "x" << canvas << " canvas");
  const auto ny = static_cast<std::uint64_t>(canvas - h + 1), nx = static_cast<std::uint64_t>(canvas - w + 1);
  return {static_cast<int>(mix_seed(seed, 1, 0) % ny), static_cast<int>(mix_seed(seed, 2, 0) % nx)};
}

cv::Mat place_on_canvas(const cv::Mat& item, int canvas, std::uint64_t seed) {
  RELPOS_CHECK(!item.empty() && item.depth() == CV_8U, "the canvas takes 8-bit images");
  const auto [y, x] = canvas_offset(item.rows, item.cols, canvas, seed);
  cv::Mat out(canvas, canvas, item.type(), cv::Scalar::all(0));
  item.copyTo(out(cv::Rect(x, y, item.cols, item.rows)));
  return out;
}

CanvasDataset::CanvasDataset(const Dataset& base, int canvas, std::uint64_t seed)
    : base_(base), canvas_(canvas), seed_(seed) {
  RELPOS_CHECK(canvas >= 1, "the canvas size must be at least 1, got " << canvas);
  check_fits_canvas(base, canvas);
}

void check_fits_canvas(const Dataset& data, int canvas) {
  if (data.size() == 0) return;
  const cv::Mat first = data.image(0);
  RELPOS_CHECK(first.rows <= canvas && first.cols <= canvas,
               "--canvas " << canvas << ": the images (" << data.name(0) << ": " << first.rows << "x" << first.cols
                           << ") are larger than the canvas");
}

std::uint64_t CanvasDataset::sample_seed(std::size_t i) const { return mix_seed(seed_, 0, i); }

cv::Mat CanvasDataset::image(std::size_t i) const { return place_on_canvas(base_.image(i), canvas_, sample_seed(i)); }

}  // namespace relpos
