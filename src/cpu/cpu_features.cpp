#include "cpu/cpu_features.hpp"

#include <cstdlib>
#include <cstring>

#include "core/environment.hpp"

namespace relpos::cpu {

namespace {

// The highest level RELPOS_SIMD allows: 0 generic, 1 AVX2, 2 AVX-512 (avx512 or unset; other values
// are refused by check_environment).
int simd_cap() {
  const char* force = detail::setting("RELPOS_SIMD");
  if (force && std::strcmp(force, "generic") == 0) return 0;
  if (force && std::strcmp(force, "avx2") == 0) return 1;
  return 2;
}

}  // namespace

bool avx2_kernels() {
  static const bool on = [] {
#if defined(__x86_64__)
    return simd_cap() >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
  }();
  return on;
}

bool avx512_kernels() {
  static const bool on = [] {
#if defined(__x86_64__)
    return avx2_kernels() && simd_cap() >= 2 && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw");
#else
    return false;
#endif
  }();
  return on;
}

}  // namespace relpos::cpu
