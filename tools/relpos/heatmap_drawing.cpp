// Heat maps, colour bars, labels and bar charts drawn with OpenCV for relpos explain.
#include "heatmap_drawing.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <opencv2/imgproc.hpp>
#include <sstream>

#include "relpos/error.hpp"

namespace relpos::cli {

namespace {

const cv::Scalar kInk(40, 40, 40);

// OpenCV's inferno colour map as a table of 256 colours.
const cv::Mat& inferno() {
  static const cv::Mat lut = [] {
    cv::Mat ramp(1, 256, CV_8UC1), out;
    for (int i = 0; i < 256; ++i) ramp.at<std::uint8_t>(0, i) = static_cast<std::uint8_t>(i);
    cv::applyColorMap(ramp, out, cv::COLORMAP_INFERNO);
    return out;
  }();
  return lut;
}

void hatch(cv::Mat& img, cv::Rect r) {
  cv::rectangle(img, r, {225, 225, 225}, cv::FILLED);
  for (int k = -r.height; k < r.width; k += 6)
    cv::line(img, {r.x + std::max(0, k), r.y + std::max(0, -k)},
             {r.x + std::min(r.width, k + r.height), r.y + std::min(r.height, r.width - k)}, {190, 190, 190}, 1,
             cv::LINE_AA);
}

std::string fixed(double v, int decimals) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(decimals) << v;
  return os.str();
}

}  // namespace

cv::Vec3b ColourScale::colour(double v) const {
  double t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
  t = std::clamp(t, 0.0, 1.0);
  if (kind == Sequential) return inferno().at<cv::Vec3b>(0, static_cast<int>(std::lround(t * 255)));
  // blue (t = 0) - white (0.5) - red (1), in BGR
  const cv::Vec3d blue(180, 90, 30), white(250, 250, 250), red(40, 40, 200);
  const cv::Vec3d c = t < 0.5 ? blue + (white - blue) * (t / 0.5) : white + (red - white) * ((t - 0.5) / 0.5);
  return {static_cast<std::uint8_t>(c[0]), static_cast<std::uint8_t>(c[1]), static_cast<std::uint8_t>(c[2])};
}

ColourScale ColourScale::fit(Kind kind, const std::vector<float>& values) {
  double m = 0.0;
  for (float v : values) m = std::max(m, static_cast<double>(kind == Sequential ? v : std::abs(v)));
  if (m <= 0.0) m = 1.0;
  return kind == Sequential ? ColourScale{kind, 0.0, m} : ColourScale{kind, -m, m};
}

std::string short_number(double v, int digits) {
  if (v == 0.0) return "0";
  std::ostringstream os;
  const int mag = static_cast<int>(std::floor(std::log10(std::abs(v))));
  os << std::fixed << std::setprecision(std::max(0, digits - 1 - mag)) << v;
  std::string s = os.str();
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s == "-0" ? "0" : s;
}

void draw_text(cv::Mat& img, const std::string& s, cv::Point at, double scale, cv::Scalar colour, int thickness) {
  cv::putText(img, s, at, cv::FONT_HERSHEY_SIMPLEX, scale, colour, thickness, cv::LINE_AA);
}

int text_width(const std::string& s, double scale) {
  int baseline = 0;
  return cv::getTextSize(s, cv::FONT_HERSHEY_SIMPLEX, scale, 1, &baseline).width;
}

void draw_text_centred(cv::Mat& img, const std::string& s, cv::Point centre, double scale, cv::Scalar colour) {
  draw_text(img, s, {centre.x - text_width(s, scale) / 2, centre.y}, scale, colour);
}

void draw_grid(cv::Mat& img, cv::Rect box, const Grid& g, const ColourScale& scale, bool numbers) {
  RELPOS_CHECK(static_cast<int>(g.values.size()) == g.rows * g.cols, "internal: grid of the wrong size");
  const double cw = static_cast<double>(box.width) / g.cols, ch = static_cast<double>(box.height) / g.rows;
  const double font = std::min(0.36, cw / 110.0);
  for (int r = 0; r < g.rows; ++r)
    for (int c = 0; c < g.cols; ++c) {
      const cv::Rect cell(box.x + static_cast<int>(std::lround(c * cw)), box.y + static_cast<int>(std::lround(r * ch)),
                          static_cast<int>(std::lround((c + 1) * cw)) - static_cast<int>(std::lround(c * cw)),
                          static_cast<int>(std::lround((r + 1) * ch)) - static_cast<int>(std::lround(r * ch)));
      const std::size_t i = static_cast<std::size_t>(r * g.cols + c);
      if (!g.valid.empty() && !g.valid[i]) {
        hatch(img, cell);
        continue;
      }
      const cv::Vec3b col = scale.colour(g.values[i]);
      cv::rectangle(img, cell, cv::Scalar(col[0], col[1], col[2]), cv::FILLED);
      if (numbers && cw >= 30 && ch >= 16) {
        const double lum = 0.114 * col[0] + 0.587 * col[1] + 0.299 * col[2];
        const double v = g.values[i];
        const std::string s = std::abs(v) < 0.005 ? "0" : std::abs(v) < 1 ? fixed(v, 2) : short_number(v, 2);
        if (text_width(s, font) < cw - 2)
          draw_text_centred(img, s, {cell.x + cell.width / 2, cell.y + cell.height / 2 + 4}, font,
                            lum > 120 ? kInk : cv::Scalar(245, 245, 245));
      }
    }
  if (cw >= 6 && ch >= 6)
    for (int r = 0; r <= g.rows; ++r) {
      const int y = box.y + static_cast<int>(std::lround(r * ch));
      cv::line(img, {box.x, y}, {box.x + box.width, y}, {255, 255, 255}, 1);
    }
  if (cw >= 6 && ch >= 6)
    for (int c = 0; c <= g.cols; ++c) {
      const int x = box.x + static_cast<int>(std::lround(c * cw));
      cv::line(img, {x, box.y}, {x, box.y + box.height}, {255, 255, 255}, 1);
    }
  cv::rectangle(img, box, {150, 150, 150}, 1);
}

void draw_colour_bar(cv::Mat& img, cv::Rect box, const ColourScale& scale, const std::string& label) {
  for (int y = 0; y < box.height; ++y) {
    const double v = scale.hi - (scale.hi - scale.lo) * y / std::max(1, box.height - 1);
    const cv::Vec3b c = scale.colour(v);
    cv::line(img, {box.x, box.y + y}, {box.x + box.width - 1, box.y + y}, cv::Scalar(c[0], c[1], c[2]), 1);
  }
  cv::rectangle(img, box, {150, 150, 150}, 1);
  for (int i = 0; i <= 2; ++i) {
    const double v = scale.hi - (scale.hi - scale.lo) * i / 2.0;
    const int y = box.y + (box.height - 1) * i / 2;
    cv::line(img, {box.x + box.width, y}, {box.x + box.width + 4, y}, kInk, 1);
    draw_text(img, short_number(v, 2), {box.x + box.width + 6, y + 4}, 0.38);
  }
  if (!label.empty()) draw_text(img, label, {box.x - 2, box.y - 14}, 0.38);
}

void draw_axis_labels(cv::Mat& img, cv::Rect box, const std::vector<std::string>& row_labels,
                      const std::vector<std::string>& col_labels, double scale) {
  if (!row_labels.empty()) {
    const double ch = static_cast<double>(box.height) / static_cast<double>(row_labels.size());
    const int every = std::max(1, static_cast<int>(std::ceil(14.0 / ch)));
    for (std::size_t r = 0; r < row_labels.size(); r += static_cast<std::size_t>(every)) {
      const int y = box.y + static_cast<int>((static_cast<double>(r) + 0.5) * ch) + 4;
      draw_text(img, row_labels[r], {box.x - 4 - text_width(row_labels[r], scale), y}, scale);
    }
  }
  if (!col_labels.empty()) {
    const double cw = static_cast<double>(box.width) / static_cast<double>(col_labels.size());
    int widest = 0;
    for (const auto& s : col_labels) widest = std::max(widest, text_width(s, scale));
    const int every = std::max(1, static_cast<int>(std::ceil((widest + 4) / cw)));
    for (std::size_t c = 0; c < col_labels.size(); c += static_cast<std::size_t>(every))
      draw_text_centred(img, col_labels[c], {box.x + static_cast<int>((static_cast<double>(c) + 0.5) * cw), box.y - 5},
                        scale);
  }
}

cv::Mat overlay_grid(const cv::Mat& image_bgr, const Grid& g, const ColourScale& scale, double alpha) {
  cv::Mat out = image_bgr.clone();
  const double cw = static_cast<double>(out.cols) / g.cols, ch = static_cast<double>(out.rows) / g.rows;
  for (int y = 0; y < out.rows; ++y)
    for (int x = 0; x < out.cols; ++x) {
      const int r = std::min(g.rows - 1, static_cast<int>(y / ch)), c = std::min(g.cols - 1, static_cast<int>(x / cw));
      const std::size_t i = static_cast<std::size_t>(r * g.cols + c);
      cv::Vec3b& px = out.at<cv::Vec3b>(y, x);
      if (!g.valid.empty() && !g.valid[i]) {
        for (int k = 0; k < 3; ++k) px[k] = static_cast<std::uint8_t>(0.35 * px[k] + 0.65 * 128);
        continue;
      }
      const cv::Vec3b col = scale.colour(g.values[i]);
      for (int k = 0; k < 3; ++k) px[k] = static_cast<std::uint8_t>((1 - alpha) * px[k] + alpha * col[k]);
    }
  return out;
}

void draw_bar_chart(cv::Mat& img, cv::Rect box, const std::vector<BarGroup>& groups, const std::string& y_label) {
  double top = 0.0;
  std::size_t bars = 0;
  for (const auto& g : groups) {
    for (double v : g.values) top = std::max(top, v);
    if (!std::isnan(g.reference)) top = std::max(top, g.reference);
    bars += g.values.size();
  }
  // y ticks at a round step (1, 2 or 5 times a power of ten), about five of them
  const double raw = top > 0 ? top * 1.1 / 5 : 0.2, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = (raw / mag <= 1 ? 1 : raw / mag <= 2 ? 2 : raw / mag <= 5 ? 5 : 10) * mag;
  const int ticks = static_cast<int>(std::ceil(top * 1.1 / step));
  top = ticks * step;
  const cv::Rect plot(box.x + 60, box.y + 20, box.width - 80, box.height - 90);
  cv::rectangle(img, plot, {160, 160, 160}, 1);
  for (int i = 0; i <= ticks; ++i) {
    const int y = plot.y + plot.height - plot.height * i / ticks;
    cv::line(img, {plot.x, y}, {plot.x + plot.width, y}, {230, 230, 230}, 1);
    draw_text(img, short_number(step * i, 3), {box.x + 8, y + 4}, 0.4);
  }
  draw_text(img, y_label, {plot.x, box.y + 12}, 0.42);
  const double slot = static_cast<double>(plot.width) / static_cast<double>(bars + groups.size());
  const cv::Scalar palette[] = {{200, 110, 30}, {30, 130, 240}, {60, 160, 60}, {40, 40, 200},
                                {170, 100, 150}, {90, 90, 140}, {190, 120, 220}, {120, 120, 120}};
  double x = plot.x + slot / 2;
  for (const auto& g : groups) {
    const double x0 = x;
    for (std::size_t h = 0; h < g.values.size(); ++h) {
      const int bh = static_cast<int>(plot.height * g.values[h] / top);
      const cv::Rect bar(static_cast<int>(x + slot * 0.1), plot.y + plot.height - bh, std::max(1, static_cast<int>(slot * 0.8)), bh);
      cv::rectangle(img, bar, palette[h % 8], cv::FILLED);
      if (slot >= 22) {
        draw_text_centred(img, short_number(g.values[h], 3), {bar.x + bar.width / 2, bar.y - 4}, 0.35);
        draw_text_centred(img, "h" + std::to_string(h), {bar.x + bar.width / 2, plot.y + plot.height + 14}, 0.35);
      }
      x += slot;
    }
    if (!std::isnan(g.reference)) {
      const int y = plot.y + plot.height - static_cast<int>(plot.height * g.reference / top);
      for (double d = x0; d < x - 2; d += 8)
        cv::line(img, {static_cast<int>(d), y}, {static_cast<int>(std::min(d + 4, x - 2)), y}, kInk, 1);
    }
    draw_text_centred(img, g.label, {static_cast<int>((x0 + x) / 2), plot.y + plot.height + 34}, 0.4);
    x += slot;
  }
}

}  // namespace relpos::cli
