// The CPU-only build: no CUDA memory exists, so only host-to-host copies can happen.
#include <cstring>

#include "core/device_memory.hpp"
#include "relpos/error.hpp"

namespace relpos::detail {

namespace {
[[noreturn]] void no_cuda() {
  RELPOS_FAIL("this relpos was built without CUDA (nvcc was not found at configure time); "
              "use --device cpu or rebuild on a machine with the CUDA toolkit");
}
}  // namespace

void* cuda_alloc(std::size_t) { no_cuda(); }
void cuda_free(void*, std::size_t) {}
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (dst_device != Device::CPU || src_device != Device::CPU) no_cuda();
  std::memcpy(dst, src, bytes);
}
void cuda_fill(float*, std::size_t, float) { no_cuda(); }
void cuda_nchw_to_nhwc(const float*, float*, std::int64_t, std::int64_t, std::int64_t) { no_cuda(); }
void cuda_nhwc_to_nchw(const float*, float*, std::int64_t, std::int64_t, std::int64_t) { no_cuda(); }
bool cuda_runtime_available() { return false; }
void cuda_synchronize() {}

}  // namespace relpos::detail
