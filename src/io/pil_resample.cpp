// TEMPORARY stand-in (replaced by the Pillow-exact resampler from the `pil` branch).
#include "io/pil_resample.hpp"
#include <opencv2/imgproc.hpp>
namespace relpos {
cv::Mat pil_resize(const cv::Mat& src, int out_w, int out_h, PilFilter filter, cv::Rect region) {
  cv::Mat out;
  cv::resize(src, out, cv::Size(out_w, out_h), 0, 0, filter == PilFilter::Bicubic ? cv::INTER_CUBIC : cv::INTER_LINEAR);
  return out(region).clone();
}
}  // namespace relpos
