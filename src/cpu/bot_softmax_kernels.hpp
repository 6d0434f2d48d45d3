// Internal: BoTNet attention's logits into probabilities, one pass set per row of query logits: the
// 2D relative-position terms added (docs/attention.md: L[i, j] += qh[i, ry(i, j)] + qw[i, rx(i, j)])
// and the row's softmax, while the row (H * W floats) stays in L1. bot_attention.cpp ran an
// expansion loop and then oneDNN's softmax over the block, two more passes over memory and a
// primitive call per block.
//
// Written once (bot_softmax_kernels.inc) and built like the batch-norm kernels: for any CPU
// (bot_softmax_kernels_generic.cpp), with AVX2 + FMA and with AVX-512 (CMakeLists.txt sets the
// flags per file); kernels() picks the set for this CPU, capped by RELPOS_SIMD.
#pragma once

#include <cstdint>

namespace relpos::cpu::bot {

// The relative terms of a block of query rows: row r of qh holds Th values (index
// clamp(yj - yi, -kh, kh) + kh for key row yj and query row yi), row r of qw holds Tw (the same for
// columns). qh null: no terms, a plain softmax.
struct RelTerms {
  const float* qh = nullptr;
  const float* qw = nullptr;
  std::int64_t Th = 0, Tw = 0;
  int kh = 0, kw = 0;
};

struct Kernels {
  // Rows r = 0 .. rows - 1 of L (H * W logits each, row stride H * W) belong to queries i0 + r,
  // query i at (i / W, i % W): adds the terms where rel.qh is set, then replaces each row by its
  // softmax. A NaN logit makes its row NaN. scratch: scratch_floats(H, W) floats.
  void (*rel_softmax_rows)(float* L, std::int64_t rows, std::int64_t i0, std::int64_t H, std::int64_t W,
                           const RelTerms& rel, float* scratch);
  const char* name;
};

const Kernels& kernels();

// Scratch a call needs (the widest build's: 16 lanes).
inline std::int64_t scratch_floats(std::int64_t H, std::int64_t W) {
  const std::int64_t n = H * W;
  return 32 + 2 * (n + 16) + W;
}

namespace generic {
extern const Kernels kKernels;
}
namespace avx2 {
extern const Kernels kKernels;
}
namespace avx512 {
extern const Kernels kKernels;
}

}  // namespace relpos::cpu::bot
