// TEMPORARY stand-in (replaced by the Pillow-exact resampler from the `pil` branch).
#pragma once
#include <opencv2/core.hpp>
namespace relpos {
enum class PilFilter { Nearest, Box, Bilinear, Hamming, Bicubic, Lanczos };
cv::Mat pil_resize(const cv::Mat& src, int out_w, int out_h, PilFilter filter, cv::Rect region);
}  // namespace relpos
