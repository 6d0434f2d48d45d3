// The 1x1 convolution's gradient products (conv1x1_grad_kernels.inc) built with AVX-512
// (CMakeLists.txt sets the flags for this file only): 16-lane vectors in 32 registers, column groups
// of up to 4 vectors, tiles of up to 24 accumulators.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu/conv1x1_grad_kernels.hpp"

namespace relpos::cpu::conv1x1::avx512 {

namespace {
constexpr int kL = 16;
#include "cpu/simd_lanes.inc"
constexpr int kMaxNV = 4;
template <int NV>
constexpr int kWeightTile = NV == 4 ? 4 : NV == 1 ? 16 : 8;
template <int NV>
constexpr int kInputTile = NV == 4 ? 6 : NV == 3 ? 8 : NV == 2 ? 12 : 24;
#include "cpu/conv1x1_grad_kernels.inc"
}  // namespace

const Kernels kKernels = {add_weight_grad, pack_weights, input_grad};

}  // namespace relpos::cpu::conv1x1::avx512
