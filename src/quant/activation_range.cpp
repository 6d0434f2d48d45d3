#include "quant/activation_range.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/ops_internal.hpp"
#include "relpos/error.hpp"

namespace relpos::detail {

void ActivationRange::add_minmax(const float* x, std::int64_t n) {
  if (n <= 0) return;
  float lo = seen_ ? min_ : x[0], hi = seen_ ? max_ : x[0];
  bool finite = true;
#pragma omp parallel for reduction(min : lo) reduction(max : hi) reduction(&& : finite)
  for (std::int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    finite = finite && std::isfinite(x[i]);
  }
  RELPOS_CHECK(finite, "calibration: a layer input holds NaN or infinity");
  min_ = lo, max_ = hi, seen_ = true;
}

float ActivationRange::amax() const { return std::max(std::fabs(min_), std::fabs(max_)); }

void ActivationRange::add_histogram(const float* x, std::int64_t n) {
  if (hist_.empty()) hist_.assign(kBins, 0.0);
  const float a = amax();
  if (a <= 0.0f) return;
  const float per_bin = kBins / a;
#pragma omp parallel
  {
    std::vector<double> local(kBins, 0.0);
#pragma omp for nowait
    for (std::int64_t i = 0; i < n; ++i) {
      const int b = std::min(kBins - 1, static_cast<int>(std::fabs(x[i]) * per_bin));
      local[static_cast<std::size_t>(b)] += 1.0;
    }
#pragma omp critical
    for (int b = 0; b < kBins; ++b) hist_[static_cast<std::size_t>(b)] += local[static_cast<std::size_t>(b)];
  }
}

float ActivationRange::threshold(Calibration method, double percentile) const {
  const float a = amax();
  if (a <= 0.0f || method == Calibration::MinMax || hist_.empty()) return a;
  const double width = static_cast<double>(a) / kBins;
  double total = 0.0;
  for (double h : hist_) total += h;
  if (total <= 0.0) return a;
  if (method == Calibration::Percentile) {
    const double want = total * percentile / 100.0;
    double cum = 0.0;
    for (int b = 0; b < kBins; ++b) {
      cum += hist_[static_cast<std::size_t>(b)];
      if (cum >= want) return static_cast<float>((b + 1) * width);
    }
    return a;
  }
  // Mse: expected squared error of clipping at t = (k + 1) bin widths, with values at bin centres:
  // step^2 / 12 for the values inside, (|x| - t)^2 for the clipped ones.
  const double levels = min_ < 0.0f ? 127.0 : 255.0;
  double best = -1.0, best_t = a;
  for (int k = kBins / 64; k < kBins; ++k) {
    const double t = (k + 1) * width, step = t / levels;
    double inside = 0.0, clipped = 0.0;
    for (int b = 0; b < kBins; ++b) {
      const double h = hist_[static_cast<std::size_t>(b)];
      if (b <= k) {
        inside += h;
      } else {
        const double d = (b + 0.5) * width - t;
        clipped += h * d * d;
      }
    }
    const double err = inside * step * step / 12.0 + clipped;
    if (best < 0.0 || err < best) best = err, best_t = t;
  }
  return static_cast<float>(best_t);
}

float ActivationRange::scale(Calibration method, double percentile) const {
  const float t = threshold(method, percentile);
  // a layer that only ever saw zeros (or values so small that the scale would be subnormal, which a
  // model file may not hold)
  const float s = t / (is_signed() ? 127.0f : 255.0f);
  return ops::usable_int8_scale(s) ? s : 1.0f;
}

}  // namespace relpos::detail
