// Learning curves and confusion matrices as PNG pictures (OpenCV drawing) and text.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <opencv2/imgproc.hpp>
#include <sstream>

#include "core/text_columns.hpp"
#include "io/image_file.hpp"
#include "relpos/error.hpp"
#include "relpos/trainer.hpp"
#include "train/plots.hpp"

namespace relpos {

namespace {

struct Series {
  std::string name;
  cv::Scalar color;
  std::vector<cv::Point2d> points;
};

std::string fmt(double v, int prec) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(prec) << v;
  return os.str();
}

void text(cv::Mat& img, const std::string& s, cv::Point at, double scale = 0.45, cv::Scalar color = {40, 40, 40}) {
  cv::putText(img, s, at, cv::FONT_HERSHEY_SIMPLEX, scale, color, 1, cv::LINE_AA);
}

void draw_panel(cv::Mat& img, cv::Rect box, const std::string& title, const std::vector<Series>& series, int prec,
                double floor, double ceil, double min_pad) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : series)
    for (const auto& p : s.points) {
      x0 = std::min(x0, p.x), x1 = std::max(x1, p.x);
      y0 = std::min(y0, p.y), y1 = std::max(y1, p.y);
    }
  if (x0 > x1) return;
  if (x1 - x0 < 1e-9) x0 -= 1, x1 += 1;
  const AxisRange axis = padded_axis(y0, y1, floor, ceil, min_pad);
  y0 = axis.lo, y1 = axis.hi;
  const cv::Rect plot(box.x + 60, box.y + 30, box.width - 80, box.height - 70);
  auto px = [&](cv::Point2d p) {
    return cv::Point(plot.x + static_cast<int>((p.x - x0) / (x1 - x0) * plot.width),
                     plot.y + plot.height - static_cast<int>((p.y - y0) / (y1 - y0) * plot.height));
  };
  cv::rectangle(img, plot, {160, 160, 160}, 1);
  text(img, title, {plot.x, box.y + 20}, 0.55);
  for (int i = 0; i <= 4; ++i) {
    const double y = y0 + (y1 - y0) * i / 4.0;
    const int yy = plot.y + plot.height - plot.height * i / 4;
    cv::line(img, {plot.x, yy}, {plot.x + plot.width, yy}, {230, 230, 230}, 1);
    text(img, fmt(y, prec), {box.x + 4, yy + 4}, 0.4);
  }
  // epoch ticks at whole epochs, every step-th (at most 11 labels)
  const double step = std::max(1.0, std::ceil((x1 - x0) / 10.0));
  for (double x = std::ceil(x0); x <= x1 + 1e-9; x += step)
    text(img, fmt(x, 0), {px({x, y0}).x - 5, plot.y + plot.height + 18}, 0.4);
  text(img, "epoch", {plot.x + plot.width / 2 - 20, plot.y + plot.height + 36}, 0.45);
  int legend_y = plot.y + 16;
  for (const auto& s : series) {
    std::vector<cv::Point> pts;
    for (const auto& p : s.points) pts.push_back(px(p));
    if (pts.size() > 1) cv::polylines(img, pts, false, s.color, 2, cv::LINE_AA);
    for (const auto& p : pts) cv::circle(img, p, 3, s.color, cv::FILLED, cv::LINE_AA);
    cv::line(img, {plot.x + plot.width - 110, legend_y - 4}, {plot.x + plot.width - 90, legend_y - 4}, s.color, 2);
    text(img, s.name, {plot.x + plot.width - 85, legend_y}, 0.42);
    legend_y += 18;
  }
}

}  // namespace

AxisRange padded_axis(double lo, double hi, double floor, double ceil, double min_pad) {
  // a flat series (one epoch, or 100% accuracy throughout) gets a span of 10% of its value
  const double pad = hi - lo > 1e-9 ? (hi - lo) * 0.08 : std::max(min_pad, std::abs(hi) * 0.05);
  return {std::max(floor, lo - pad), std::min(ceil, hi + pad)};
}

void plot_learning_curves(const std::vector<EpochLog>& history, const std::string& path) {
  cv::Mat img(420, 1000, CV_8UC3, cv::Scalar(255, 255, 255));
  const cv::Scalar blue(200, 110, 30), orange(30, 130, 240);
  Series tl{"train", blue, {}}, vl{"test", orange, {}}, ta{"train", blue, {}}, va{"test", orange, {}};
  for (const auto& e : history) {
    tl.points.emplace_back(e.epoch, e.train_loss);
    ta.points.emplace_back(e.epoch, 100 * e.train_acc);
    // the held-out curve: validation when the run has it, else test
    if (e.val_acc >= 0 || e.test_acc >= 0) {
      const bool val = e.val_acc >= 0;
      vl.name = va.name = val ? "val" : "test";
      vl.points.emplace_back(e.epoch, val ? e.val_loss : e.test_loss);
      va.points.emplace_back(e.epoch, 100 * (val ? e.val_acc : e.test_acc));
    }
  }
  std::vector<Series> loss{tl}, acc{ta};
  if (!vl.points.empty()) loss.push_back(vl), acc.push_back(va);
  const double inf = std::numeric_limits<double>::infinity();
  draw_panel(img, {0, 0, 500, 420}, "loss", loss, 3, 0.0, inf, 1e-3);  // ticks with 3 decimals
  draw_panel(img, {500, 0, 500, 420}, "top-1 accuracy (%)", acc, 1, 0.0, 100.0, 1.0);  // with 1 decimal
  detail::encode_image_file(path, img);
}

std::string format_confusion(const EvalResult& r) {
  std::ostringstream os;
  std::size_t w = 6;  // "[i] name" column, names cut at 14 characters (UTF-8 ones counted by character)
  for (std::size_t i = 0; i < r.classes.size(); ++i)
    w = std::max(w, ("[" + std::to_string(i) + "] ").size() + std::min<std::size_t>(detail::text_columns(r.classes[i]), 14) + 1);
  os << "confusion matrix (rows: true class, columns: predicted)\n" << std::setw(static_cast<int>(w)) << "";
  for (std::size_t j = 0; j < r.classes.size(); ++j) os << std::setw(6) << ("[" + std::to_string(j) + "]");
  os << "\n";
  for (std::size_t i = 0; i < r.confusion.size(); ++i) {
    os << detail::text_in_columns("[" + std::to_string(i) + "] " + r.classes[i], w - 1) << ' ';
    for (long v : r.confusion[i]) os << std::setw(6) << v;
    os << "\n";
  }
  return os.str();
}

void plot_confusion(const EvalResult& r, const std::string& path) {
  const int n = static_cast<int>(r.confusion.size());
  const int cell = std::max(28, std::min(60, 640 / std::max(1, n))), left = 150, top = 60;
  cv::Mat img(top + n * cell + 116, left + n * cell + 30, CV_8UC3, cv::Scalar(255, 255, 255));
  text(img, "confusion matrix: rows true, columns predicted (top-1 " + fmt(100 * r.top1, 2) + "%)", {10, 25}, 0.5);
  for (int i = 0; i < n; ++i) {
    long row = 0;
    for (long v : r.confusion[static_cast<std::size_t>(i)]) row += v;
    for (int j = 0; j < n; ++j) {
      const long v = r.confusion[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)];
      const double f = row ? static_cast<double>(v) / static_cast<double>(row) : 0.0;
      const cv::Scalar color = i == j ? cv::Scalar(255 - 200 * f, 255 - 80 * f, 255 - 200 * f)
                                      : cv::Scalar(255 - 200 * f, 255 - 200 * f, 255);
      const cv::Rect c(left + j * cell, top + i * cell, cell, cell);
      cv::rectangle(img, c, color, cv::FILLED);
      cv::rectangle(img, c, {210, 210, 210}, 1);
      if (v) text(img, std::to_string(v), {c.x + 3, c.y + cell / 2 + 4}, cell >= 50 ? 0.4 : 0.3);
    }
    text(img, r.classes[static_cast<std::size_t>(i)].substr(0, 18), {6, top + i * cell + cell / 2 + 4}, 0.42);
  }
  for (int j = 0; j < n; ++j) {
    cv::Mat label(20, 110, CV_8UC3, cv::Scalar(255, 255, 255));
    const std::string name = r.classes[static_cast<std::size_t>(j)].substr(0, 14);
    int baseline = 0;
    const int width = cv::getTextSize(name, cv::FONT_HERSHEY_SIMPLEX, 0.42, 1, &baseline).width;
    text(label, name, {std::max(2, 108 - width), 15}, 0.42);  // ends next to the matrix once rotated
    cv::Mat rotated;
    cv::rotate(label, rotated, cv::ROTATE_90_COUNTERCLOCKWISE);
    const cv::Rect at(left + j * cell + (cell - 20) / 2, top + n * cell + 2, 20, 110);
    rotated.copyTo(img(at));
  }
  detail::encode_image_file(path, img);
}

}  // namespace relpos
