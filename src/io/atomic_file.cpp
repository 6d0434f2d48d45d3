#include "io/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "relpos/error.hpp"

namespace relpos::detail {

void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      // (errors name the file the caller asked for; the temporary beside it is an inner detail)
      RELPOS_CHECK(out, "cannot write '" << path << "': " << std::strerror(errno));
      write(out);
      out.flush();
      RELPOS_CHECK(out, "writing '" << path << "' failed: " << std::strerror(errno));
    }
    const int fd = ::open(tmp.c_str(), O_RDONLY);
    if (fd >= 0) {
      ::fsync(fd);
      ::close(fd);
    }
    RELPOS_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0,
                 "cannot move '" << tmp << "' to '" << path << "': " << std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  RELPOS_CHECK(!std::filesystem::is_directory(path, ec), path << ": is a directory, expected a file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  RELPOS_CHECK(in, "cannot open '" << path << "': " << std::strerror(errno));
  const std::streamsize size = in.tellg();
  RELPOS_CHECK(size >= 0, "cannot read '" << path << "' (not a regular file?)");
  in.seekg(0);
  std::string text(static_cast<std::size_t>(size), '\0');
  in.read(text.data(), size);
  RELPOS_CHECK(in || size == 0, "error reading '" << path << "'");
  return text;
}

}  // namespace relpos::detail
