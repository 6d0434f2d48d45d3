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

namespace detail {
// "name: message", unless the message already starts with the name (errors that name their file).
inline std::string naming(const std::string& name, const std::string& message) {
  if (message.compare(0, name.size(), name) == 0) return message;
  return name + ": " + message;
}
}  // namespace detail

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

// An unconditional throw (not RELPOS_CHECK(false, ...)): unoptimised builds (-O0) do not fold the
// condition, and would warn that a function ending in RELPOS_FAIL returns no value.
#define RELPOS_FAIL(msg)                           \
  do {                                             \
    std::ostringstream relpos_fail_os_;            \
    relpos_fail_os_ << msg;                        \
    throw ::relpos::Error(relpos_fail_os_.str());  \
  } while (0)
