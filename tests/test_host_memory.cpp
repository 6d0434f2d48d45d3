// Host memory: the huge-page arena that packed weights and per-thread buffers are carved from
// (core/huge_page_arena.hpp), and the caching host allocator that tensors come from
// (core/caching_allocator.hpp), whose blocks under 2 MiB come from that arena.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "core/caching_allocator.hpp"
#include "core/huge_page_arena.hpp"
#include "cpu/thread_buffer.hpp"
#include "relpos/tensor.hpp"
#include "test_util.hpp"

using namespace relpos;

namespace {

bool aligned64(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

// Fills each buffer with its own byte, then checks that none was overwritten by another's fill.
void check_disjoint(const std::vector<std::shared_ptr<void>>& bufs, const std::vector<std::size_t>& sizes) {
  for (std::size_t i = 0; i < bufs.size(); ++i) std::memset(bufs[i].get(), static_cast<int>(i % 251), sizes[i]);
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    const auto* b = static_cast<const unsigned char*>(bufs[i].get());
    bool same = true;
    for (std::size_t j = 0; j < sizes[i]; ++j) same = same && b[j] == i % 251;
    CHECK_MESSAGE(same, "buffer " << i << " (" << sizes[i] << " bytes) was overwritten");
  }
}

}  // namespace

TEST_CASE("RELPOS_HUGE_PAGES=0 turns huge pages off; unset, empty or 1 leaves them on") {
  // (ctest runs this file with and without it: test_host_memory_no_huge_pages)
  const char* env = std::getenv("RELPOS_HUGE_PAGES");
  CHECK(detail::huge_pages_wanted() == !(env && std::strcmp(env, "0") == 0));
}

TEST_CASE("arena: buffers of any size are 64-byte aligned, disjoint and usable") {
  // sizes around the slab's limits: tiny, odd, just under and over half a slab (4 MiB), a large one
  const std::vector<std::size_t> sizes = {0,       1,       63,      64,      65,      1000,   4096,   100000,
                                          1 << 20, 3 << 20, 4 << 20, (4 << 20) + 1, 9 << 20, 7,     300000};
  std::vector<std::shared_ptr<void>> bufs;
  std::vector<std::size_t> used;
  for (std::size_t n : sizes) {
    bufs.push_back(detail::arena_alloc(n));
    REQUIRE(bufs.back() != nullptr);
    CHECK_MESSAGE(aligned64(bufs.back().get()), n << " bytes");
    used.push_back(std::max<std::size_t>(n, 1));
  }
  check_disjoint(bufs, used);
  // a buffer outlives the others carved from its slab
  std::shared_ptr<void> keep = bufs[5];
  bufs.clear();
  std::memset(keep.get(), 0x5a, 1000);
  CHECK(static_cast<unsigned char*>(keep.get())[999] == 0x5a);
  // typed arrays
  std::shared_ptr<float> f = detail::arena_array<float>(1000);
  CHECK(aligned64(f.get()));
  f.get()[999] = 1.5f;
  CHECK(f.get()[999] == 1.5f);
}

TEST_CASE("arena: threads carving at once get disjoint buffers") {
  constexpr int kThreads = 4, kEach = 300;
  std::vector<std::vector<std::shared_ptr<void>>> bufs(kThreads);
  std::vector<std::vector<std::size_t>> sizes(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const std::size_t n = 64 + static_cast<std::size_t>((i * 7919 + t * 104729) % 50000);
        bufs[t].push_back(detail::arena_alloc(n));
        sizes[t].push_back(n);
      }
    });
  for (auto& th : pool) th.join();
  std::vector<std::shared_ptr<void>> all;
  std::vector<std::size_t> all_sizes;
  for (int t = 0; t < kThreads; ++t) {
    all.insert(all.end(), bufs[t].begin(), bufs[t].end());
    all_sizes.insert(all_sizes.end(), sizes[t].begin(), sizes[t].end());
  }
  check_disjoint(all, all_sizes);
}

TEST_CASE("host allocator: blocks below, inside and above the arena's range work and are cached") {
  detail::CachingAllocator& a = detail::host_allocator();
  // below the cached range (malloc), carved from the arena (256 KiB to 2 MiB), own huge pages
  for (std::size_t n : {std::size_t{1000}, std::size_t{300} << 10, std::size_t{1536} << 10, std::size_t{3} << 20}) {
    void* p = a.allocate(n);
    REQUIRE(p != nullptr);
    CHECK(aligned64(p));
    std::memset(p, 0x33, n);
    a.release(p, n);
    if (n >= (std::size_t{256} << 10)) {
      void* q = a.allocate(n);  // the same size class comes back from the cache
      CHECK(q == p);
      a.release(q, n);
    }
  }
  // the cache hands its blocks back (carved ones to the arena) and allocates again
  a.empty_cache();
  CHECK(a.cached_bytes() == 0);
  void* p = a.allocate(std::size_t{700} << 10);
  REQUIRE(p != nullptr);
  std::memset(p, 0x44, std::size_t{700} << 10);
  a.release(p, std::size_t{700} << 10);
  // tensors in that range hold their values
  Tensor t = Tensor::full({300, 1000}, 2.5f);  // 1.2 MB: carved
  CHECK(t.data()[299999] == 2.5f);
}

// (AddressSanitizer reports an allocation this size as an error unless told to return null)
#if defined(__SANITIZE_ADDRESS__)
#define HOST_MEMORY_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HOST_MEMORY_TEST_ASAN 1
#endif
#endif
#if !defined(HOST_MEMORY_TEST_ASAN)
TEST_CASE("thread buffers: a request no memory holds throws bad_alloc and leaves the slot usable") {
  float* p = cpu::thread_buffer(cpu::ThreadBuffer::Conv1x1Block, 1000);
  REQUIRE(p != nullptr);
  CHECK_THROWS_AS(cpu::thread_buffer(cpu::ThreadBuffer::Conv1x1Block, std::int64_t{1} << 60), std::bad_alloc);
  float* q = cpu::thread_buffer(cpu::ThreadBuffer::Conv1x1Block, 500);  // smaller than the first
  REQUIRE(q != nullptr);
  q[499] = 3.0f;
  CHECK(q[499] == 3.0f);
}
#endif
