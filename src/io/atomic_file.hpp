// Internal: write a file so that readers see either the old or the complete new contents.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace relpos::detail {

// Calls write(stream) on "<path>.tmp.<pid>", flushes and fsyncs it, then renames it over path.
// Throws relpos::Error (and removes the temporary) if anything fails.
void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

// The whole file as bytes; throws relpos::Error naming the path if it cannot be read.
std::string read_file(const std::string& path);

}  // namespace relpos::detail
