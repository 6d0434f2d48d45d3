// The BoTNet row kernels (bot_softmax_kernels.inc) built for any CPU: 16 lanes on x86-64, where
// they run only with RELPOS_SIMD=generic or without AVX2, 8 elsewhere.
#include <cstdint>

#include "cpu/bot_softmax_kernels.hpp"

namespace relpos::cpu::bot::generic {
#define kKernelsName "generic"
#if defined(__x86_64__)
constexpr int kL = 16;
#else
constexpr int kL = 8;
#endif
#include "cpu/bot_softmax_kernels.inc"
#undef kKernelsName
}  // namespace relpos::cpu::bot::generic
