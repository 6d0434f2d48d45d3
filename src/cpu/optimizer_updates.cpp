// Optimizer updates on the CPU: elementwise, memory-bound loops over each parameter.
#include <cmath>

#include "cpu/cpu_ops.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, float lr, float momentum, bool nesterov,
                float weight_decay, bool first_step) {
  RELPOS_CHECK(grad.numel() == param.numel() && buf.numel() == param.numel(), "sgd: size mismatch");
  const Tensor g_in = grad.to_layout(param.layout());
  float* p = param.data();
  const float* g = g_in.data();
  float* b = buf.data();
  const std::int64_t n = param.numel();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = g[i] + weight_decay * p[i];
    const float bi = first_step ? gi : momentum * b[i] + gi;
    b[i] = bi;
    p[i] -= lr * (nesterov ? gi + momentum * bi : bi);
  }
}

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, float lr, float beta1, float beta2,
                  float eps, float weight_decay, long step) {
  RELPOS_CHECK(grad.numel() == param.numel() && m.numel() == param.numel() && v.numel() == param.numel(),
               "adamw: size mismatch");
  const Tensor g_in = grad.to_layout(param.layout());
  float* p = param.data();
  const float* g = g_in.data();
  float* mp = m.data();
  float* vp = v.data();
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  const float step_size = lr / bc1;
  const float bc2_sqrt = std::sqrt(bc2);
  const std::int64_t n = param.numel();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    p[i] *= 1.0f - lr * weight_decay;
    mp[i] = beta1 * mp[i] + (1.0f - beta1) * g[i];
    vp[i] = beta2 * vp[i] + (1.0f - beta2) * g[i] * g[i];
    p[i] -= step_size * mp[i] / (std::sqrt(vp[i]) / bc2_sqrt + eps);
  }
}

}  // namespace relpos::cpu
