// libFuzzer: image decoding (our header, PNG chunk/CRC and JPEG checks, then OpenCV) and timm-style
// preprocessing of what decodes (Pillow resampling, crop, normalisation).
#include <cstdint>
#include <string>

#include "io/image_file.hpp"
#include "relpos/error.hpp"
#include "relpos/preprocess.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    // a 4-megapixel limit keeps each run quick and within libFuzzer's memory limit under ASan
    const cv::Mat img = relpos::detail::decode_image_bytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz", 4000000);
    relpos::Preprocess p;
    p.height = 64, p.width = 48;
    p.interpolation = size % 2 ? relpos::Interpolation::Bicubic : relpos::Interpolation::Bilinear;
    p.crop_mode = size % 3 == 0 ? relpos::CropMode::Squash : size % 3 == 1 ? relpos::CropMode::Border : relpos::CropMode::Center;
    (void)relpos::make_batch({img}, p);
  } catch (const relpos::Error&) {
  }
  return 0;
}
