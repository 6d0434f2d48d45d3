// Shared by the libFuzzer harnesses: a temporary file holding the input (for loaders that take a
// path), and the rule that a relpos::Error is the expected way to reject bad input.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace relpos::fuzz {

// A file under /dev/shm (or /tmp) with the given bytes, removed when it goes out of scope.
class TempFile {
 public:
  TempFile(const std::uint8_t* data, std::size_t size, const char* suffix) {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    path_ = std::string(dir) + "/relpos-fuzz-" + std::to_string(getpid()) + suffix;
    if (FILE* f = std::fopen(path_.c_str(), "wb")) {
      if (size) std::fwrite(data, 1, size, f);
      std::fclose(f);
    }
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace relpos::fuzz
