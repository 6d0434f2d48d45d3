// The backward of a 1x1 convolution over blocks of its output gradient (conv1x1_grads.hpp).
#include "cpu/conv1x1_grads.hpp"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "cpu/conv1x1_grad_kernels.hpp"
#include "cpu/cpu_features.hpp"
#include "cpu/thread_buffer.hpp"

namespace relpos::cpu::conv1x1 {

const Kernels* kernels() {
#if defined(__x86_64__)  // conv1x1_grad_kernels_avx*.cpp are built for x86-64 only
  static const Kernels* k = avx512_kernels() ? &avx512::kKernels : avx2_kernels() ? &avx2::kKernels : nullptr;
  return k;
#else
  return nullptr;
#endif
}

bool grads_fit(std::int64_t ic, std::int64_t oc, int stride) {
  return kernels() && (stride == 1 || stride == 2) && oc % 16 == 0 && ic % 16 == 0 && oc > 0 && ic > 0 &&
         oc * ic <= 256 * 256;
}

void grads(const GradShape& s, const BlockOfG& block_of_g, const float* x, const float* w, float* dw, float* dx) {
  const Kernels& k = *kernels();
  const std::int64_t ic = s.ic, oc = s.oc, H = s.h, W = s.w;
  const std::int64_t oh = (H - 1) / s.stride + 1, ow = (W - 1) / s.stride + 1, rows = s.n * oh * ow;
  constexpr std::int64_t kRows = 64;
  // stride 1: blocks of kRows rows; stride 2: of `lines` output image rows
  const std::int64_t lines = std::max<std::int64_t>(1, kRows / ow);
  const std::int64_t block_rows = s.stride == 1 ? kRows : lines * ow;
  const std::int64_t blocks = (rows + block_rows - 1) / block_rows, wsize = oc * ic;
  const int threads = omp_get_max_threads();
  std::vector<float> partial(static_cast<std::size_t>(threads * wsize), 0.0f);
  std::vector<float> packed_w(dx ? static_cast<std::size_t>(wsize) : 0);
  if (dx) k.pack_weights(w, oc, ic, packed_w.data());
  const float* wp = packed_w.data();
  // output image row `line` reads input row 2 y of its image: its first pixel
  const auto input_pixel = [&](std::int64_t line) { return (line / oh * H + 2 * (line % oh)) * W; };
  int used = 1;
#pragma omp parallel
  {
#pragma omp single
    used = omp_get_num_threads();
    // the block's g (block_rows x oc), and at stride 2 its input pixels and input gradient
    // (block_rows x ic each)
    float* buf = thread_buffer(ThreadBuffer::Conv1x1Block, block_rows * (oc + (s.stride == 2 ? 2 * ic : 0)));
    float* xs = buf + block_rows * oc;
    float* dxs = xs + block_rows * ic;
    float* dwt = partial.data() + static_cast<std::int64_t>(omp_get_thread_num()) * wsize;
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t r0 = b * block_rows, n = std::min(block_rows, rows - r0);
      const float* g = block_of_g(r0, n, buf);
      if (s.stride == 1) {
        k.add_weight_grad(g, oc, x + r0 * ic, ic, ic, n, dwt);
        if (dx) k.input_grad(g, oc, wp, ic, n, dx + r0 * ic, ic);
        continue;
      }
      for (std::int64_t line = r0 / ow; line < (r0 + n) / ow; ++line) {
        const float* src = x + input_pixel(line) * ic;
        float* dst = xs + (line * ow - r0) * ic;
        for (std::int64_t col = 0; col < ow; ++col)
          std::copy(src + 2 * col * ic, src + (2 * col + 1) * ic, dst + col * ic);
      }
      k.add_weight_grad(g, oc, xs, ic, ic, n, dwt);
      if (!dx) continue;
      k.input_grad(g, oc, wp, ic, n, dxs, ic);
      for (std::int64_t line = r0 / ow; line < (r0 + n) / ow; ++line) {
        const float* src = dxs + (line * ow - r0) * ic;
        float* d = dx + input_pixel(line) * ic;
        for (std::int64_t col = 0; col < W; ++col) {
          if (col % 2 == 0) std::copy(src + col / 2 * ic, src + (col / 2 + 1) * ic, d + col * ic);
          else std::fill(d + col * ic, d + (col + 1) * ic, 0.0f);
        }
        if (2 * (line % oh) + 1 < H) std::fill(d + W * ic, d + 2 * W * ic, 0.0f);
      }
    }
  }
  const float* pp = partial.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < wsize; ++i) {
    float sum = pp[i];
    for (int t = 1; t < used; ++t) sum += pp[static_cast<std::int64_t>(t) * wsize + i];
    dw[i] = sum;
  }
}

}  // namespace relpos::cpu::conv1x1
