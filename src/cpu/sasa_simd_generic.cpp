// The planar SASA kernels built for any x86-64 (or other) CPU: sasa_simd_kernels.inc.
#include <cstdint>

#include "cpu/sasa_planes.hpp"

namespace relpos::cpu::sasa::generic {
#define kKernelsName "generic"
#include "cpu/sasa_simd_kernels.inc"
#undef kKernelsName
}  // namespace relpos::cpu::sasa::generic
