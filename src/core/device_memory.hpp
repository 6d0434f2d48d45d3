// Internal: raw memory on each device. The CUDA build implements the CUDA half in
// src/cuda/device_memory.cu; the CPU-only build in src/core/device_memory_nocuda.cpp.
#pragma once

#include <cstddef>

#include "relpos/tensor.hpp"

namespace relpos::detail {

void* cuda_alloc(std::size_t bytes);  // from the caching allocator
void cuda_free(void* p, std::size_t bytes);
// Copies between any two devices (host-host included).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);
void cuda_fill(float* p, std::size_t n, float value);
// NCHW <-> NHWC on the GPU (n images of c x hw).
void cuda_nchw_to_nhwc(const float* src, float* dst, std::int64_t n, std::int64_t c, std::int64_t hw);
void cuda_nhwc_to_nchw(const float* src, float* dst, std::int64_t n, std::int64_t c, std::int64_t hw);
bool cuda_runtime_available();
void cuda_synchronize();  // the calling thread's stream, if it has one

}  // namespace relpos::detail
