// 3x3 convolutions of inputs with few channels (conv2d_narrow_input.hpp): the parts that are not
// vector kernels, built for any CPU.
#include "cpu/conv2d_narrow_input.hpp"

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

}  // namespace relpos::cpu::narrow_input
