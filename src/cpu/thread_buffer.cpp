#include "cpu/thread_buffer.hpp"

#include "core/huge_page_arena.hpp"

#include <cstdlib>
#include <memory>
#include <new>

namespace relpos::cpu {

float* thread_buffer(ThreadBuffer slot, std::int64_t floats) {
  struct Buffer {
    std::shared_ptr<float> data;
    std::int64_t size = 0;
  };
  thread_local Buffer buffers[static_cast<int>(ThreadBuffer::Count)];
  Buffer& b = buffers[static_cast<int>(slot)];
  if (b.size < floats) {
    const std::size_t bytes = (static_cast<std::size_t>(floats) * sizeof(float) + 63) / 64 * 64;
    b.data.reset();  // (its room in the slab returns when the slab's other buffers go)
    b.size = 0;      // (until the new one is there: an allocation that throws leaves none)
    b.data = detail::arena_array<float>(bytes / sizeof(float));
    b.size = floats;
  }
  return b.data.get();
}

}  // namespace relpos::cpu
