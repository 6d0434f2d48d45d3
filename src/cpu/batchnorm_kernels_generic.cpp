// The batch-norm training kernels (batchnorm_kernels.inc) built for any CPU: the production set
// where AVX2 is missing (and with RELPOS_SIMD=generic, as the tests run them); channel chunks of 16.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu/batchnorm_kernels.hpp"

namespace relpos::cpu::bn::generic {
#define kKernelsName "generic"
constexpr int kW = 16;
#include "cpu/batchnorm_kernels.inc"
#undef kKernelsName
}  // namespace relpos::cpu::bn::generic
