// The Winograd kernels built with AVX-512 (F, VL, DQ, BW) and FMA, 16 lanes (CMakeLists.txt sets the
// flags for this file only); conv2d_winograd.cpp calls them only on a CPU that has them.
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#include "cpu/conv2d_winograd.hpp"

namespace relpos::cpu::winograd::avx512 {
constexpr int kL = 16;
#include "cpu/conv2d_winograd_kernels.inc"
}  // namespace relpos::cpu::winograd::avx512
