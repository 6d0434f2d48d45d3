#include "cpu/cpu_features.hpp"

#include <cstdlib>
#include <cstring>

namespace relpos::cpu {

bool avx2_kernels() {
  static const bool on = [] {
    const char* force = std::getenv("RELPOS_SIMD");
    if (force && std::strcmp(force, "generic") == 0) return false;
#if defined(__x86_64__)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
  }();
  return on;
}

}  // namespace relpos::cpu
