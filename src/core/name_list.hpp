#pragma once
// A few names for a message: "a, b, c, d, e, ..." (the first `shown`, then "..." when there are more).
#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

namespace relpos::detail {

inline std::string listed_names(const std::vector<std::string>& names, std::size_t shown = 5) {
  std::ostringstream os;
  for (std::size_t i = 0; i < names.size() && i < shown; ++i) os << (i ? ", " : "") << names[i];
  if (names.size() > shown) os << ", ...";
  return os.str();
}

}  // namespace relpos::detail
