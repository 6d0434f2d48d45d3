#include "io/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "relpos/error.hpp"
#include "relpos/runtime.hpp"

namespace relpos {

namespace {
// The temporary files being written now, for remove_temporary_files() in a signal handler: fixed
// slots holding copies of their paths (a handler must not touch memory another thread may free).
// A slot is free (0), being filled (1), ready (2), or being read by a handler (3): the write's end
// waits for a handler's unlink to finish before it frees the slot for another path.
constexpr int kTemporarySlots = 64;
constexpr std::size_t kTemporaryPathMax = 4096;
std::atomic<int> g_temporary_state[kTemporarySlots];
char g_temporary_path[kTemporarySlots][kTemporaryPathMax];

class TemporaryFile {
 public:
  explicit TemporaryFile(const std::string& path) {
    if (path.size() >= kTemporaryPathMax) return;  // (the system takes no longer path anyway)
    for (int i = 0; i < kTemporarySlots; ++i) {
      int free = 0;
      if (!g_temporary_state[i].compare_exchange_strong(free, 1)) continue;
      std::memcpy(g_temporary_path[i], path.c_str(), path.size() + 1);
      g_temporary_state[i].store(2);
      slot_ = i;
      return;
    }
  }
  ~TemporaryFile() {
    if (slot_ < 0) return;
    for (int ready = 2; !g_temporary_state[slot_].compare_exchange_weak(ready, 0); ready = 2) {
      // a handler on another thread is reading the path (a handler on this one ran to its end first)
    }
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

 private:
  int slot_ = -1;
};
}  // namespace

void remove_temporary_files() noexcept {
  for (int i = 0; i < kTemporarySlots; ++i) {
    int ready = 2;
    if (!g_temporary_state[i].compare_exchange_strong(ready, 3)) continue;
    ::unlink(g_temporary_path[i]);
    g_temporary_state[i].store(2);
  }
}

}  // namespace relpos

namespace relpos::detail {

namespace {
// The file a path names: a link is followed (to where it points), so that the link stays a link and
// its target gets the new contents, as with a plain write.
std::string link_target(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = path;
  for (int hops = 0; hops < 40 && fs::is_symlink(p, ec); ++hops) {
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) break;
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  return p.string();
}
}  // namespace

void write_atomically(const std::string& requested, const std::function<void(std::ostream&)>& write) {
  const std::string path = link_target(requested);
  // "<name>.tmp.<pid>" beside it; a name too long for that suffix gets a short temporary name
  const std::string suffix = ".tmp." + std::to_string(::getpid());
  const std::filesystem::path p(path);
  const std::string tmp = p.filename().string().size() + suffix.size() <= 255
                              ? path + suffix
                              : (p.parent_path() / (".relpos" + suffix)).string();
  const TemporaryFile registered(tmp);  // (before it exists: a signal while it is made removes it too)
  try {
    // a file replaced keeps its permissions (a private 0600 model became 0644): the temporary is
    // made with them (writable by its owner while it is written) before anything is written to
    // it, and given them exactly (past the umask) once it is complete
    struct stat before {};
    const bool replacing = ::stat(path.c_str(), &before) == 0;
    const mode_t mode = replacing ? (before.st_mode & 07777) : 0666;
    {
      const int made = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, (mode & 0777) | S_IWUSR);
      RELPOS_CHECK(made >= 0, "cannot write '" << path << "': " << std::strerror(errno));
      ::close(made);
    }
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
      if (replacing) (void)::fchmod(fd, mode);
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

void check_regular_file(const std::string& path, const char* what, bool allow_pipe) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_type type = fs::status(path, ec).type();
  if (ec || type == fs::file_type::not_found || type == fs::file_type::directory || type == fs::file_type::regular) return;
  if (allow_pipe && type == fs::file_type::fifo) return;
  const char* kind = type == fs::file_type::fifo        ? "a named pipe (FIFO)"
                     : type == fs::file_type::character ? "a character device"
                     : type == fs::file_type::block     ? "a block device"
                     : type == fs::file_type::socket    ? "a socket"
                                                        : "not a regular file";
  RELPOS_FAIL(path << ": is " << kind << ", not a file; relpos reads " << what << " from regular files");
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  RELPOS_CHECK(!std::filesystem::is_directory(path, ec), path << ": is a directory, expected a file");
  check_regular_file(path, "its inputs");
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
