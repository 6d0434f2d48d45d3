// The planar SASA kernels built with AVX-512 (F, VL, DQ, BW) and FMA, 16 lanes (CMakeLists.txt sets
// the flags for this file only); kernels() calls them only on a CPU that has them.
#include <immintrin.h>

#include <cstdint>

#include "cpu/sasa_planes.hpp"

namespace relpos::cpu::sasa::avx512 {
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__FMA__)
#define kKernelsName "avx512"
constexpr int kL = 16;
#include "cpu/sasa_simd_kernels.inc"
#undef kKernelsName
#else
// Not an x86-64 build: the generic kernels stand in (kernels() never picks these there).
const Kernels kKernels = generic::kKernels;
#endif
}  // namespace relpos::cpu::sasa::avx512
