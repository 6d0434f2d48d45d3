#include "io/base64.hpp"

#include <array>

#include "relpos/error.hpp"

namespace relpos::detail {

namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::array<signed char, 256> make_table() {
  std::array<signed char, 256> t{};
  t.fill(-1);
  for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(kAlphabet[i])] = static_cast<signed char>(i);
  return t;
}
}  // namespace

std::string base64_encode(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.resize((bytes + 2) / 3 * 4);
  std::size_t o = 0, i = 0;
  for (; i + 3 <= bytes; i += 3) {
    const unsigned v = (p[i] << 16) | (p[i + 1] << 8) | p[i + 2];
    out[o++] = kAlphabet[(v >> 18) & 63];
    out[o++] = kAlphabet[(v >> 12) & 63];
    out[o++] = kAlphabet[(v >> 6) & 63];
    out[o++] = kAlphabet[v & 63];
  }
  if (i < bytes) {
    unsigned v = p[i] << 16;
    if (i + 1 < bytes) v |= p[i + 1] << 8;
    out[o++] = kAlphabet[(v >> 18) & 63];
    out[o++] = kAlphabet[(v >> 12) & 63];
    out[o++] = i + 1 < bytes ? kAlphabet[(v >> 6) & 63] : '=';
    out[o++] = '=';
  }
  return out;
}

std::vector<unsigned char> base64_decode(const std::string& text) {
  static const auto table = make_table();
  RELPOS_CHECK(text.size() % 4 == 0, "base64 text of length " << text.size() << " (not a multiple of 4)");
  std::size_t pad = 0;
  if (!text.empty() && text.back() == '=') ++pad;
  if (text.size() >= 2 && text[text.size() - 2] == '=') ++pad;
  std::vector<unsigned char> out(text.size() / 4 * 3 - pad);
  std::size_t o = 0;
  for (std::size_t i = 0; i < text.size(); i += 4) {
    unsigned v = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      int d;
      if (c == '=' && i + 4 == text.size() && k >= 4 - pad) {
        d = 0;
      } else {
        d = table[static_cast<unsigned char>(c)];
        RELPOS_CHECK(d >= 0, "invalid base64 character at offset " << i + k);
      }
      v = (v << 6) | static_cast<unsigned>(d);
    }
    if (o < out.size()) out[o++] = static_cast<unsigned char>(v >> 16);
    if (o < out.size()) out[o++] = static_cast<unsigned char>(v >> 8);
    if (o < out.size()) out[o++] = static_cast<unsigned char>(v);
  }
  return out;
}

}  // namespace relpos::detail
