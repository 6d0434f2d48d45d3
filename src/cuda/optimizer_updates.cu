// Optimizer updates on the GPU (twin of cpu/optimizer_updates.cpp): SGD with momentum and
// Nesterov, AdamW, one fused kernel each over a parameter tensor.
#include <cmath>

#include "cuda/cuda_common.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/elementwise.cuh"

namespace relpos::cuda {

namespace {

__global__ void sgd_kernel(float* p, const float* g, float* buf, std::int64_t n, float lr, float mom, bool nesterov,
                           float wd, bool first) {
  RELPOS_GRID_LOOP(i, n) {
    const float gi = g[i] + wd * p[i];
    const float bi = first ? gi : mom * buf[i] + gi;
    buf[i] = bi;
    p[i] -= lr * (nesterov ? gi + mom * bi : bi);
  }
}
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, std::int64_t n, float lr, float b1, float b2,
                             float eps, float wd, float step_size, float bc2_sqrt) {
  RELPOS_GRID_LOOP(i, n) {
    p[i] *= 1.0f - lr * wd;
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
  }
}
}  // namespace

void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, float lr, float momentum, bool nesterov,
                float weight_decay, bool first_step) {
  const Tensor g = grad.to_layout(param.layout());
  sgd_kernel<<<grid_for(param.numel()), 256, 0, stream()>>>(param.data(), g.data(), buf.data(), param.numel(), lr,
                                                             momentum, nesterov, weight_decay, first_step);
  RELPOS_CUDA_LAUNCHED();
}

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, float lr, float beta1, float beta2,
                  float eps, float weight_decay, long step) {
  const Tensor g = grad.to_layout(param.layout());
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  adamw_kernel<<<grid_for(param.numel()), 256, 0, stream()>>>(param.data(), g.data(), m.data(), v.data(), param.numel(),
                                                               lr, beta1, beta2, eps, weight_decay, lr / bc1,
                                                               std::sqrt(bc2));
  RELPOS_CUDA_LAUNCHED();
}

}  // namespace relpos::cuda
