// Overflow-checked size arithmetic for sizes computed from untrusted files (safetensors shapes,
// IDX dimensions, weights JSON shapes). Every loader multiplies through these helpers, so a size
// that would wrap throws relpos::Error naming the file and field instead of under-allocating.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "relpos/error.hpp"

namespace relpos {

// a * b for non-negative sizes; throws naming `what` (e.g. "file.safetensors: tensor 'x' shape") on overflow.
inline std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const std::string& what) {
  std::uint64_t r = 0;
  RELPOS_CHECK(!__builtin_mul_overflow(a, b, &r), what << ": size " << a << " x " << b << " overflows 64 bits");
  return r;
}

inline std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, const std::string& what) {
  std::uint64_t r = 0;
  RELPOS_CHECK(!__builtin_add_overflow(a, b, &r), what << ": size " << a << " + " << b << " overflows 64 bits");
  return r;
}

// Product of non-negative dimensions, bounded by INT64_MAX so it fits a signed element count.
template <typename Int>
std::int64_t checked_numel(const std::vector<Int>& dims, const std::string& what) {
  std::uint64_t n = 1;
  for (auto d : dims) {
    RELPOS_CHECK(d >= 0, what << ": negative dimension " << static_cast<long long>(d));
    n = checked_mul(n, static_cast<std::uint64_t>(d), what);
  }
  RELPOS_CHECK(n <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
               what << ": element count " << n << " does not fit a signed 64-bit count");
  return static_cast<std::int64_t>(n);
}

}  // namespace relpos
