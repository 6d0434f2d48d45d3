// Internal: the library side of relpos/runtime.hpp.
#pragma once

#include <string>

namespace relpos::detail {

// Makes the calling thread use the thread setting (every op and Model call starts with it).
void apply_thread_setting();
// A message for the application's log handler (stderr by default).
void log(const std::string& message);

}  // namespace relpos::detail
