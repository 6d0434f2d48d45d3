#include "io/image_header.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/environment.hpp"
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
  const std::uint64_t pixels_at = b.uint(10, 4, false, "file header");
  const std::uint64_t info = b.uint(14, 4, false, "bitmap header");
  ImageHeader r{"BMP", 0, 0};
  std::uint64_t bpp = 0, compression = 0;
  if (info == 12) {  // OS/2 BITMAPCOREHEADER: 16-bit sizes
    r.width = static_cast<std::int64_t>(b.uint(18, 2, false, "bitmap header"));
    r.height = static_cast<std::int64_t>(b.uint(20, 2, false, "bitmap header"));
    bpp = b.uint(24, 2, false, "bitmap header");
  } else {
    if (info < 16) b.damaged("a bitmap header of " + std::to_string(info) + " bytes");
    r.width = static_cast<std::int32_t>(b.uint(18, 4, false, "bitmap header"));
    const auto h = static_cast<std::int32_t>(b.uint(22, 4, false, "bitmap header"));
    r.height = h < 0 ? -static_cast<std::int64_t>(h) : h;  // a negative height: rows stored top-down
    bpp = b.uint(28, 2, false, "bitmap header");
    if (info >= 20) compression = b.uint(30, 4, false, "bitmap header");
  }
  // uncompressed rows (BI_RGB, BI_BITFIELDS, BI_ALPHABITFIELDS) of whole 4-byte words
  const bool plain = compression == 0 || compression == 3 || compression == 6;
  if (plain && r.width > 0 && (bpp == 1 || bpp == 4 || bpp == 8 || bpp == 16 || bpp == 24 || bpp == 32))
    r.data_end = static_cast<double>(pixels_at) +
                 std::floor((static_cast<double>(r.width) * static_cast<double>(bpp) + 31) / 32) * 4 * static_cast<double>(r.height);
  return r;
}

ImageHeader webp_size(const Bytes& b) {
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

ImageHeader webp(const Bytes& b) {
  ImageHeader r = webp_size(b);
  r.data_end = static_cast<double>(b.uint(4, 4, false, "RIFF header")) + 8;  // the RIFF size counts from byte 8
  return r;
}

// P1-P6: width, height and (but for the bitmaps P1 and P4) the largest value, as decimal numbers
// between whitespace and comments; binary data (P4-P6) starts after one more whitespace byte.
ImageHeader pnm(const Bytes& b) {
  const unsigned kind = b.byte(1) - '0';
  const bool bitmap = kind == 1 || kind == 4;
  std::size_t pos = 2;
  std::int64_t v[3] = {0, 0, 0};
  for (int i = 0; i < (bitmap ? 2 : 3); ++i) {
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
      if (++digits > 12) b.damaged("a number of more than 12 digits in the header");
      v[i] = v[i] * 10 + (b.byte(pos++) - '0');
    }
    if (digits == 0) b.damaged(i < 2 ? "no width and height after the magic number" : "no largest value after the size");
  }
  ImageHeader r{"PNM", v[0], v[1]};
  if (kind >= 4) {
    const double w = static_cast<double>(v[0]), h = static_cast<double>(v[1]);
    const double sample = v[2] > 255 ? 2 : 1, channels = kind == 6 ? 3 : 1;
    r.data_end = static_cast<double>(pos + 1) + (bitmap ? std::ceil(w / 8) * h : w * h * channels * sample);
  }
  return r;
}

// The first image file directory's ImageWidth (256) and ImageLength (257), classic or BigTIFF, and
// where its data ends: the last of its values stored out of line, or of its strips (StripOffsets
// 273, StripByteCounts 279) or tiles (324, 325).
ImageHeader tiff(const Bytes& b, bool big_endian, bool bigtiff) {
  const int off_bytes = bigtiff ? 8 : 4, count_bytes = bigtiff ? 8 : 2, entry_bytes = bigtiff ? 20 : 12;
  if (bigtiff && (b.uint(4, 2, big_endian, "header") != 8 || b.uint(6, 2, big_endian, "header") != 0))
    b.damaged("a BigTIFF header whose offsets are not 8 bytes");
  const std::uint64_t ifd = b.uint(bigtiff ? 8 : 4, off_bytes, big_endian, "header");
  if (ifd >= b.size()) b.damaged("the first directory's offset " + std::to_string(ifd) + " is past the end");
  const std::uint64_t n = b.uint(ifd, count_bytes, big_endian, "first directory");
  if (n > b.size()) b.damaged("the first directory claims " + std::to_string(n) + " entries");
  // the entries, then the next directory's offset
  b.need(ifd + static_cast<std::uint64_t>(count_bytes), n * static_cast<std::uint64_t>(entry_bytes) + static_cast<std::uint64_t>(off_bytes),
         "first directory");
  // An entry's values (SHORT, LONG or, in BigTIFF, LONG8): in the entry when they fit, else at an offset.
  struct Values {
    std::uint64_t count = 0, at = 0;
    int bytes = 0;
  };
  const auto values = [&](std::uint64_t e, std::uint64_t tag) {
    Values v;
    const std::uint64_t type = b.uint(e + 2, 2, big_endian, "first directory");
    v.bytes = type == 3 ? 2 : type == 4 ? 4 : type == 16 && bigtiff ? 8 : 0;
    if (v.bytes == 0) b.damaged("tag " + std::to_string(tag) + " of type " + std::to_string(type));
    v.count = b.uint(e + 4, off_bytes, big_endian, "first directory");
    if (v.count > b.size()) b.damaged("tag " + std::to_string(tag) + " claims " + std::to_string(v.count) + " values");
    const std::uint64_t field = e + 4 + static_cast<std::uint64_t>(off_bytes);
    v.at = v.count * static_cast<std::uint64_t>(v.bytes) <= static_cast<std::uint64_t>(off_bytes)
               ? field : b.uint(field, off_bytes, big_endian, "first directory");
    b.need(v.at, v.count * static_cast<std::uint64_t>(v.bytes), "values of a directory entry");
    return v;
  };
  const auto value = [&](const Values& v, std::uint64_t i) {
    return b.uint(v.at + i * static_cast<std::uint64_t>(v.bytes), v.bytes, big_endian, "values of a directory entry");
  };
  // bytes per value of each field type (BYTE, ASCII, SHORT, LONG, RATIONAL, ..., LONG8, SLONG8, IFD8)
  static const int kTypeBytes[19] = {0, 1, 1, 2, 4, 8, 1, 1, 2, 4, 8, 4, 8, 4, 0, 0, 8, 8, 8};
  std::int64_t size[2] = {-1, -1};
  Values offsets, counts;
  double values_end = 0;  // where the last of the directory's out-of-line values ends
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t e = ifd + static_cast<std::uint64_t>(count_bytes) + i * static_cast<std::uint64_t>(entry_bytes);
    const std::uint64_t tag = b.uint(e, 2, big_endian, "first directory");
    const std::uint64_t type = b.uint(e + 2, 2, big_endian, "first directory");
    const double bytes = type < 19 ? static_cast<double>(kTypeBytes[type]) *
                                         static_cast<double>(b.uint(e + 4, off_bytes, big_endian, "first directory"))
                                   : 0.0;  // an unknown type: libtiff skips the entry
    if (bytes > off_bytes) {
      const std::uint64_t at = b.uint(e + 4 + static_cast<std::uint64_t>(off_bytes), off_bytes, big_endian, "first directory");
      values_end = std::max(values_end, static_cast<double>(at) + bytes);
    }
    if (tag == 256 || tag == 257) {
      const Values v = values(e, tag);
      if (v.count != 1) b.damaged("tag " + std::to_string(tag) + " has " + std::to_string(v.count) + " values");
      const std::uint64_t x = value(v, 0);
      size[tag - 256] = static_cast<std::int64_t>(x > (std::uint64_t{1} << 40) ? std::uint64_t{1} << 40 : x);  // no overflow
    } else if (tag == 273 || tag == 324) {
      offsets = values(e, tag);
    } else if (tag == 279 || tag == 325) {
      counts = values(e, tag);
    }
  }
  if (size[0] < 0 || size[1] < 0) b.damaged("no ImageWidth and ImageLength in the first directory");
  ImageHeader r{"TIFF", size[0], size[1]};
  r.data_end = values_end;
  // (libtiff estimates missing or inconsistent byte counts itself: no check then)
  if (offsets.count == counts.count)
    for (std::uint64_t i = 0; i < offsets.count; ++i)
      r.data_end = std::max(r.data_end, static_cast<double>(value(offsets, i)) + static_cast<double>(value(counts, i)));
  return r;
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
  const char* env = setting("RELPOS_MAX_IMAGE_PIXELS");
  if (env == nullptr) return kPillow;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  RELPOS_CHECK(*end == '\0' && v > 0, "RELPOS_MAX_IMAGE_PIXELS='" << env << "' is not a positive integer");
  return v;
}

}  // namespace relpos::detail
