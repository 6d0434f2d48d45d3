// Internal: what calibration gathers about one layer's input, and the range it picks from it.
// Pass 1 records the minimum and maximum; pass 2 a histogram of |x| over [0, max |x|] (only the
// percentile and MSE methods need it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "relpos/preprocess.hpp"
#include "relpos/quantize.hpp"

namespace relpos::detail {

// The lowest value a preprocessing gives the network, over the channels: a black pixel's
// (-mean / std) or, with a negative std, a white one's ((255 * scale - mean) / std): what the first
// layer must be able to take, whatever calibration saw.
inline float lowest_input(const Preprocess& p) {
  float lowest = 0.0f;
  for (int c = 0; c < p.in_chans(); ++c) {
    const float m = p.mean[static_cast<std::size_t>(c)], s = p.std[static_cast<std::size_t>(c)];
    lowest = std::min({lowest, -m / s, (255.0f * p.scale - m) / s});
  }
  return lowest;
}

class ActivationRange {
 public:
  static constexpr int kBins = 2048;
  void add_minmax(const float* x, std::int64_t n);
  void add_histogram(const float* x, std::int64_t n);  // after every add_minmax
  float min() const { return min_; }
  float max() const { return max_; }
  bool is_signed() const { return min_ < 0.0f; }
  float amax() const;  // max |x|
  // The clipping point of |x| for the method: (0, amax()].
  float threshold(Calibration method, double percentile) const;
  // The input scale: threshold / 127 (s8, a signed input) or / 255 (u8).
  float scale(Calibration method, double percentile) const;

 private:
  float min_ = 0.0f, max_ = 0.0f;
  bool seen_ = false;
  std::vector<double> hist_;
};

}  // namespace relpos::detail
