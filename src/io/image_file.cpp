#include "io/image_file.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>
#ifndef RELPOS_NO_IMAGE_CODECS
#include <opencv2/imgcodecs.hpp>
#endif

#include "io/atomic_file.hpp"
#include "io/image_header.hpp"
#include "relpos/error.hpp"

namespace relpos::detail {

namespace {
std::uint32_t be32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

// Walks the chunks (length, type, data, CRC) up to IEND, checking each, and returns the file with
// only the chunks that decide the pixels (IHDR, PLTE, tRNS, IDAT, IEND): OpenCV ignores the others
// (colour profiles, text, times), and libpng would print warnings about some of them to stderr
// ("iCCP: known incorrect sRGB profile"). Pillow's pixel values do not depend on them either.
std::string check_png(const std::string& b, const std::string& name) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  std::size_t pos = 8;
  bool seen_idat = false;
  std::string kept = b.substr(0, 8);
  while (true) {
    RELPOS_CHECK(pos + 12 <= b.size(), name << ": truncated PNG (the file ends at byte " << b.size()
                                            << " before the IEND chunk)");
    const std::uint32_t len = be32(p + pos);
    RELPOS_CHECK(len <= 0x7fffffffu && len <= b.size() - pos - 12,
                 name << ": truncated PNG (a chunk at byte " << pos << " claims " << len << " bytes)");
    const std::string type(b.data() + pos + 4, 4);
    const auto crc = static_cast<std::uint32_t>(crc32(0L, p + pos + 4, static_cast<uInt>(len + 4)));
    RELPOS_CHECK(crc == be32(p + pos + 8 + len),
                 name << ": damaged PNG (CRC mismatch in the " << type << " chunk at byte " << pos << ")");
    if (type == "IDAT") seen_idat = true;
    if (type == "IHDR" || type == "PLTE" || type == "tRNS" || type == "IDAT" || type == "IEND")
      kept.append(b, pos, 12 + len);
    pos += 12 + len;
    if (type == "IEND") break;
  }
  RELPOS_CHECK(seen_idat, name << ": damaged PNG (no image data)");
  return kept;
}

// A JPEG must carry an end-of-image marker after its last start-of-scan.
void check_jpeg(const std::string& b, const std::string& name) {
  const std::size_t sos = b.rfind("\xFF\xDA");
  RELPOS_CHECK(sos != std::string::npos, name << ": damaged JPEG (no image data)");
  RELPOS_CHECK(b.find("\xFF\xD9", sos + 2) != std::string::npos,
               name << ": truncated JPEG (no end-of-image marker: the file was cut short)");
}
}  // namespace

cv::Mat decode_image_bytes(const std::string& bytes, const std::string& name, std::int64_t max_pixels) {
  RELPOS_CHECK(!bytes.empty(), name << ": empty file, not an image");
  const ImageHeader h = read_image_header(bytes, name);
  RELPOS_CHECK(h.width > 0 && h.height > 0,
               name << ": damaged " << h.format << " (its header gives a size of " << h.width << " x " << h.height << ")");
  RELPOS_CHECK(h.width <= max_pixels / h.height,
               name << ": " << h.format << " of " << h.width << " x " << h.height << " pixels, over the limit of " << max_pixels
                    << " (a decompression bomb, or an image too large to load); set RELPOS_MAX_IMAGE_PIXELS to allow it");
  RELPOS_CHECK(h.data_end <= static_cast<double>(bytes.size()),
               name << ": truncated " << h.format << " (the header places image data up to byte "
                    << static_cast<std::uint64_t>(std::min(h.data_end, 4.6e18)) << ", but the file ends at byte " << bytes.size() << ")");
  std::string png;
  if (std::strcmp(h.format, "PNG") == 0) {
    // libpng's default limit (PNG_USER_HEIGHT_MAX, _WIDTH_MAX), which OpenCV keeps: it refused such a
    // file as "damaged", and printed its own warning on stderr
    RELPOS_CHECK(h.width <= 1000000 && h.height <= 1000000,
                 name << ": PNG of " << h.width << " x " << h.height
                      << " pixels: the PNG decoder takes at most 1000000 pixels on a side; convert it to another format");
    png = check_png(bytes, name);
  }
  else if (std::strcmp(h.format, "JPEG") == 0) check_jpeg(bytes, name);
  const std::string& data = png.empty() ? bytes : png;
  RELPOS_CHECK(data.size() < 0x7fffffffu, name << ": " << data.size() << " bytes is too large an image file");
  cv::Mat img;
#ifdef RELPOS_NO_IMAGE_CODECS
  RELPOS_FAIL(name << ": this relpos was built without image-file decoding (RELPOS_IMAGE_CODECS=OFF)");
#endif
  try {
    const cv::Mat buf(1, static_cast<int>(data.size()), CV_8UC1, const_cast<char*>(data.data()));
#ifndef RELPOS_NO_IMAGE_CODECS
    img = cv::imdecode(buf, cv::IMREAD_UNCHANGED);
#else
    (void)buf;
#endif
  } catch (const cv::Exception& e) {
    RELPOS_FAIL(name << ": OpenCV could not decode it (" << e.err << ")");
  }
  RELPOS_CHECK(!img.empty(), name << ": not a readable image (unknown format or damaged data)");
  if (img.depth() == CV_32F || img.depth() == CV_64F) {
    // A floating-point TIFF: Pillow opens it as mode F, and convert("RGB") (timm's loader) clips
    // each value to 0..255 and truncates it to 8 bits. Taken as 0..255 floats unclipped, a file
    // holding 0..255000 gave a confident wrong class. NaN has no such value: refused.
    RELPOS_CHECK(cv::checkRange(img, /*quiet=*/true), name << ": a floating-point image holding NaN or infinite values");
    cv::Mat f;
    img.convertTo(f, CV_64F);
    cv::Mat out(img.size(), CV_MAKETYPE(CV_8U, img.channels()));
    for (int y = 0; y < f.rows; ++y) {
      const double* in = f.ptr<double>(y);
      std::uint8_t* o = out.ptr<std::uint8_t>(y);
      for (int x = 0; x < f.cols * f.channels(); ++x)
        o[x] = in[x] <= 0.0 ? 0 : in[x] >= 255.0 ? 255 : static_cast<std::uint8_t>(in[x]);
    }
    img = out;
  }
  return img;
}

cv::Mat decode_image_file(const std::string& path) {
  check_regular_file(path, "images");
  return decode_image_bytes(read_file(path), path, max_image_pixels());
}

void encode_image_file(const std::string& path, const cv::Mat& img) {
  RELPOS_CHECK(!img.empty(), "cannot write " << path << ": the image is empty");
#ifdef RELPOS_NO_IMAGE_CODECS
  RELPOS_FAIL("cannot write " << path << ": this relpos was built without image files (RELPOS_IMAGE_CODECS=OFF)");
#else
  const std::size_t dot = path.rfind('.');
  const std::size_t slash = path.find_last_of('/');
  RELPOS_CHECK(dot != std::string::npos && (slash == std::string::npos || dot > slash),
               "cannot write " << path << ": no file extension to choose the image format (.png, .jpg, ...)");
  std::vector<unsigned char> bytes;
  bool ok = false;
  try {
    ok = cv::imencode(path.substr(dot), img, bytes);
  } catch (const cv::Exception& e) {
    RELPOS_FAIL("cannot write " << path << ": OpenCV could not encode the image (" << e.err << ")");
  }
  RELPOS_CHECK(ok, "cannot write " << path << ": OpenCV could not encode the image");
  write_atomically(path, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  });
#endif
}

}  // namespace relpos::detail
