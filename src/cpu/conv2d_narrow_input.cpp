// 3x3 convolutions of inputs with few channels (conv2d_narrow_input.hpp): the parts that are not
// vector kernels, built for any CPU.
#include "cpu/conv2d_narrow_input.hpp"

#include <omp.h>

#include <algorithm>

#include "cpu/cpu_features.hpp"

namespace relpos::cpu::narrow_input {

bool suits(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kh, std::int64_t kw, int stride,
           int pad, int groups, Act act) {
  return kh == 3 && kw == 3 && pad == 1 && (stride == 1 || stride == 2) && groups == 1 && in_channels >= 1 &&
         in_channels <= kMaxIn && out_channels % 8 == 0 && out_channels >= 8 && out_channels <= 32 &&
         (act == Act::None || act == Act::ReLU) && avx2_kernels() && !avx512_kernels();
}

std::shared_ptr<Weights> pack(const float* w, std::int64_t out, std::int64_t in, const float* bias) {
  auto wt = std::make_shared<Weights>();
  wt->in = in;
  wt->out = out;
  wt->w.resize(static_cast<std::size_t>(in * 9 * out));
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t t = 0; t < in * 9; ++t) wt->w[static_cast<std::size_t>(t * out + o)] = w[o * in * 9 + t];
  wt->bias.assign(static_cast<std::size_t>(out), 0.0f);
  if (bias) std::copy(bias, bias + out, wt->bias.begin());
  return wt;
}

void conv3x3(const InputView& x, int stride, const Weights& wt, Act act, float* y) {
  conv3x3_avx2(x, stride, PackedKernels{wt.w.data(), wt.bias.data(), wt.in, wt.out}, act, y);
}

void weight_grad(const InputView& x, int stride, const float* dy, std::int64_t in, std::int64_t out, float* dw) {
  const std::int64_t oh = (x.h - 1) / stride + 1, ow = (x.w - 1) / stride + 1, rows = x.n * oh;
  const std::int64_t size = in * 9 * out, row_len = (ow * stride + 2 + 15) / 16 * 16;
  const int threads = omp_get_max_threads();
  std::vector<float> sums(static_cast<std::size_t>(threads * size), 0.0f);
  std::vector<float> scratch(static_cast<std::size_t>(threads * row_len));
  int used = 1;
#pragma omp parallel num_threads(threads)
  {
#pragma omp single
    used = omp_get_num_threads();
    const int t = omp_get_thread_num();
    weight_grad_rows_avx2(x, stride, dy, in, out, rows * t / used, rows * (t + 1) / used,
                          scratch.data() + t * row_len, sums.data() + t * size);
  }
  const auto at = [&](std::int64_t i) -> float& { return sums[static_cast<std::size_t>(i)]; };
  for (int t = 1; t < used; ++t)
    for (std::int64_t i = 0; i < size; ++i) at(i) += at(t * size + i);
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t tap = 0; tap < in * 9; ++tap) dw[o * in * 9 + tap] = at(tap * out + o);
}

}  // namespace relpos::cpu::narrow_input
