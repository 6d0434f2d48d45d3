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

// Throws relpos::Error naming the path when it is something other than a regular file that can
// be read to its end: a named pipe (opening one waits for a writer, forever if none comes; and
// images and models are read by their size, which a pipe has not), a device (/dev/zero never
// ends), a socket. With allow_pipe, a pipe passes (a labels file read line by line from
// `<(...)`). Missing paths and folders are left to the caller's own message. `what` names the
// files in the plural ("images", "labels files", ...).
void check_regular_file(const std::string& path, const char* what, bool allow_pipe = false);

}  // namespace relpos::detail
