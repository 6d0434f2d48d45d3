// Device memory for the CUDA build: per-stream caching pools, copies and layout changes.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/caching_allocator.hpp"
#include "core/device_memory.hpp"
#include "core/environment.hpp"
#include "cuda/cuda_common.hpp"
#include "relpos/ops.hpp"

namespace relpos {

namespace detail {
namespace {
void retire_stream(std::uint64_t id);
void empty_idle_blocks(std::uint64_t id);
}  // namespace
}  // namespace detail

namespace cuda {

namespace {
std::atomic<std::uint64_t> next_context_id{1};
thread_local Context* this_thread_context = nullptr;
}  // namespace

Context::Context() : id(next_context_id++) {
  // Handles are made one thread at a time: cuDNN 9 loads its sub-libraries on first use.
  static std::mutex creating;
  std::lock_guard<std::mutex> lock(creating);
  RELPOS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  RELPOS_CUBLAS_CHECK(cublasCreate(&cublas));
  RELPOS_CUBLAS_CHECK(cublasSetStream(cublas, stream));
  RELPOS_CUDNN_CHECK(cudnnCreate(&cudnn));
  RELPOS_CUDNN_CHECK(cudnnSetStream(cudnn, stream));
}

Context::~Context() {
  // Errors are ignored here: at process exit the runtime may already be gone.
  if (stream) cudaStreamSynchronize(stream);
  this_thread_context = nullptr;
  detail::retire_stream(id);  // blocks it still owns go back to the device when freed
  if (cudnn) cudnnDestroy(cudnn);
  if (cublas) cublasDestroy(cublas);
  if (stream) cudaStreamDestroy(stream);
}

Context& context() {
  thread_local Context ctx;
  this_thread_context = &ctx;
  return ctx;
}

Context* current_context() { return this_thread_context; }

namespace {
struct Workspace {
  void* p = nullptr;
  std::size_t bytes = 0;
  ~Workspace() {
    if (p) cudaFree(p);
  }
};
}  // namespace

void* workspace(std::size_t bytes) {
  thread_local Workspace ws;
  if (bytes > ws.bytes) {
    cudaStream_t s = stream();
    RELPOS_CUDA_CHECK(cudaStreamSynchronize(s));  // the old buffer may still be in use
    // Nothing until the new buffer is there: a failed allocation left the larger size recorded
    // over a freed pointer, which the next convolution was then handed.
    void* old = ws.p;
    ws.p = nullptr;
    ws.bytes = 0;
    if (old) RELPOS_CUDA_CHECK(cudaFree(old));
    const std::size_t want = (bytes + (1 << 20) - 1) / (1 << 20) * (1 << 20);
    void* p = nullptr;
    if (cudaMalloc(&p, want) != cudaSuccess) {
      cudaGetLastError();  // handled here, not left for the next kernel's check to report
      detail::empty_idle_blocks(context().id);  // this thread's cached blocks back to the device
      if (cudaMalloc(&p, want) != cudaSuccess) {
        cudaGetLastError();
        RELPOS_FAIL("out of GPU memory allocating a cuDNN workspace of " << want << " bytes");
      }
    }
    ws.p = p;
    ws.bytes = want;
  }
  return ws.p;
}

bool tf32() { return allow_tf32(); }

void require_cuda(const Tensor& t, const char* what) {
  RELPOS_CHECK(t.is_cuda(), what << ": expected a CUDA tensor, got " << t.describe());
}

}  // namespace cuda

namespace detail {

namespace {

// Frees cannot throw: a failed call is reported on stderr (the first 8) and cleared, so that it does
// not surface later as the "last error" of an unrelated kernel launch. Not through the log handler:
// frees run under the pools' lock and at thread exit, where a handler that touches GPU memory
// would deadlock, or one that captured objects since destroyed would crash.
bool quiet(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  static std::atomic<int> reported{0};
  if (reported++ < 8) std::fprintf(stderr, "relpos: %s while freeing GPU memory: %s\n", what, cudaGetErrorString(e));
  cudaGetLastError();
  return false;
}

// One caching pool per thread context (stream). Blocks remember their owner; see cuda_common.hpp
// for the cross-thread rules.
class StreamPools {
 public:
  void* allocate(std::size_t bytes) {
    const cuda::Context& ctx = cuda::context();
    CachingAllocator& a = pool(ctx.id);
    void* p = a.allocate(bytes);
    RELPOS_CHECK(p != nullptr, "out of GPU memory allocating " << bytes << " bytes");
    std::lock_guard<std::mutex> lock(mutex_);
    owner_[p] = Owner{ctx.id, ctx.stream};
    return p;
  }

  void release(void* p, std::size_t bytes) {
    cuda::Context* freeing = cuda::current_context();
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = owner_.find(p);
    if (it == owner_.end()) return;
    const Owner owner = it->second;
    owner_.erase(it);
    auto pit = pools_.find(owner.id);
    if (pit == pools_.end()) {
      // The owning thread has exited (its stream was drained then): only the freeing thread's
      // queued work can still touch the block.
      lock.unlock();
      if (freeing) quiet(cudaStreamSynchronize(freeing->stream), "cudaStreamSynchronize");
      quiet(cudaFree(p), "cudaFree");
      return;
    }
    const std::shared_ptr<CachingAllocator> a = pit->second;
    if (freeing && freeing->id != owner.id) {
      // Work the freeing thread queued may still read the block: the owner's stream, which hands
      // it out next, waits for that work first. The lock keeps the owner from retiring (and
      // destroying its stream) meanwhile.
      cudaEvent_t done;
      if (quiet(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate")) {
        const bool ok = quiet(cudaEventRecord(done, freeing->stream), "cudaEventRecord") &&
                        quiet(cudaStreamWaitEvent(owner.stream, done, 0), "cudaStreamWaitEvent");
        quiet(cudaEventDestroy(done), "cudaEventDestroy");  // its resources go once it has completed
        if (!ok) quiet(cudaStreamSynchronize(freeing->stream), "cudaStreamSynchronize");
      } else {
        quiet(cudaStreamSynchronize(freeing->stream), "cudaStreamSynchronize");
      }
    }
    lock.unlock();
    a->release(p, bytes);
  }

  // The pool's idle blocks back to the device (its thread's stream synchronised first).
  void empty_idle(std::uint64_t id) {
    std::shared_ptr<CachingAllocator> a;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = pools_.find(id);
      if (it == pools_.end()) return;
      a = it->second;
    }
    a->empty_cache();
  }

  // The thread owning this pool exits (its stream already synchronised): idle blocks go back to
  // the device; blocks still in use are freed directly when released.
  void retire(std::uint64_t id) {
    std::shared_ptr<CachingAllocator> a;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = pools_.find(id);
      if (it == pools_.end()) return;
      a = std::move(it->second);
      pools_.erase(it);
    }
    a->empty_cache();  // a release racing with this one may still add a block: freed with `a`
  }

 private:
  struct Owner {
    std::uint64_t id = 0;
    cudaStream_t stream = nullptr;
  };
  CachingAllocator& pool(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& a = pools_[id];
    if (!a) {
      const std::size_t cap = detail::setting_mib("RELPOS_CUDA_CACHE_MB", 32768);
      a = std::make_shared<CachingAllocator>(
          [](std::size_t n) -> void* {
            void* q = nullptr;
            if (cudaMalloc(&q, n) == cudaSuccess) return q;
            cudaGetLastError();  // out of memory is handled by the caller, not left for a later check
            return nullptr;
          },
          [](void* q) { quiet(cudaFree(q), "cudaFree"); }, 0, cap);
    }
    return *a;
  }
  std::mutex mutex_;
  std::map<std::uint64_t, std::shared_ptr<CachingAllocator>> pools_;
  std::unordered_map<void*, Owner> owner_;
};

StreamPools& pools() {
  static StreamPools* p = new StreamPools();  // never destroyed: outlives thread-local streams
  return *p;
}

void retire_stream(std::uint64_t id) { pools().retire(id); }
void empty_idle_blocks(std::uint64_t id) { pools().empty_idle(id); }

__global__ void fill_kernel(float* p, std::size_t n, float v) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}

// 32x32 tiles through shared memory: coalesced reads and writes for both layouts. The grid's y
// (row tiles) and z (images) are capped at 65535: a block steps over the rest (a channels-last map
// of more than 2,097,120 pixels, or more than 65535 images, failed to launch).
template <bool kToNhwc>
__global__ void permute_kernel(const float* src, float* dst, std::int64_t n, std::int64_t c, std::int64_t hw) {
  __shared__ float tile[32][33];
  const std::int64_t rows = kToNhwc ? c : hw, cols = kToNhwc ? hw : c;  // source is rows x cols
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * 32;
  for (std::int64_t b = blockIdx.z; b < n; b += gridDim.z) {
    const float* s = src + b * c * hw;
    float* d = dst + b * c * hw;
    for (std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * 32; r0 < rows;
         r0 += static_cast<std::int64_t>(gridDim.y) * 32) {  // (the same trip count for the whole block)
      for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const std::int64_t r = r0 + k, cc = c0 + threadIdx.x;
        if (r < rows && cc < cols) tile[k][threadIdx.x] = s[r * cols + cc];
      }
      __syncthreads();
      for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const std::int64_t cc = c0 + k, r = r0 + threadIdx.x;
        if (r < rows && cc < cols) d[cc * rows + r] = tile[threadIdx.x][k];
      }
      __syncthreads();  // the tile is filled again next
    }
  }
}

template <bool kToNhwc>
void permute(const float* src, float* dst, std::int64_t n, std::int64_t c, std::int64_t hw) {
  if (n * c * hw == 0) return;
  const std::int64_t rows = kToNhwc ? c : hw, cols = kToNhwc ? hw : c;
  dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(std::min<std::int64_t>((rows + 31) / 32, 65535)),
            static_cast<unsigned>(std::min<std::int64_t>(n, 65535)));
  permute_kernel<kToNhwc><<<grid, dim3(32, 8), 0, cuda::stream()>>>(src, dst, n, c, hw);
  RELPOS_CUDA_LAUNCHED();
}

}  // namespace

void* cuda_alloc(std::size_t bytes) { return pools().allocate(bytes); }
void cuda_free(void* p, std::size_t bytes) { pools().release(p, bytes); }

void copy_bytes(void* dst, Device dd, const void* src, Device sd, std::size_t bytes) {
  if (dd == Device::CPU && sd == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const cudaMemcpyKind kind = dd == Device::CPU ? cudaMemcpyDeviceToHost
                              : sd == Device::CPU ? cudaMemcpyHostToDevice
                                                  : cudaMemcpyDeviceToDevice;
  cudaStream_t s = cuda::stream();
  RELPOS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
  if (kind != cudaMemcpyDeviceToDevice) RELPOS_CUDA_CHECK(cudaStreamSynchronize(s));
}

void cuda_fill(float* p, std::size_t n, float value) {
  if (n == 0) return;
  fill_kernel<<<std::min<unsigned>(cuda::blocks_for(static_cast<std::int64_t>(n)), 4096), 256, 0, cuda::stream()>>>(p, n, value);
  RELPOS_CUDA_LAUNCHED();
}

void cuda_nchw_to_nhwc(const float* src, float* dst, std::int64_t n, std::int64_t c, std::int64_t hw) {
  permute<true>(src, dst, n, c, hw);
}
void cuda_nhwc_to_nchw(const float* src, float* dst, std::int64_t n, std::int64_t c, std::int64_t hw) {
  permute<false>(src, dst, n, c, hw);
}

void cuda_synchronize() {
  if (cuda::Context* c = cuda::current_context()) RELPOS_CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

bool cuda_runtime_available() {
  static const bool available = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return available;
}

}  // namespace detail
}  // namespace relpos
