// Fully connected layers and plain matrix products on the CPU (oneDNN sgemm).
#include "cpu/cpu_ops.hpp"
#include "cpu/dnnl_util.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

Tensor linear(const Tensor& x, const Tensor& w, const Tensor* b) {
  RELPOS_CHECK(x.ndim() == 2 && w.ndim() == 2 && x.dim(1) == w.dim(1),
               "linear: input " << x.describe() << " does not fit weight " << w.describe());
  const std::int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  Tensor y({n, out});
  if (b) {
    RELPOS_CHECK(b->numel() == out, "linear: bias of " << b->numel() << " values for " << out << " outputs");
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < out; ++j) y.data()[i * out + j] = b->data()[j];
  }
  gemm(false, true, n, out, in, 1.0f, x.data(), in, w.data(), in, b ? 1.0f : 0.0f, y.data(), out);
  return y;
}

ops::LinearGrads linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy) {
  const std::int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  RELPOS_CHECK(dy.shape() == Shape({n, out}), "linear backward: gradient " << dy.describe());
  ops::LinearGrads g;
  g.dx = Tensor({n, in});
  g.dw = Tensor({out, in});
  g.db = Tensor::zeros({out});
  gemm(false, false, n, in, out, 1.0f, dy.data(), out, w.data(), in, 0.0f, g.dx.data(), in);
  gemm(true, false, out, in, n, 1.0f, dy.data(), out, x.data(), in, 0.0f, g.dw.data(), in);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < out; ++j) g.db.data()[j] += dy.data()[i * out + j];
  return g;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  RELPOS_CHECK(a.ndim() == 2 && b.ndim() == 2, "matmul: needs 2-D tensors, got " << a.describe() << " and "
                                                                                 << b.describe());
  const std::int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
  const std::int64_t kb = trans_b ? b.dim(1) : b.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  RELPOS_CHECK(k == kb, "matmul: inner sizes " << k << " and " << kb << " differ");
  Tensor c({m, n});
  gemm(trans_a, trans_b, m, n, k, 1.0f, a.data(), a.dim(1), b.data(), b.dim(1), 0.0f, c.data(), n);
  return c;
}

}  // namespace relpos::cpu
