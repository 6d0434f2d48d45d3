// Row softmax and the cross-entropy loss on the CPU.
#include <algorithm>
#include <cmath>

#include "cpu/cpu_ops.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

namespace {
// log-softmax of one row into out
void log_softmax_row(const float* x, float* out, std::int64_t k) {
  float m = x[0];
  for (std::int64_t j = 1; j < k; ++j) m = std::max(m, x[j]);
  double s = 0.0;
  for (std::int64_t j = 0; j < k; ++j) s += std::exp(static_cast<double>(x[j] - m));
  const float lse = m + static_cast<float>(std::log(s));
  for (std::int64_t j = 0; j < k; ++j) out[j] = x[j] - lse;
}
}  // namespace

Tensor softmax(const Tensor& x) {
  RELPOS_CHECK(x.ndim() == 2 && x.is_cpu(), "softmax: needs a 2-D CPU tensor, got " << x.describe());
  const std::int64_t n = x.dim(0), k = x.dim(1);
  Tensor y(x.shape());
  for (std::int64_t i = 0; i < n; ++i) {
    log_softmax_row(x.data() + i * k, y.data() + i * k, k);
    for (std::int64_t j = 0; j < k; ++j) y.data()[i * k + j] = std::exp(y.data()[i * k + j]);
  }
  return y;
}

ops::CrossEntropy cross_entropy(const Tensor& logits, const std::vector<int>& labels, float smoothing) {
  RELPOS_CHECK(logits.ndim() == 2, "cross entropy: logits must be (N, classes), got " << logits.describe());
  const std::int64_t n = logits.dim(0), k = logits.dim(1);
  RELPOS_CHECK(static_cast<std::int64_t>(labels.size()) == n,
               "cross entropy: " << labels.size() << " labels for " << n << " rows of logits");
  RELPOS_CHECK(smoothing >= 0.0f && smoothing < 1.0f, "label smoothing must be in [0, 1), got " << smoothing);
  const Tensor x = logits.to(Device::CPU);
  ops::CrossEntropy ce;
  ce.dlogits = Tensor({n, k});
  std::vector<float> logp(static_cast<std::size_t>(k));
  double total = 0.0;
  const float off = smoothing / static_cast<float>(k);
  for (std::int64_t i = 0; i < n; ++i) {
    const int y = labels[static_cast<std::size_t>(i)];
    RELPOS_CHECK(y >= 0 && y < k, "cross entropy: label " << y << " outside 0.." << k - 1);
    log_softmax_row(x.data() + i * k, logp.data(), k);
    double row = 0.0;
    for (std::int64_t j = 0; j < k; ++j) {
      const float target = off + (j == y ? 1.0f - smoothing : 0.0f);
      row -= static_cast<double>(target) * logp[static_cast<std::size_t>(j)];
      ce.dlogits.data()[i * k + j] =
          (std::exp(logp[static_cast<std::size_t>(j)]) - target) / static_cast<float>(n);
    }
    total += row;
  }
  ce.loss = static_cast<float>(total / static_cast<double>(n));
  if (logits.is_cuda()) ce.dlogits = ce.dlogits.to(Device::CUDA);
  return ce;
}

}  // namespace relpos::cpu
