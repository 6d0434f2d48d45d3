// Activations and residual adds on the CPU through oneDNN eltwise and binary primitives.
#include "cpu/cpu_ops.hpp"
#include "cpu/dnnl_util.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

namespace {
dnnl::algorithm algo_of(Act act) {
  switch (act) {
    case Act::ReLU: return dnnl::algorithm::eltwise_relu;
    case Act::SiLU: return dnnl::algorithm::eltwise_swish;
    case Act::None: break;
  }
  return dnnl::algorithm::eltwise_linear;
}
// eltwise alpha/beta: relu slope 0; swish x*sigmoid(1*x); linear 1*x+0
float alpha_of(Act act) { return act == Act::ReLU ? 0.0f : 1.0f; }

Tensor like(const Tensor& x) { return Tensor(x.shape(), Device::CPU, x.layout()); }
}  // namespace

Tensor activation(const Tensor& x, Act act) {
  RELPOS_CHECK(x.is_cpu(), "activation: expected a CPU tensor");
  if (act == Act::None) return x;
  auto md = md_of(x);
  dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_training, algo_of(act), md, alpha_of(act), 0.0f);
  dnnl::eltwise_forward::primitive_desc pd(d, scratch_attr(), engine());
  Tensor y = like(x);
  execute(dnnl::eltwise_forward(pd), pd.scratchpad_desc(), {{DNNL_ARG_SRC, mem(md, x)}, {DNNL_ARG_DST, mem(md, y)}});
  return y;
}

Tensor activation_backward(const Tensor& x, const Tensor& dy_in, Act act) {
  if (act == Act::None) return dy_in;
  RELPOS_CHECK(dy_in.shape() == x.shape(), "activation backward: gradient " << dy_in.describe()
                                                                            << " does not match input "
                                                                            << x.describe());
  const Tensor dy = dy_in.to_layout(x.layout());
  auto md = md_of(x);
  dnnl::eltwise_forward::desc fd(dnnl::prop_kind::forward_training, algo_of(act), md, alpha_of(act), 0.0f);
  dnnl::eltwise_forward::primitive_desc fpd(fd, scratch_attr(), engine());
  dnnl::eltwise_backward::desc d(algo_of(act), md, md, alpha_of(act), 0.0f);
  dnnl::eltwise_backward::primitive_desc pd(d, scratch_attr(), engine(), fpd);
  Tensor dx = like(x);
  execute(dnnl::eltwise_backward(pd), pd.scratchpad_desc(),
          {{DNNL_ARG_SRC, mem(md, x)}, {DNNL_ARG_DIFF_DST, mem(md, dy)}, {DNNL_ARG_DIFF_SRC, mem(md, dx)}});
  return dx;
}

namespace {
void binary_add(const Tensor& a, const Tensor& b_in, Tensor& out, Act act) {
  RELPOS_CHECK(a.shape() == b_in.shape(), "add: shapes " << to_string(a.shape()) << " and "
                                                         << to_string(b_in.shape()) << " differ");
  const Tensor b = b_in.to_layout(a.layout());
  auto md = md_of(a);
  dnnl::binary::desc d(dnnl::algorithm::binary_add, md, md, md);
  dnnl::primitive_attr attr = scratch_attr();
  if (act != Act::None) {
    dnnl::post_ops po;
    po.append_eltwise(1.0f, algo_of(act), alpha_of(act), 0.0f);
    attr.set_post_ops(po);
  }
  dnnl::binary::primitive_desc pd(d, attr, engine());
  execute(dnnl::binary(pd), pd.scratchpad_desc(),
          {{DNNL_ARG_SRC_0, mem(md, a)}, {DNNL_ARG_SRC_1, mem(md, b)}, {DNNL_ARG_DST, mem(md, out)}});
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b, Act act) {
  Tensor out = like(a);
  binary_add(a, b, out, act);
  return out;
}

void add_inplace(Tensor& a, const Tensor& b) { binary_add(a, b, a, Act::None); }

Tensor relu_backward_sum(const Tensor& y, const Tensor& dy_a_in, const Tensor& dy_b_in) {
  RELPOS_CHECK(dy_a_in.shape() == y.shape() && dy_b_in.shape() == y.shape(),
               "activation backward: gradients " << dy_a_in.describe() << " and " << dy_b_in.describe()
                                                 << " do not match " << y.describe());
  const Tensor a = dy_a_in.to_layout(y.layout()), b = dy_b_in.to_layout(y.layout());
  Tensor dx = like(y);
  const float* yp = y.data();
  const float* ap = a.data();
  const float* bp = b.data();
  float* dp = dx.data();
  const std::int64_t n = y.numel();
  // the bits of add_inplace then oneDNN's ReLU backward: s where y > 0, else 0 * s (0, or NaN for a
  // gradient that is NaN or infinite); as a product with a 0/1 mask, without a branch (the mask is
  // as good as random: a branch per element was 3x slower), so the loop vectorises
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float mask = yp[i] > 0.0f ? 1.0f : 0.0f;
    dp[i] = (ap[i] + bp[i]) * mask;
  }
  return dx;
}

}  // namespace relpos::cpu
