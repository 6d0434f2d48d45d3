// Internal: the batch-norm training kernels on channels-last rows (N*H*W rows of C floats), for
// batchnorm.cpp's own training forward and backward (two passes over memory each way, where
// oneDNN's nhwc primitive made three and four).
//
// Written once (batchnorm_kernels.inc) and built like the SASA kernels: for any CPU
// (batchnorm_kernels_generic.cpp), with AVX2 + FMA and with AVX-512 (CMakeLists.txt sets the flags
// per file); kernels() picks the set for this CPU, capped by RELPOS_SIMD. The forward's ReLU and
// the backward's mask evaluate the same expression in the same build, so the backward recomputes
// the mask from x without a saved one.
#pragma once

#include <cstdint>

namespace relpos::cpu::bn {

struct Kernels {
  // Per channel c of rows [0, rows) of x (row stride c floats), adds to sum[c] the sum of
  // x - pivot[c] and to sumsq[c] that of its squares: float sums over runs of 64 rows, added up in
  // double.
  void (*stats)(const float* x, std::int64_t rows, std::int64_t c, const float* pivot, double* sum, double* sumsq);
  // y = t, or with relu (t < 0 ? 0 : t, NaN stays NaN), t = x * scale + shift (PyTorch's form:
  // scale = gamma / sqrt(var + eps), shift = beta - mean * scale), plus before the ReLU a residual
  // res (same rows, or null), itself as res * res_scale + res_shift where res_scale is not null (a
  // projection shortcut's batch norm). stream: store past the caches where the build can.
  void (*normalize)(const float* x, const float* res, std::int64_t rows, std::int64_t c, const float* scale,
                    const float* shift, const float* res_scale, const float* res_shift, bool relu, bool stream,
                    float* y);
  // The backward's sums, added as stats does: to sum_dy[c] that of g, to sum_dyx[c] that of
  // g * (x - mean); g = dy, or with relu dy where the forward's t > 0 and 0 elsewhere.
  void (*grad_sums)(const float* x, const float* dy, std::int64_t rows, std::int64_t c, const float* mean,
                    const float* scale, const float* shift, bool relu, double* sum_dy, double* sum_dyx);
  // grad_sums without activation for a batch norm whose output went into a residual sum and a
  // ReLU with output y: g = (y > 0) * (dy_a + dy_b) (dy_b may be null; a NaN term stays NaN), also
  // written to g_out for the second pass and the residual's gradient (streamed with stream).
  void (*relu_grad_sums)(const float* x, const float* y, const float* dy_a, const float* dy_b, std::int64_t rows,
                         std::int64_t c, const float* mean, bool stream, float* g_out, double* sum_dy,
                         double* sum_dyx);
  // dx = g * a + (x - mean) * b + d, g as in grad_sums.
  void (*grad_input)(const float* x, const float* dy, std::int64_t rows, std::int64_t c, const float* mean,
                     const float* scale, const float* shift, bool relu, const float* a, const float* b,
                     const float* d, bool stream, float* dx);
  const char* name;
};

const Kernels& kernels();

namespace generic {
extern const Kernels kKernels;
}
namespace avx2 {
extern const Kernels kKernels;
}
namespace avx512 {
extern const Kernels kKernels;
}

}  // namespace relpos::cpu::bn
