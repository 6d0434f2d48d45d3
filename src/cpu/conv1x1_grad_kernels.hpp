// Internal: the two products of a 1x1 convolution's backward on a block of channels-last rows,
// for the batch norm's backward that hands its input gradient straight to them
// (batchnorm.cpp: batchnorm_conv1x1_backward). g is the gradient of the convolution's output
// (rows x oc), x its input (rows x ic), w its weights (oc x ic, the (O, C, 1, 1) tensor). Channel
// counts are multiples of 16; the kernels are built for AVX-512 only (CMakeLists.txt) and called
// only on CPUs with it (cpu_features.hpp: avx512_kernels()).
//
// A block is small enough (about 64 rows) to stay in the L1 and L2 caches between the batch norm's pass
// that writes g and the two products that read it, so g never goes to memory: the convolution's
// output gradient is otherwise written once and read twice (oneDNN's weight and data gradients).
#pragma once

#include <cstdint>

namespace relpos::cpu::conv1x1 {

// dw[o][i] += sum over the rows of g[r][o] * x[r][i], row r of x at x + r * ldx (ldx >= ic: a
// stride-2 convolution reads every other pixel of a row)
void add_weight_grad(const float* g, std::int64_t oc, const float* x, std::int64_t ic, std::int64_t ldx,
                     std::int64_t rows, float* dw);

// dx[r][i] = sum over o of g[r][o] * w[o][i], row r of dx at dx + r * ldx
void input_grad(const float* g, std::int64_t oc, const float* w, std::int64_t ic, std::int64_t rows, float* dx,
                std::int64_t ldx);

}  // namespace relpos::cpu::conv1x1
