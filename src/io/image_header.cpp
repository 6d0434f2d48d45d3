#include "io/image_header.hpp"

#include <cctype>
#include <cstdlib>
#include <cstring>

#include "relpos/error.hpp"

namespace relpos::detail {

namespace {

// Bounds-checked reads of little- and big-endian integers from a file's bytes.
class Bytes {
 public:
  Bytes(const std::string& b, const std::string& name, const char* format) : b_(b), name_(name), format_(format) {}
  std::size_t size() const { return b_.size(); }
  bool starts_with(const char* magic, std::size_t n) const {
    return b_.size() >= n && std::memcmp(b_.data(), magic, n) == 0;
  }
  bool has(std::size_t pos, std::size_t n) const { return pos <= b_.size() && n <= b_.size() - pos; }
  void need(std::size_t pos, std::size_t n, const char* what) const {
    RELPOS_CHECK(has(pos, n), name_ << ": truncated " << format_ << " (the file ends at byte " << b_.size()
                                    << ", inside the " << what << ")");
  }
  unsigned byte(std::size_t pos) const { return static_cast<unsigned char>(b_[pos]); }
  // n-byte unsigned integer at pos (n <= 8), big- or little-endian
  std::uint64_t uint(std::size_t pos, int n, bool big_endian, const char* what) const {
    need(pos, static_cast<std::size_t>(n), what);
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) {
      const unsigned b = byte(pos + static_cast<std::size_t>(big_endian ? i : n - 1 - i));
      v = (v << 8) | b;
    }
    return v;
  }
  bool same(std::size_t pos, const char* s, std::size_t n) const {
    return has(pos, n) && std::memcmp(b_.data() + pos, s, n) == 0;
  }
  [[noreturn]] void damaged(const std::string& why) const { RELPOS_FAIL(name_ << ": damaged " << format_ << " (" << why << ")"); }

 private:
  const std::string& b_;
  const std::string& name_;
  const char* format_;
};

ImageHeader png(const Bytes& b) {
  // the first chunk must be IHDR (13 bytes): width, height, ...
  b.need(8, 8 + 13, "IHDR chunk");
  if (!b.same(12, "IHDR", 4) || b.uint(8, 4, true, "IHDR chunk") != 13) b.damaged("the first chunk is not a 13-byte IHDR");
  return {"PNG", static_cast<std::int64_t>(b.uint(16, 4, true, "IHDR chunk")),
          static_cast<std::int64_t>(b.uint(20, 4, true, "IHDR chunk"))};
}

// Walks the marker segments to the first frame header (SOF0-SOF15 but DHT, JPG and DAC).
ImageHeader jpeg(const Bytes& b) {
  std::size_t pos = 2;
  while (true) {
    b.need(pos, 2, "marker segments");
    if (b.byte(pos) != 0xFF) b.damaged("no marker at byte " + std::to_string(pos));
    while (b.has(pos, 1) && b.byte(pos) == 0xFF) ++pos;  // fill bytes
    b.need(pos, 1, "marker segments");
    const unsigned m = b.byte(pos++);
    if (m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7)) continue;  // markers without a length
    if (m == 0xD9 || m == 0xDA) b.damaged("no frame header before the image data");
    const std::size_t len = b.uint(pos, 2, true, "marker segments");
    if (len < 2) b.damaged("a segment at byte " + std::to_string(pos) + " claims " + std::to_string(len) + " bytes");
    if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
      if (len < 8) b.damaged("a frame header of " + std::to_string(len) + " bytes");
      return {"JPEG", static_cast<std::int64_t>(b.uint(pos + 5, 2, true, "frame header")),
              static_cast<std::int64_t>(b.uint(pos + 3, 2, true, "frame header"))};
    }
    pos += len;
  }
}

ImageHeader bmp(const Bytes& b) {
  const std::uint64_t info = b.uint(14, 4, false, "bitmap header");
  if (info == 12) {  // OS/2 BITMAPCOREHEADER: 16-bit sizes
    return {"BMP", static_cast<std::int64_t>(b.uint(18, 2, false, "bitmap header")),
            static_cast<std::int64_t>(b.uint(20, 2, false, "bitmap header"))};
  }
  if (info < 16) b.damaged("a bitmap header of " + std::to_string(info) + " bytes");
  const auto w = static_cast<std::int32_t>(b.uint(18, 4, false, "bitmap header"));
  const auto h = static_cast<std::int32_t>(b.uint(22, 4, false, "bitmap header"));
  // a negative height means rows stored top-down
  return {"BMP", w, h < 0 ? -static_cast<std::int64_t>(h) : h};
}

ImageHeader webp(const Bytes& b) {
  b.need(12, 4, "first chunk");
  if (b.same(12, "VP8 ", 4)) {  // lossy: frame tag (3 bytes), start code 9d 01 2a, 14-bit sizes
    b.need(20, 10, "VP8 frame header");
    if (!b.same(23, "\x9d\x01\x2a", 3)) b.damaged("no VP8 start code");
    return {"WebP", static_cast<std::int64_t>(b.uint(26, 2, false, "VP8 frame header") & 0x3fff),
            static_cast<std::int64_t>(b.uint(28, 2, false, "VP8 frame header") & 0x3fff)};
  }
  if (b.same(12, "VP8L", 4)) {  // lossless: signature 0x2f, then 14 bits width-1, 14 bits height-1
    b.need(20, 5, "VP8L header");
    if (b.byte(20) != 0x2f) b.damaged("no VP8L signature");
    const std::uint64_t v = b.uint(21, 4, false, "VP8L header");
    return {"WebP", static_cast<std::int64_t>((v & 0x3fff) + 1), static_cast<std::int64_t>(((v >> 14) & 0x3fff) + 1)};
  }
  if (b.same(12, "VP8X", 4)) {  // extended: 24-bit canvas width-1 and height-1
    return {"WebP", static_cast<std::int64_t>(b.uint(24, 3, false, "VP8X header") + 1),
            static_cast<std::int64_t>(b.uint(27, 3, false, "VP8X header") + 1)};
  }
  b.damaged("the first chunk is not VP8, VP8L or VP8X");
}

ImageHeader pnm(const Bytes& b) {
  std::size_t pos = 2;
  std::int64_t v[2] = {0, 0};
  for (auto& x : v) {
    while (true) {  // whitespace and comments
      b.need(pos, 1, "header");
      const unsigned c = b.byte(pos);
      if (c == '#') {
        while (b.has(pos, 1) && b.byte(pos) != '\n' && b.byte(pos) != '\r') ++pos;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
        ++pos;
      } else {
        break;
      }
    }
    int digits = 0;
    while (b.has(pos, 1) && b.byte(pos) >= '0' && b.byte(pos) <= '9') {
      if (++digits > 12) b.damaged("a size of more than 12 digits");
      x = x * 10 + (b.byte(pos++) - '0');
    }
    if (digits == 0) b.damaged("no width and height after the magic number");
  }
  return {"PNM", v[0], v[1]};
}

// The first image file directory's ImageWidth (256) and ImageLength (257), classic or BigTIFF.
ImageHeader tiff(const Bytes& b, bool big_endian, bool bigtiff) {
  const int off_bytes = bigtiff ? 8 : 4, count_bytes = bigtiff ? 8 : 2, entry_bytes = bigtiff ? 20 : 12;
  if (bigtiff && (b.uint(4, 2, big_endian, "header") != 8 || b.uint(6, 2, big_endian, "header") != 0))
    b.damaged("a BigTIFF header whose offsets are not 8 bytes");
  const std::uint64_t ifd = b.uint(bigtiff ? 8 : 4, off_bytes, big_endian, "header");
  if (ifd >= b.size()) b.damaged("the first directory's offset " + std::to_string(ifd) + " is past the end");
  const std::uint64_t n = b.uint(ifd, count_bytes, big_endian, "first directory");
  std::int64_t size[2] = {-1, -1};
  for (std::uint64_t i = 0; i < n && (size[0] < 0 || size[1] < 0); ++i) {
    if (i >= b.size()) break;  // more entries than bytes: the need() below fails first
    const std::uint64_t e = ifd + static_cast<std::uint64_t>(count_bytes) + i * static_cast<std::uint64_t>(entry_bytes);
    const std::uint64_t tag = b.uint(e, 2, big_endian, "first directory");
    const std::uint64_t type = b.uint(e + 2, 2, big_endian, "first directory");
    if (tag != 256 && tag != 257) continue;
    const std::size_t value = e + 4 + static_cast<std::size_t>(off_bytes);
    std::uint64_t x = 0;
    if (type == 3) x = b.uint(value, 2, big_endian, "first directory");        // SHORT
    else if (type == 4) x = b.uint(value, 4, big_endian, "first directory");   // LONG
    else if (type == 16 && bigtiff) x = b.uint(value, 8, big_endian, "first directory");  // LONG8
    else b.damaged("tag " + std::to_string(tag) + " of type " + std::to_string(type));
    if (x > (std::uint64_t{1} << 40)) x = std::uint64_t{1} << 40;  // still over any limit, no overflow
    size[tag - 256] = static_cast<std::int64_t>(x);
  }
  if (size[0] < 0 || size[1] < 0) b.damaged("no ImageWidth and ImageLength in the first directory");
  return {"TIFF", size[0], size[1]};
}

}  // namespace

ImageHeader read_image_header(const std::string& bytes, const std::string& name) {
  const Bytes any(bytes, name, "image");
  const auto as = [&](const char* format) { return Bytes(bytes, name, format); };
  if (any.starts_with("\x89PNG\r\n\x1a\n", 8)) return png(as("PNG"));
  if (any.starts_with("\xFF\xD8\xFF", 3)) return jpeg(as("JPEG"));
  if (any.starts_with("BM", 2)) return bmp(as("BMP"));
  if (any.starts_with("II*\0", 4)) return tiff(as("TIFF"), false, false);
  if (any.starts_with("MM\0*", 4)) return tiff(as("TIFF"), true, false);
  if (any.starts_with("II+\0", 4)) return tiff(as("TIFF"), false, true);
  if (any.starts_with("MM\0+", 4)) return tiff(as("TIFF"), true, true);
  if (any.starts_with("RIFF", 4) && any.same(8, "WEBP", 4)) return webp(as("WebP"));
  if (bytes.size() >= 3 && bytes[0] == 'P' && bytes[1] >= '1' && bytes[1] <= '6' && std::isspace(static_cast<unsigned char>(bytes[2])))
    return pnm(as("PNM"));
  RELPOS_FAIL(name << ": not a readable image (relpos reads PNG, JPEG, BMP, TIFF, WebP and PNM files; this is none of them)");
}

std::int64_t max_image_pixels() {
  constexpr std::int64_t kPillow = 2 * 89478485;
  const char* env = std::getenv("RELPOS_MAX_IMAGE_PIXELS");
  if (env == nullptr || *env == '\0') return kPillow;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  RELPOS_CHECK(*end == '\0' && v > 0, "RELPOS_MAX_IMAGE_PIXELS='" << env << "' is not a positive integer");
  return v;
}

}  // namespace relpos::detail
