// The relpos command line: drawing heat maps, colour bars, labels and bar charts with OpenCV
// (explain's pictures). Colours are BGR; values map onto a colour scale [lo, hi].
#pragma once

#include <opencv2/core.hpp>
#include <string>
#include <vector>

namespace relpos::cli {

// A colour scale: Sequential (OpenCV's inferno, for probabilities) or Diverging (blue - white -
// red around 0, for logits and similarities).
struct ColourScale {
  enum Kind { Sequential, Diverging } kind = Sequential;
  double lo = 0.0, hi = 1.0;
  cv::Vec3b colour(double v) const;
  // A scale from 0 to the largest value (Sequential) or symmetric around 0 (Diverging).
  static ColourScale fit(Kind kind, const std::vector<float>& values);
};

// "0.123", "-1.5", "12": a number in at most `digits` significant digits, without trailing zeros.
std::string short_number(double v, int digits = 3);

// Text at `at` (its baseline's left end); `scale` is OpenCV's font scale.
void draw_text(cv::Mat& img, const std::string& s, cv::Point at, double scale = 0.45,
               cv::Scalar colour = {40, 40, 40}, int thickness = 1);
// Text centred on `centre` horizontally, with its baseline at centre.y.
void draw_text_centred(cv::Mat& img, const std::string& s, cv::Point centre, double scale = 0.45,
                       cv::Scalar colour = {40, 40, 40});
int text_width(const std::string& s, double scale = 0.45);

// A rows x cols grid of values drawn into `box` as cells of one colour each. Cells whose `valid`
// entry is 0 are hatched grey (a key outside the map). With `numbers`, each cell shows its value
// when the cell is big enough to hold it.
struct Grid {
  int rows = 0, cols = 0;
  std::vector<float> values;         // rows * cols, row-major
  std::vector<std::uint8_t> valid;   // empty: all valid
};
void draw_grid(cv::Mat& img, cv::Rect box, const Grid& g, const ColourScale& scale, bool numbers);

// A vertical colour bar in `box` with its scale's ends and middle labelled to its right.
void draw_colour_bar(cv::Mat& img, cv::Rect box, const ColourScale& scale, const std::string& label = "");

// Axis labels for a grid drawn in `box`: `row_labels` left of the rows, `col_labels` above the columns
// (every label when they fit, else every n-th).
void draw_axis_labels(cv::Mat& img, cv::Rect box, const std::vector<std::string>& row_labels,
                      const std::vector<std::string>& col_labels, double scale = 0.38);

// The image under a heat map: each cell of `g` (laid over the whole image) blended with its colour
// where `weight` > 0; cells with valid 0 are left out (the image stays dimmed there).
cv::Mat overlay_grid(const cv::Mat& image_bgr, const Grid& g, const ColourScale& scale, double alpha);

// A bar chart in `box`: groups of bars (one group per label), a dashed reference line per group
// (NaN: none), y axis from 0 to the largest value.
struct BarGroup {
  std::string label;
  std::vector<double> values;
  double reference = 0.0;
};
void draw_bar_chart(cv::Mat& img, cv::Rect box, const std::vector<BarGroup>& groups, const std::string& y_label);

}  // namespace relpos::cli
