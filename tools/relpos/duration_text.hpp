// relpos CLI: a duration in seconds as "m:ss" or "h:mm:ss", for progress bars and logs.
#pragma once

#include <iomanip>
#include <sstream>
#include <string>

namespace relpos::cli {

inline std::string duration_text(double seconds) {
  const long t = static_cast<long>(seconds + 0.5);
  std::ostringstream os;
  if (t >= 3600) os << t / 3600 << ":" << std::setw(2) << std::setfill('0') << (t / 60) % 60;
  else os << t / 60;
  os << ":" << std::setw(2) << std::setfill('0') << t % 60;
  return os.str();
}

}  // namespace relpos::cli
