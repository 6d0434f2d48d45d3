// Elementwise ops on the GPU (twin of cpu/elementwise.cpp): activations forward and backward, and
// residual adds.
#include "cuda/cuda_common.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/elementwise.cuh"

namespace relpos::cuda {

namespace {

__global__ void act_kernel(const float* x, float* y, std::int64_t n, int act) {
  RELPOS_GRID_LOOP(i, n) y[i] = act_fwd(x[i], act);
}
__global__ void act_back_kernel(const float* x, const float* dy, float* dx, std::int64_t n, int act) {
  RELPOS_GRID_LOOP(i, n) dx[i] = dy[i] * act_grad(x[i], act);
}
__global__ void add_kernel(const float* a, const float* b, float* y, std::int64_t n, int act) {
  RELPOS_GRID_LOOP(i, n) y[i] = act_fwd(a[i] + b[i], act);
}
Tensor like(const Tensor& t) { return Tensor(t.shape(), Device::CUDA, t.layout()); }

}  // namespace

void apply_activation_inplace(Tensor& t, Act act) {
  if (act == Act::None || t.numel() == 0) return;
  act_kernel<<<grid_for(t.numel()), 256, 0, stream()>>>(t.data(), t.data(), t.numel(), code(act));
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

}  // namespace relpos::cuda
