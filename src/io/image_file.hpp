// Internal: reading image files with OpenCV without letting a damaged file through silently or
// letting the codec libraries print to stderr.
#pragma once

#include <opencv2/core.hpp>
#include <string>

namespace relpos::detail {

// Decodes the file (any format OpenCV reads, channels and depth unchanged). A truncated or damaged
// PNG or JPEG, a file that is not an image, a missing file or a folder throws relpos::Error naming
// the file and the problem. PNG chunks are walked and their CRCs checked, and a JPEG must reach its
// end-of-image marker, before the decoder sees the bytes (libpng and libjpeg would otherwise print
// warnings and, for JPEG, return a partly grey image as timm's Pillow would refuse to).
cv::Mat decode_image_file(const std::string& path);
// The same checks and decoding for bytes already in memory; `name` is used in messages.
cv::Mat decode_image_bytes(const std::string& bytes, const std::string& name);
// Encodes img in the format its extension names (.png, .jpg, ...) and writes it atomically (the old
// file or the complete new one, never half a picture). Throws relpos::Error naming the path if the
// extension is unknown, the image cannot be encoded or the file cannot be written.
void encode_image_file(const std::string& path, const cv::Mat& img);

}  // namespace relpos::detail
