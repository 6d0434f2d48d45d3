// The planar SASA kernels built for any x86-64 (or other) CPU, 16 lanes: sasa_simd_kernels.inc. (With
// RELPOS_SIMD=generic the tests run these on every machine, so the 16-lane code is tested even where
// no AVX-512 runs it.)
#include <cstdint>

#include "cpu/sasa_planes.hpp"

namespace relpos::cpu::sasa::generic {
#define kKernelsName "generic"
constexpr int kL = 16;
#include "cpu/sasa_simd_kernels.inc"
#undef kKernelsName
}  // namespace relpos::cpu::sasa::generic
