// Internal: host memory for long-lived buffers that are read whole again and again: weights packed
// for a kernel (as long as the model), the kernels' per-thread buffers and the blocks the caching
// host allocator keeps. They are carved, 64-byte aligned, from slabs of 2 MiB pages (transparent
// huge pages, asked for by madvise where the kernel offers them in "madvise" mode, as Debian's
// default), so that streaming a network's weights costs a TLB entry per 2 MiB instead of one per 4
// KiB (tools/bench/README.md has the measurements). A slab is freed once every buffer carved from
// it is (a model's buffers are made together and freed together); the room of a buffer freed
// earlier is not reused, so short-lived buffers do not belong here.
// RELPOS_HUGE_PAGES=0 in the environment turns huge pages off (here and for the host allocator's
// large blocks): plain 64-byte aligned allocations, for measurements or a machine short of memory.
#pragma once

#include <cstddef>
#include <memory>

namespace relpos::detail {

// `bytes` bytes (at least 1), 64-byte aligned, uninitialised; kept while the pointer or a copy of it
// lives. Thread-safe. Throws std::bad_alloc when out of memory.
std::shared_ptr<void> arena_alloc(std::size_t bytes);

// Whether relpos asks for huge pages (RELPOS_HUGE_PAGES is not "0"). Read once.
bool huge_pages_wanted();

template <typename T>
std::shared_ptr<T> arena_array(std::size_t n) {
  return std::static_pointer_cast<T>(arena_alloc(n * sizeof(T)));
}

}  // namespace relpos::detail
