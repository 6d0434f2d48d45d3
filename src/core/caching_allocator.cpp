#include "core/caching_allocator.hpp"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/environment.hpp"
#include "core/huge_page_arena.hpp"
#include "relpos/error.hpp"

namespace relpos::detail {

CachingAllocator::CachingAllocator(RawAlloc alloc, RawFree free, std::size_t min_cached, std::size_t max_cached)
    : raw_alloc_(std::move(alloc)), raw_free_(std::move(free)), min_cached_(min_cached), max_cached_(max_cached) {}

CachingAllocator::~CachingAllocator() { empty_cache(); }

std::size_t CachingAllocator::size_class(std::size_t bytes) {
  if (bytes <= 4096) return (bytes + 63) / 64 * 64;
  std::size_t p = 4096;
  while (p * 2 < bytes) p *= 2;
  const std::size_t step = p / 4;  // p < bytes <= 2p: classes p + step, ..., 2p
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(std::size_t bytes) {
  const std::size_t cls = size_class(bytes);
  if (cls >= min_cached_) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      idle_ -= cls;
      return p;
    }
  }
  void* p = raw_alloc_(cls);
  if (!p && cls >= min_cached_) {  // out of memory: give the cache back and try once more
    empty_cache();
    p = raw_alloc_(cls);
  }
  return p;
}

void CachingAllocator::release(void* p, std::size_t bytes) {
  if (!p) return;
  const std::size_t cls = size_class(bytes);
  if (cls < min_cached_ || cls > max_cached_) {
    raw_free_(p);
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  free_[cls].push_back(p);
  idle_ += cls;
  if (idle_ > max_cached_) trim_locked(max_cached_ / 2);
}

void CachingAllocator::trim_locked(std::size_t target) {
  // Largest blocks first: they are the costly ones to hold.
  for (auto it = free_.rbegin(); it != free_.rend() && idle_ > target; ++it)
    while (!it->second.empty() && idle_ > target) {
      raw_free_(it->second.back());
      it->second.pop_back();
      idle_ -= it->first;
    }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  trim_locked(0);
  free_.clear();
}

std::size_t CachingAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_;
}

namespace {

// Host memory for tensors. Blocks of 2 MiB and more are aligned to 2 MiB and asked to be backed by
// transparent huge pages (where the kernel has them in "madvise" mode, as Debian's default):
// activations are streamed through once per op, and 4 KiB pages cost a TLB miss every 64 cache lines
// (a training step about 5% faster, tools/bench/README.md). The price is paid once, when a block is
// first touched: the kernel zeroes (and may compact memory for) whole 2 MiB pages, which makes the
// first training step about twice as long; the cache then hands the blocks out again. Blocks the
// cache keeps (kMinCached and more) but under 2 MiB are carved from huge-page slabs
// (huge_page_arena.hpp); the cache hands them out again, so the slabs are carved once.
constexpr std::size_t kHuge = std::size_t{2} << 20, kMinCached = std::size_t{256} << 10;

struct HostBlocks {
  std::mutex mutex;
  std::unordered_map<void*, std::shared_ptr<void>> carved;  // blocks from the arena
};
HostBlocks& host_blocks() {
  static HostBlocks* b = new HostBlocks;  // (never destroyed: the cache may release blocks at exit)
  return *b;
}

void* host_alloc(std::size_t n) {
  if (n < kMinCached || !huge_pages_wanted()) return std::aligned_alloc(64, (n + 63) / 64 * 64);
  if (n < kHuge) {
    std::shared_ptr<void> p;
    try {
      p = arena_alloc(n);
    } catch (const std::bad_alloc&) {
      return nullptr;  // (the cache then gives its idle blocks back and tries once more)
    }
    HostBlocks& b = host_blocks();
    std::lock_guard<std::mutex> lock(b.mutex);
    b.carved.emplace(p.get(), p);
    return p.get();
  }
  const std::size_t bytes = (n + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, bytes);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (p) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without huge pages the memory works as well
#endif
  return p;
}

void host_free(void* p) {
  HostBlocks& b = host_blocks();
  {
    std::lock_guard<std::mutex> lock(b.mutex);
    auto it = b.carved.find(p);
    if (it != b.carved.end()) {
      b.carved.erase(it);
      return;
    }
  }
  std::free(p);
}

}  // namespace

CachingAllocator& host_allocator() {
  // Blocks of 256 KiB and more are cached (smaller ones come from malloc's own arenas quickly);
  // up to RELPOS_HOST_CACHE_MB (default 4096) MiB stay idle.
  static CachingAllocator a(host_alloc, host_free, kMinCached, setting_mib("RELPOS_HOST_CACHE_MB", 4096));
  return a;
}

}  // namespace relpos::detail
