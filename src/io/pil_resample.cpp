#include "io/pil_resample.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "relpos/error.hpp"

namespace relpos {

namespace {

constexpr double kPi = 3.14159265358979323846;
// Pillow's fixed point for 8-bit images: 32 bits less 8 for the pixel and 2 for headroom.
constexpr int kPrecisionBits = 32 - 8 - 2;

double box_filter(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

double hamming_filter(double x) {
  if (x < 0.0) x = -x;
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x *= kPi;
  // Pillow writes the window with float literals (0.54f, 0.46f); the same values here
  return std::sin(x) / x * (static_cast<double>(0.54f) + static_cast<double>(0.46f) * std::cos(x));
}

double bicubic_filter(double x) {
  constexpr double a = -0.5;  // Pillow's (and Catmull-Rom's) parameter
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= kPi;
  return std::sin(x) / x;
}

double lanczos_filter(double x) { return (x >= -3.0 && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0; }

struct Filter {
  double (*fn)(double);
  double support;
};

Filter filter_of(PilFilter f) {
  switch (f) {
    case PilFilter::Box: return {box_filter, 0.5};
    case PilFilter::Bilinear: return {bilinear_filter, 1.0};
    case PilFilter::Hamming: return {hamming_filter, 1.0};
    case PilFilter::Bicubic: return {bicubic_filter, 2.0};
    case PilFilter::Lanczos: return {lanczos_filter, 3.0};
    case PilFilter::Nearest: break;
  }
  RELPOS_FAIL("pil_resize: no convolution filter for nearest");
}

// The weights of output positions [first, first + count) of a resize from in_size to out_size:
// for each, the first source index and how many follow, and their normalised weights.
struct Coeffs {
  int ksize = 0;
  std::vector<int> start, count;
  std::vector<double> weight;    // count * ksize, row per output position
  std::vector<std::int32_t> fixed;  // the same in Pillow's 8-bit fixed point
};

Coeffs coefficients(int in_size, int out_size, const Filter& f, int first, int count) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(1.0, scale);
  const double support = f.support * filterscale;
  Coeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.start.resize(static_cast<std::size_t>(count));
  c.count.resize(static_cast<std::size_t>(count));
  c.weight.assign(static_cast<std::size_t>(count) * c.ksize, 0.0);
  c.fixed.assign(c.weight.size(), 0);
  for (int i = 0; i < count; ++i) {
    const int xx = first + i;
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    // C's truncating casts, as Pillow rounds the window ends
    const int xmin = std::max(0, static_cast<int>(center - support + 0.5));
    const int xmax = std::min(in_size, static_cast<int>(center + support + 0.5)) - xmin;
    double* k = &c.weight[static_cast<std::size_t>(i) * c.ksize];
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = f.fn((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x)
      if (ww != 0.0) k[x] /= ww;
    std::int32_t* q = &c.fixed[static_cast<std::size_t>(i) * c.ksize];
    for (int x = 0; x < xmax; ++x)
      q[x] = static_cast<std::int32_t>(k[x] < 0 ? -0.5 + k[x] * (1 << kPrecisionBits)
                                                : 0.5 + k[x] * (1 << kPrecisionBits));
    c.start[static_cast<std::size_t>(i)] = xmin;
    c.count[static_cast<std::size_t>(i)] = std::max(0, xmax);
  }
  return c;
}

std::uint8_t clip8(std::int32_t v) {
  if (v >= (255 << kPrecisionBits)) return 255;
  if (v <= 0) return 0;
  return static_cast<std::uint8_t>(v >> kPrecisionBits);
}

// One pass along x (horizontal) or y (vertical) over `in`, writing `out`: out(y, xx) from
// in(y, start[xx] + k), or out(yy, x) from in(start[yy] + k, x).
template <typename T>
void pass(const cv::Mat& in, cv::Mat& out, const Coeffs& c, bool horizontal) {
  const int ch = in.channels();
  const int rows = out.rows, cols = out.cols;
#pragma omp parallel for schedule(static) if (static_cast<long>(rows) * cols * c.ksize > 200000)
  for (int y = 0; y < rows; ++y) {
    T* dst = out.ptr<T>(y);
    for (int x = 0; x < cols; ++x) {
      const std::size_t i = static_cast<std::size_t>(horizontal ? x : y);
      const int start = c.start[i], n = c.count[i];
      for (int k = 0; k < ch; ++k) {
        if constexpr (std::is_same_v<T, std::uint8_t>) {
          const std::int32_t* w = &c.fixed[i * static_cast<std::size_t>(c.ksize)];
          std::int32_t ss = 1 << (kPrecisionBits - 1);
          if (horizontal) {
            const std::uint8_t* src = in.ptr<std::uint8_t>(y) + static_cast<std::size_t>(start) * ch + k;
            for (int j = 0; j < n; ++j) ss += src[static_cast<std::size_t>(j) * ch] * w[j];
          } else {
            for (int j = 0; j < n; ++j) ss += in.ptr<std::uint8_t>(start + j)[static_cast<std::size_t>(x) * ch + k] * w[j];
          }
          dst[static_cast<std::size_t>(x) * ch + k] = clip8(ss);
        } else {
          const double* w = &c.weight[i * static_cast<std::size_t>(c.ksize)];
          double ss = 0.0;
          if (horizontal) {
            const float* src = in.ptr<float>(y) + static_cast<std::size_t>(start) * ch + k;
            for (int j = 0; j < n; ++j) ss += src[static_cast<std::size_t>(j) * ch] * w[j];
          } else {
            for (int j = 0; j < n; ++j) ss += in.ptr<float>(start + j)[static_cast<std::size_t>(x) * ch + k] * w[j];
          }
          dst[static_cast<std::size_t>(x) * ch + k] = static_cast<float>(ss);
        }
      }
    }
  }
}

// Pillow's NEAREST resize (its scaling transform): output pixel i reads source (int)(c_i) where
// c_0 = scale / 2 and c_{i+1} = c_i + scale, accumulated in double as Pillow does.
std::vector<int> nearest_index(int in_size, int out_size, int first, int count) {
  const double scale = static_cast<double>(in_size) / out_size;
  double c = scale * 0.5;
  std::vector<int> idx(static_cast<std::size_t>(count));
  for (int i = 0; i < first + count; ++i) {
    if (i >= first) idx[static_cast<std::size_t>(i - first)] = std::clamp(c < 0.0 ? -1 : static_cast<int>(c), 0, in_size - 1);
    c += scale;
  }
  return idx;
}

cv::Mat nearest(const cv::Mat& src, int out_w, int out_h, cv::Rect r) {
  const std::vector<int> xs = nearest_index(src.cols, out_w, r.x, r.width);
  const std::vector<int> ys = nearest_index(src.rows, out_h, r.y, r.height);
  cv::Mat out(r.height, r.width, src.type());
  const std::size_t px = src.elemSize();
  for (int y = 0; y < r.height; ++y) {
    const std::uint8_t* in = src.ptr<std::uint8_t>(ys[static_cast<std::size_t>(y)]);
    std::uint8_t* dst = out.ptr<std::uint8_t>(y);
    for (int x = 0; x < r.width; ++x)
      std::copy_n(in + static_cast<std::size_t>(xs[static_cast<std::size_t>(x)]) * px, px, dst + x * px);
  }
  return out;
}

template <typename T>
cv::Mat convolve(const cv::Mat& src, int out_w, int out_h, const Filter& f, cv::Rect r) {
  // Pillow skips a pass whose size does not change (the filter would be the identity there).
  const bool need_h = out_w != src.cols, need_v = out_h != src.rows;
  // Pillow 13 runs the vertical pass first when the height shrinks by more than twice as many
  // pixels as the width (the order changes the 8-bit rounding between the passes).
  const bool vertical_first = need_h && need_v && src.rows - out_h > 0 && src.rows - out_h > 2 * (src.cols - out_w);
  if (vertical_first) {
    // the columns of the source the horizontal pass reads, filtered vertically for the region's rows
    Coeffs horiz = coefficients(src.cols, out_w, f, r.x, r.width);
    const int x_first = horiz.start.front(), x_last = horiz.start.back() + horiz.count.back();
    for (int& s : horiz.start) s -= x_first;
    const Coeffs vert = coefficients(src.rows, out_h, f, r.y, r.height);
    cv::Mat tmp(r.height, x_last - x_first, src.type());
    pass<T>(src.colRange(x_first, x_last), tmp, vert, /*horizontal=*/false);
    cv::Mat out(r.height, r.width, src.type());
    pass<T>(tmp, out, horiz, /*horizontal=*/true);
    return out;
  }
  // the rows of the source the vertical pass reads, and the columns the horizontal pass writes
  Coeffs vert;
  int y_first = r.y, y_last = r.y + r.height;
  if (need_v) {
    vert = coefficients(src.rows, out_h, f, r.y, r.height);
    y_first = vert.start.front();
    y_last = vert.start.back() + vert.count.back();
    for (int& s : vert.start) s -= y_first;
  }
  cv::Mat rows = src.rowRange(y_first, y_last);
  cv::Mat tmp;
  if (need_h) {
    const Coeffs horiz = coefficients(src.cols, out_w, f, r.x, r.width);
    tmp.create(rows.rows, r.width, src.type());
    pass<T>(rows, tmp, horiz, /*horizontal=*/true);
  } else {
    tmp = rows.colRange(r.x, r.x + r.width);
  }
  if (!need_v) return tmp.clone();
  cv::Mat out(r.height, r.width, src.type());
  pass<T>(tmp, out, vert, /*horizontal=*/false);
  return out;
}

}  // namespace

cv::Mat pil_resize(const cv::Mat& src, int out_w, int out_h, PilFilter filter, cv::Rect region) {
  RELPOS_CHECK(!src.empty() && src.dims == 2, "pil_resize: empty image");
  RELPOS_CHECK(src.depth() == CV_8U || src.depth() == CV_32F,
               "pil_resize: images must be 8-bit or float, got depth " << src.depth());
  RELPOS_CHECK(src.channels() >= 1 && src.channels() <= 4, "pil_resize: 1 to 4 channels, got " << src.channels());
  RELPOS_CHECK(out_w > 0 && out_h > 0, "pil_resize: output size " << out_w << "x" << out_h << " must be positive");
  RELPOS_CHECK(region.width > 0 && region.height > 0 && region.x >= 0 && region.y >= 0 &&
                   region.x <= out_w - region.width && region.y <= out_h - region.height,
               "pil_resize: region " << region.x << "," << region.y << " " << region.width << "x" << region.height
                                     << " is not inside the " << out_w << "x" << out_h << " output");
  const cv::Mat in = src.isContinuous() ? src : src.clone();
  if (filter == PilFilter::Nearest) return nearest(in, out_w, out_h, region);
  const Filter f = filter_of(filter);
  return in.depth() == CV_8U ? convolve<std::uint8_t>(in, out_w, out_h, f, region)
                             : convolve<float>(in, out_w, out_h, f, region);
}

}  // namespace relpos
