// Internal: standard base64 (RFC 4648, with padding).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace relpos::detail {

std::string base64_encode(const void* data, std::size_t bytes);
// Throws relpos::Error on characters outside the alphabet or a bad length.
std::vector<unsigned char> base64_decode(const std::string& text);

}  // namespace relpos::detail
