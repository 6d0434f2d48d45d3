// Internal: CUDA backend plumbing. Each host thread that runs relpos ops gets its own stream,
// cuBLAS handle and cuDNN handle (cuBLAS and cuDNN handles must not be shared between threads),
// so that concurrent calls on one loaded model are safe. Device memory comes from a caching
// allocator with one pool per stream: a block is handed out again only on the stream that owns it,
// so stream order keeps reuse safe. A block freed by another thread first makes the owner's stream
// wait (an event) for the freeing thread's stream; a block whose owning thread has exited is
// returned to the device after the freeing thread's stream drains. Data one thread's stream
// writes and other threads then read (a cached convolution plan) is published only after that
// stream is synchronised.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>

#include "relpos/error.hpp"
#include "relpos/tensor.hpp"

#define RELPOS_CUDA_CHECK(expr)                                                                        \
  do {                                                                                                 \
    const cudaError_t relpos_e_ = (expr);                                                              \
    RELPOS_CHECK(relpos_e_ == cudaSuccess, "CUDA error: " << cudaGetErrorString(relpos_e_) << " (" #expr ")"); \
  } while (0)
#define RELPOS_CUBLAS_CHECK(expr)                                                             \
  do {                                                                                        \
    const cublasStatus_t relpos_s_ = (expr);                                                  \
    RELPOS_CHECK(relpos_s_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error " << static_cast<int>(relpos_s_) << " (" #expr ")"); \
  } while (0)
#define RELPOS_CUDNN_CHECK(expr)                                                                       \
  do {                                                                                                 \
    const cudnnStatus_t relpos_s_ = (expr);                                                            \
    RELPOS_CHECK(relpos_s_ == CUDNN_STATUS_SUCCESS, "cuDNN error: " << cudnnGetErrorString(relpos_s_) << " (" #expr ")"); \
  } while (0)
// After a kernel launch: launch errors (bad configuration) surface here, with the place.
#define RELPOS_CUDA_LAUNCHED()                                                                          \
  do {                                                                                                  \
    const cudaError_t relpos_e_ = cudaGetLastError();                                                   \
    RELPOS_CHECK(relpos_e_ == cudaSuccess,                                                              \
                 "CUDA error: " << cudaGetErrorString(relpos_e_) << " (kernel launch at " << __FILE__ << ":" \
                                << __LINE__ << ")");                                                   \
  } while (0)

namespace relpos::cuda {

struct Context {
  std::uint64_t id = 0;  // unique for the process's lifetime (stream handles can be reused)
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;
  Context();
  ~Context();
};
// The calling thread's context (created on first use).
Context& context();
// The calling thread's context if it has made one, else nullptr (it then has no work queued).
Context* current_context();
inline cudaStream_t stream() { return context().stream; }

// A scratch buffer on the calling thread's stream (grows, never shrinks).
void* workspace(std::size_t bytes);

// Whether cuDNN and cuBLAS may use TF32 tensor cores for float32 work (off by default, so that
// results match the CPU to float32 rounding; the benchmarks turn it on and say so).
bool tf32();

inline unsigned blocks_for(std::int64_t n, int threads = 256) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

void require_cuda(const Tensor& t, const char* what);

// Row-major C = alpha op(A) op(B) + beta C on the calling thread's stream (cuBLAS).
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

}  // namespace relpos::cuda
