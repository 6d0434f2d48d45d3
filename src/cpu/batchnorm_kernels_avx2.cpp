// The batch-norm training kernels (batchnorm_kernels.inc) built with AVX2 and FMA (CMakeLists.txt
// sets the flags for this file only); channel chunks of 32, four 8-lane vectors.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "cpu/batchnorm_kernels.hpp"

namespace relpos::cpu::bn::avx2 {
#if defined(__AVX2__) && defined(__FMA__)
#define kKernelsName "avx2"
constexpr int kW = 32;
#include "cpu/batchnorm_kernels.inc"
#undef kKernelsName
#else
// Not an x86-64 build: the generic kernels stand in (kernels() never picks these there).
const Kernels kKernels = generic::kKernels;
#endif
}  // namespace relpos::cpu::bn::avx2
