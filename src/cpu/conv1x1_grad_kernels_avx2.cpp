// The 1x1 convolution's gradient products (conv1x1_grad_kernels.inc) built with AVX2 and FMA
// (CMakeLists.txt sets the flags for this file only): 8-lane vectors in 16 registers, tiles of 6
// output channels or rows x 2 vectors (12 accumulators, 2 loaded vectors and a broadcast).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu/conv1x1_grad_kernels.hpp"

namespace relpos::cpu::conv1x1::avx2 {

namespace {
constexpr int kL = 8;
#include "cpu/simd_lanes.inc"
constexpr int kMaxNV = 2;
template <int NV>
constexpr int kWeightTile = NV == 2 ? 6 : 12;
template <int NV>
constexpr int kInputTile = NV == 2 ? 6 : 12;
#include "cpu/conv1x1_grad_kernels.inc"
}  // namespace

const Kernels kKernels = {add_weight_grad, pack_weights, input_grad};

}  // namespace relpos::cpu::conv1x1::avx2
