// The BoTNet row kernels (bot_softmax_kernels.inc) built with AVX2 and FMA, 8 lanes (CMakeLists.txt
// sets the flags for this file only); kernels() calls them only on a CPU that has both.
#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "cpu/bot_softmax_kernels.hpp"

namespace relpos::cpu::bot::avx2 {
#if defined(__AVX2__) && defined(__FMA__)
#define kKernelsName "avx2"
constexpr int kL = 8;
#include "cpu/bot_softmax_kernels.inc"
#undef kKernelsName
#else
// Not an x86-64 build: the generic kernels stand in (kernels() never picks these there).
const Kernels kKernels = generic::kKernels;
#endif
}  // namespace relpos::cpu::bot::avx2
