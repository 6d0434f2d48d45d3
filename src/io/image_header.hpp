// Internal: the format and declared size of an image file, read from its first bytes before any
// decoder runs, so that a file claiming billions of pixels (a "decompression bomb") is refused
// before OpenCV allocates for it, and formats relpos does not read never reach their codec.
#pragma once

#include <cstdint>
#include <string>

namespace relpos::detail {

struct ImageHeader {
  const char* format = "";  // "PNG", "JPEG", "BMP", "TIFF", "WebP", "PNM"
  std::int64_t width = 0, height = 0;
  // Where the header says the image data ends, for the formats where it says so: BMP without
  // run-length coding, binary PNM, WebP (the RIFF size), TIFF (the last strip or tile); 0 where
  // it does not (PNG and JPEG, whose own checks find a cut; ASCII PNM; compressed BMP). Saturates
  // at 2^62 instead of wrapping.
  double data_end = 0;
};

// Reads the header of a PNG, JPEG, BMP, TIFF (classic or BigTIFF), WebP or PNM (P1-P6) file: the
// formats whose extensions relpos collects from image folders (has_image_extension). Throws
// relpos::Error naming `name` for any other content ("not a readable image ...") and for a header
// that is cut short or damaged. Only sizes and data offsets are read; the decoder checks the rest.
ImageHeader read_image_header(const std::string& bytes, const std::string& name);

// Pillow refuses images over 2 * 89478485 pixels (its DecompressionBombError); so does relpos,
// unless RELPOS_MAX_IMAGE_PIXELS sets another limit (a positive integer).
std::int64_t max_image_pixels();

}  // namespace relpos::detail
