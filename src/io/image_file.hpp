// Internal: reading image files with OpenCV without letting a damaged file through silently or
// letting the codec libraries print to stderr.
#pragma once

#include <opencv2/core.hpp>
#include <cstdint>
#include <string>

namespace relpos::detail {

// Decodes a PNG, JPEG, BMP, TIFF, WebP or PNM file (channels and depth unchanged). A truncated or
// damaged file, a file in any other format (OpenCV's JPEG 2000, OpenEXR, Radiance, DICOM, ...
// decoders are never reached), an image over max_image_pixels() (read from the header, before
// anything is allocated), a missing file or a folder throws relpos::Error naming the file and the
// problem. PNG chunks are walked and their CRCs checked, a JPEG must reach its end-of-image marker,
// and other files must hold the data their headers place (ImageHeader::data_end), before the
// decoder sees the bytes (libpng and libjpeg would otherwise print warnings and,
// for JPEG, return a partly grey image as timm's Pillow would refuse to).
cv::Mat decode_image_file(const std::string& path);
// The same checks and decoding for bytes already in memory; `name` is used in messages.
cv::Mat decode_image_bytes(const std::string& bytes, const std::string& name, std::int64_t max_pixels);
// Encodes img in the format its extension names (.png, .jpg, ...) and writes it atomically (the old
// file or the complete new one, never half a picture). Throws relpos::Error naming the path if the
// extension is unknown, the image cannot be encoded or the file cannot be written.
void encode_image_file(const std::string& path, const cv::Mat& img);

}  // namespace relpos::detail
