// Elementwise kernels of the CUDA backend: activations (forward and backward), residual adds,
// optimizer updates, and small row/column helpers for linear layers.
#include "cuda/cuda_common.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/elementwise.cuh"

namespace relpos::cuda {

namespace {

#define RELPOS_GRID_LOOP(i, n) \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

unsigned grid_for(std::int64_t n) { return std::min<unsigned>(blocks_for(n), 8192); }

__global__ void act_kernel(const float* x, float* y, std::int64_t n, int act) {
  RELPOS_GRID_LOOP(i, n) y[i] = act_fwd(x[i], act);
}
__global__ void act_back_kernel(const float* x, const float* dy, float* dx, std::int64_t n, int act) {
  RELPOS_GRID_LOOP(i, n) dx[i] = dy[i] * act_grad(x[i], act);
}
__global__ void add_kernel(const float* a, const float* b, float* y, std::int64_t n, int act) {
  RELPOS_GRID_LOOP(i, n) y[i] = act_fwd(a[i] + b[i], act);
}
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
__global__ void row_bias_kernel(float* y, const float* b, std::int64_t rows, std::int64_t cols) {
  RELPOS_GRID_LOOP(i, rows * cols) y[i] += b[i % cols];
}
__global__ void col_sum_kernel(const float* m, float* out, std::int64_t rows, std::int64_t cols) {
  RELPOS_GRID_LOOP(j, cols) {
    float s = 0.0f;
    for (std::int64_t i = 0; i < rows; ++i) s += m[i * cols + j];
    out[j] = s;
  }
}

Tensor like(const Tensor& t) { return Tensor(t.shape(), Device::CUDA, t.layout()); }

}  // namespace

void apply_activation_inplace(Tensor& t, Act act) {
  if (act == Act::None || t.numel() == 0) return;
  act_kernel<<<grid_for(t.numel()), 256, 0, stream()>>>(t.data(), t.data(), t.numel(), code(act));
  RELPOS_CUDA_LAUNCHED();
}

void add_row_bias(float* y, const float* b, std::int64_t rows, std::int64_t cols) {
  if (rows * cols == 0) return;
  row_bias_kernel<<<grid_for(rows * cols), 256, 0, stream()>>>(y, b, rows, cols);
  RELPOS_CUDA_LAUNCHED();
}

void column_sums(const float* m, float* out, std::int64_t rows, std::int64_t cols) {
  if (cols == 0) return;
  col_sum_kernel<<<grid_for(cols), 256, 0, stream()>>>(m, out, rows, cols);
  RELPOS_CUDA_LAUNCHED();
}

Tensor activation(const Tensor& x, Act act) {
  require_cuda(x, "activation");
  if (act == Act::None) return x;
  Tensor y = like(x);
  if (x.numel()) act_kernel<<<grid_for(x.numel()), 256, 0, stream()>>>(x.data(), y.data(), x.numel(), code(act));
  RELPOS_CUDA_LAUNCHED();
  return y;
}

Tensor activation_backward(const Tensor& x, const Tensor& dy_in, Act act) {
  if (act == Act::None) return dy_in;
  RELPOS_CHECK(dy_in.shape() == x.shape(), "activation backward: shapes differ");
  const Tensor dy = dy_in.to_layout(x.layout());
  Tensor dx = like(x);
  if (x.numel())
    act_back_kernel<<<grid_for(x.numel()), 256, 0, stream()>>>(x.data(), dy.data(), dx.data(), x.numel(), code(act));
  RELPOS_CUDA_LAUNCHED();
  return dx;
}

Tensor add(const Tensor& a, const Tensor& b_in, Act act) {
  RELPOS_CHECK(a.shape() == b_in.shape(), "add: shapes " << to_string(a.shape()) << " and " << to_string(b_in.shape()));
  const Tensor b = b_in.to_layout(a.layout());
  Tensor y = like(a);
  if (a.numel()) add_kernel<<<grid_for(a.numel()), 256, 0, stream()>>>(a.data(), b.data(), y.data(), a.numel(), code(act));
  RELPOS_CUDA_LAUNCHED();
  return y;
}

void add_inplace(Tensor& a, const Tensor& b_in) {
  RELPOS_CHECK(a.shape() == b_in.shape(), "add: shapes differ");
  const Tensor b = b_in.to_layout(a.layout());
  if (a.numel()) add_kernel<<<grid_for(a.numel()), 256, 0, stream()>>>(a.data(), b.data(), a.data(), a.numel(), 0);
  RELPOS_CUDA_LAUNCHED();
}

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
