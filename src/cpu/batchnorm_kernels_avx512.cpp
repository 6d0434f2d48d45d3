// The batch-norm training kernels (batchnorm_kernels.inc) built with AVX-512 (CMakeLists.txt sets
// the flags for this file only); channel chunks of 64, four 16-lane vectors.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "cpu/batchnorm_kernels.hpp"

namespace relpos::cpu::bn::avx512 {
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__FMA__)
#define kKernelsName "avx512"
constexpr int kW = 64;
#include "cpu/batchnorm_kernels.inc"
#undef kKernelsName
#else
// Not an x86-64 build: the generic kernels stand in (kernels() never picks these there).
const Kernels kKernels = generic::kKernels;
#endif
}  // namespace relpos::cpu::bn::avx512
