// The planar SASA kernels built with AVX2 and FMA, 8 lanes (CMakeLists.txt sets -mavx2 -mfma for
// this file only); kernels() calls them only on a CPU that has both.
#include <cstdint>

#include "cpu/sasa_planes.hpp"

namespace relpos::cpu::sasa::avx2 {
#if defined(__AVX2__) && defined(__FMA__)
#define kKernelsName "avx2"
constexpr int kL = 8;
#include "cpu/sasa_simd_kernels.inc"
#undef kKernelsName
#else
// Not an x86-64 build: the generic kernels stand in (kernels() never picks these there).
const Kernels kKernels = generic::kKernels;
#endif
}  // namespace relpos::cpu::sasa::avx2
