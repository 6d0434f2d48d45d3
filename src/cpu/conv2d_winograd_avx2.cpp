// The Winograd kernels built with AVX2 and FMA, 8 lanes (CMakeLists.txt sets -mavx2 -mfma for
// this file only); conv2d_winograd.cpp calls them only on a CPU that has both.
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#include "cpu/conv2d_winograd.hpp"

namespace relpos::cpu::winograd::avx2 {
constexpr int kL = 8;
#include "cpu/conv2d_winograd_kernels.inc"
}  // namespace relpos::cpu::winograd::avx2
