#include "train/grad_clip.hpp"

#include <cmath>

#include "relpos/error.hpp"

namespace relpos::detail {

double clip_grad_norm(const std::vector<ParamRef>& params, double max_norm) {
  RELPOS_CHECK(max_norm > 0.0, "the gradient clipping norm must be positive, got " << max_norm);
  // Host copies (the same tensors for CPU gradients), read once and reused for the scaling.
  std::vector<std::pair<Tensor*, Tensor>> grads;
  double sum = 0.0;
  for (const ParamRef& p : params) {
    if (!p.grad || !p.grad->defined()) continue;
    Tensor host = p.grad->to(Device::CPU);
    const float* g = host.data();
    const std::int64_t n = host.numel();
    double s = 0.0;
    for (std::int64_t k = 0; k < n; ++k) s += static_cast<double>(g[k]) * g[k];
    sum += s;
    grads.emplace_back(p.grad, std::move(host));
  }
  const double norm = std::sqrt(sum);
  RELPOS_CHECK(std::isfinite(norm), "the gradient norm became " << norm << " (learning rate too high?)");
  if (norm <= max_norm) return norm;
  const float scale = static_cast<float>(max_norm / (norm + 1e-6));
  for (auto& [grad, host] : grads) {
    float* g = host.data();
    const std::int64_t n = host.numel();
    for (std::int64_t k = 0; k < n; ++k) g[k] *= scale;
    if (!grad->is_cpu()) grad->copy_from(host);
  }
  return norm;
}

}  // namespace relpos::detail
