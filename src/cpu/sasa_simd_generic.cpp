// The planar SASA kernels built for any CPU: sasa_simd_kernels.inc. On x86-64 these run only on
// CPUs without AVX2 (or with RELPOS_SIMD=generic, as the tests do) and are built with 16 lanes, so
// the 16-lane code of the AVX-512 build is tested on every x86-64 machine, CI's AVX2 ones included.
// Elsewhere (AArch64, ...) they are the production kernels and keep 8 lanes: two 128-bit registers
// per vector, which leaves room for a chunk of 8 channels in registers.
#include <cstdint>

#include "cpu/sasa_planes.hpp"

namespace relpos::cpu::sasa::generic {
#define kKernelsName "generic"
#if defined(__x86_64__)
constexpr int kL = 16;
#else
constexpr int kL = 8;
#endif
#include "cpu/sasa_simd_kernels.inc"
#undef kKernelsName
}  // namespace relpos::cpu::sasa::generic
