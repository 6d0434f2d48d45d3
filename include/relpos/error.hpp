// relpos: the one exception type the library throws, and a check macro for it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace relpos {

// Every failure the library reports (bad files, wrong shapes, unsupported options) is an Error
// whose what() names the problem in words a user can act on.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace relpos

// RELPOS_CHECK(cond, "tensor " << name << " has shape " << s);
#define RELPOS_CHECK(cond, msg)                      \
  do {                                               \
    if (!(cond)) {                                   \
      std::ostringstream relpos_check_os_;           \
      relpos_check_os_ << msg;                       \
      throw ::relpos::Error(relpos_check_os_.str()); \
    }                                                \
  } while (0)

#define RELPOS_FAIL(msg) RELPOS_CHECK(false, msg)
