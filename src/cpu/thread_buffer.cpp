#include "cpu/thread_buffer.hpp"

#include <cstdlib>
#include <memory>
#include <new>

namespace relpos::cpu {

float* thread_buffer(ThreadBuffer slot, std::int64_t floats) {
  struct Free {
    void operator()(float* f) const { std::free(f); }
  };
  struct Buffer {
    std::unique_ptr<float, Free> data;
    std::int64_t size = 0;
  };
  thread_local Buffer buffers[static_cast<int>(ThreadBuffer::Count)];
  Buffer& b = buffers[static_cast<int>(slot)];
  if (b.size < floats) {
    const std::size_t bytes = (static_cast<std::size_t>(floats) * sizeof(float) + 63) / 64 * 64;
    b.data.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!b.data) throw std::bad_alloc();
    b.size = floats;
  }
  return b.data.get();
}

}  // namespace relpos::cpu
