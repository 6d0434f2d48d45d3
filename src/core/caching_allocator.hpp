// Internal: a caching allocator. Freed blocks are kept in size classes (four per power of two,
// so at most 25% slack) and handed out again, so a network that allocates the same activation
// sizes on every forward pass stops paying for mmap/munmap and page faults on the CPU, and for
// cudaMalloc/cudaFree on the GPU. Thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

namespace relpos::detail {

class CachingAllocator {
 public:
  using RawAlloc = std::function<void*(std::size_t)>;
  using RawFree = std::function<void(void*)>;
  // Blocks below min_cached bytes bypass the cache; at most max_cached bytes are kept idle.
  CachingAllocator(RawAlloc alloc, RawFree free, std::size_t min_cached, std::size_t max_cached);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(std::size_t bytes);
  void release(void* p, std::size_t bytes);  // bytes as given to allocate()
  void empty_cache();
  std::size_t cached_bytes() const;
  static std::size_t size_class(std::size_t bytes);

 private:
  void trim_locked(std::size_t target);
  RawAlloc raw_alloc_;
  RawFree raw_free_;
  std::size_t min_cached_, max_cached_;
  mutable std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;  // size class -> idle blocks
  std::size_t idle_ = 0;
};

// The process-wide host allocator used by CPU tensors.
CachingAllocator& host_allocator();

}  // namespace relpos::detail
