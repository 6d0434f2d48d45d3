#pragma once
// Text for a terminal's columns: counted in characters (UTF-8 code points), not bytes, so that a label
// such as "café" pads like "cafe" and a cut never splits a character.
#include <cstddef>
#include <string>

namespace relpos::detail {

inline std::size_t text_columns(const std::string& s) {
  std::size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// The first `columns` characters of s, padded with spaces to `columns` when shorter.
inline std::string text_in_columns(const std::string& s, std::size_t columns) {
  std::size_t end = 0, n = 0;
  for (; end < s.size(); ++end) {
    const bool first_byte = (static_cast<unsigned char>(s[end]) & 0xC0) != 0x80;  // of a character
    if (first_byte && n == columns) break;
    n += first_byte;
  }
  return s.substr(0, end) + std::string(columns - n, ' ');
}

}  // namespace relpos::detail
