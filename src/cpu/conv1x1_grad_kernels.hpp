// Internal: the two products of a 1x1 convolution's backward on a block of channels-last rows
// (conv1x1_grads.hpp runs them over a whole gradient, for the batch norm's backward that hands its
// input gradient straight to them and for conv2d_backward). g is the gradient of the convolution's output
// (rows x oc), x its input (rows x ic), w its weights (oc x ic, the (O, C, 1, 1) tensor). Channel
// counts are multiples of 16. Written once (conv1x1_grad_kernels.inc) and built with AVX2 + FMA and
// with AVX-512 (CMakeLists.txt sets the flags per file); kernels() picks the set for this CPU,
// capped by RELPOS_SIMD, and is null on CPUs without AVX2 and FMA (and outside x86-64).
//
// A block is small enough (about 64 rows) to stay in the L1 and L2 caches between the batch norm's pass
// that writes g and the two products that read it, so g never goes to memory: the convolution's
// output gradient is otherwise written once and read twice (oneDNN's weight and data gradients).
// The kernels read the block's input pixels and the weights from contiguous copies (pack_weights,
// and a copy per column group inside add_weight_grad): rows of 256 to 1024 bytes read in place
// fall into few cache sets (on AVX2 the strided reads ran about 15% slower).
#pragma once

#include <cstdint>

namespace relpos::cpu::conv1x1 {

struct Kernels {
  // dw[o][i] += sum over the rows of g[r][o] * x[r][i], row r of x at x + r * ldx (ldx >= ic: a
  // stride-2 convolution reads every other pixel of a row)
  void (*add_weight_grad)(const float* g, std::int64_t oc, const float* x, std::int64_t ic, std::int64_t ldx,
                          std::int64_t rows, float* dw);
  // w (oc x ic floats) in the order input_grad reads it, into packed (oc x ic floats)
  void (*pack_weights)(const float* w, std::int64_t oc, std::int64_t ic, float* packed);
  // dx[r][i] = sum over o of g[r][o] * w[o][i], row r of dx at dx + r * ldx; w as pack_weights left it
  void (*input_grad)(const float* g, std::int64_t oc, const float* packed_w, std::int64_t ic, std::int64_t rows,
                     float* dx, std::int64_t ldx);
};

// The set for this CPU, or null where there is none.
const Kernels* kernels();

namespace avx2 {
extern const Kernels kKernels;
}
namespace avx512 {
extern const Kernels kKernels;
}

}  // namespace relpos::cpu::conv1x1
