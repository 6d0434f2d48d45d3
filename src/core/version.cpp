#include "relpos/version.hpp"

namespace relpos {

// Compiled into the library, so a program sees the version of the librelpos it runs with, not that
// of the headers it was compiled against.
std::string version() { return RELPOS_VERSION_STRING; }

}  // namespace relpos
