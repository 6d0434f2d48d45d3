// The BoTNet row kernels (bot_softmax_kernels.inc) built with AVX-512 and FMA, 16 lanes
// (CMakeLists.txt sets the flags for this file only); kernels() calls them only on a CPU that has
// them.
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "cpu/bot_softmax_kernels.hpp"

namespace relpos::cpu::bot::avx512 {
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__FMA__)
#define kKernelsName "avx512"
constexpr int kL = 16;
#include "cpu/bot_softmax_kernels.inc"
#undef kKernelsName
#else
// Not an x86-64 build: the generic kernels stand in (kernels() never picks these there).
const Kernels kKernels = generic::kKernels;
#endif
}  // namespace relpos::cpu::bot::avx512
