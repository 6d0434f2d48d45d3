#include "core/huge_page_arena.hpp"
#include "core/environment.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace relpos::detail {

namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;
// A slab holds 4 huge pages; a buffer of more than half that gets a slab of its own.
constexpr std::size_t kSlab = 4 * kHugePage;
constexpr std::size_t kAlign = 64;

struct Slab {
  char* base = nullptr;
  std::size_t size = 0, used = 0;
  explicit Slab(std::size_t bytes) : size((bytes + kHugePage - 1) / kHugePage * kHugePage) {
    base = static_cast<char*>(std::aligned_alloc(kHugePage, size));
    if (!base) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(base, size, MADV_HUGEPAGE);  // advice only: with 4 KiB pages the memory works as well
#endif
  }
  ~Slab() { std::free(base); }
  Slab(const Slab&) = delete;
  Slab& operator=(const Slab&) = delete;
};

}  // namespace

bool huge_pages_wanted() {
  static const bool on = [] {
    const char* env = setting("RELPOS_HUGE_PAGES");
    return !(env && std::strcmp(env, "0") == 0);
  }();
  return on;
}

std::shared_ptr<void> arena_alloc(std::size_t bytes) {
  const std::size_t n = (std::max<std::size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  if (!huge_pages_wanted()) {
    void* q = std::aligned_alloc(kAlign, n);
    if (!q) throw std::bad_alloc();
    return std::shared_ptr<void>(q, [](void* x) { std::free(x); });
  }
  if (n > kSlab / 2) {
    auto own = std::make_shared<Slab>(n);
    return std::shared_ptr<void>(own, own->base);
  }
  // the slab being carved (it lives on in what it handed out); never destroyed, so that buffers
  // made while other statics are destroyed at exit still work
  struct Carving {
    std::mutex mutex;
    std::shared_ptr<Slab> slab;
  };
  static Carving* const carving = new Carving;
  std::lock_guard<std::mutex> lock(carving->mutex);
  std::shared_ptr<Slab>& slab = carving->slab;
  if (!slab || slab->size - slab->used < n) slab = std::make_shared<Slab>(kSlab);
  void* p = slab->base + slab->used;
  slab->used += n;
  return std::shared_ptr<void>(slab, p);
}

}  // namespace relpos::detail
