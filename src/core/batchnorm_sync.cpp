#include "core/batchnorm_sync.hpp"

#include <atomic>
#include <cmath>
#include <vector>

#include "core/dispatch.hpp"
#include "cpu/cpu_ops.hpp"

namespace relpos::detail {

namespace {

std::atomic<BatchNormSync*> g_sync{nullptr};

// The backend's own forms (ops::batchnorm_* would come back here while a sync is installed).
Tensor local_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean, Tensor& running_var,
                   float eps, float momentum, Act act, ops::BatchStats& stats) {
  RELPOS_DISPATCH(x, batchnorm_train, x, gamma, beta, running_mean, running_var, eps, momentum, act, stats);
}
ops::BatchNormGrads local_backward(const Tensor& x, const Tensor& gamma, const ops::BatchStats& stats, const Tensor& dy) {
  RELPOS_DISPATCH(x, batchnorm_backward, x, gamma, stats, dy);
}

Tensor vector_on(const std::vector<float>& v, Device device) {
  return Tensor::from_vector({static_cast<std::int64_t>(v.size())}, v).to(device);
}

// Every process's values, gathered and summed in process order: the same bits everywhere.
std::vector<double> gathered(BatchNormSync& sync, const std::vector<double>& mine) {
  std::vector<double> all(mine.size() * static_cast<std::size_t>(sync.processes()));
  sync.allgather(mine.data(), mine.size(), all.data());
  return all;
}

}  // namespace

void set_batchnorm_sync(BatchNormSync* sync) { g_sync.store(sync); }
BatchNormSync* batchnorm_sync() { return g_sync.load(); }

Tensor synced_batchnorm_train(BatchNormSync& sync, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              Tensor& running_mean, Tensor& running_var, float eps, float momentum, Act act,
                              ops::BatchStats& stats) {
  RELPOS_CHECK(x.ndim() == 4, "batch norm: input must be (N, C, H, W), got " << x.describe());
  const std::int64_t c = x.dim(1);
  const std::int64_t n = x.dim(0) * x.dim(2) * x.dim(3);
  // This process's mean and (unbiased) variance: what the backend's training forward leaves in
  // copies of the running statistics with momentum 1 (on the CPU its statistics half alone; elsewhere
  // the whole forward, whose output is not used).
  Tensor mean_local = running_mean.clone(), var_local = running_var.clone();
  {
    ops::BatchStats unused;
    if (x.is_cpu()) {
      const ThreadScope relpos_threads_;
      cpu::batchnorm_statistics(x, mean_local, var_local, eps, 1.0f, unused);
    } else {
      local_train(x, gamma, beta, mean_local, var_local, eps, 1.0f, Act::None, unused);
    }
  }
  const std::vector<float> lm = mean_local.to_vector(), lv = var_local.to_vector();
  const std::size_t cs = static_cast<std::size_t>(c), stride = 1 + 2 * cs;
  std::vector<double> mine(stride);
  mine[0] = static_cast<double>(n);
  for (std::size_t i = 0; i < cs; ++i) {
    mine[1 + i] = lm[i];
    mine[1 + cs + i] = static_cast<double>(lv[i]) * static_cast<double>(n - 1) / static_cast<double>(n);  // biased
  }
  const std::vector<double> all = gathered(sync, mine);
  // Counts, means and squared deviations combined process by process (Chan et al.)
  double total = 0.0;
  std::vector<double> mean(cs, 0.0), m2(cs, 0.0);
  for (int p = 0; p < sync.processes(); ++p) total += all[static_cast<std::size_t>(p) * stride];
  for (int p = 0; p < sync.processes(); ++p) {
    const double* r = all.data() + static_cast<std::size_t>(p) * stride;
    for (std::size_t i = 0; i < cs; ++i) mean[i] += r[0] * r[1 + i] / total;
  }
  for (int p = 0; p < sync.processes(); ++p) {
    const double* r = all.data() + static_cast<std::size_t>(p) * stride;
    for (std::size_t i = 0; i < cs; ++i) {
      const double d = r[1 + i] - mean[i];
      m2[i] += r[0] * (r[1 + cs + i] + d * d);
    }
  }
  std::vector<float> gm(cs), gv(cs), inv(cs), rm = running_mean.to_vector(), rv = running_var.to_vector();
  const double unbias = total > 1.0 ? total / (total - 1.0) : 1.0;
  for (std::size_t i = 0; i < cs; ++i) {
    const double var = m2[i] / total;
    gm[i] = static_cast<float>(mean[i]);
    gv[i] = static_cast<float>(var);
    inv[i] = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    rm[i] = (1.0f - momentum) * rm[i] + momentum * gm[i];
    rv[i] = (1.0f - momentum) * rv[i] + momentum * static_cast<float>(var * unbias);
  }
  running_mean.copy_from(Tensor::from_vector({c}, rm));
  running_var.copy_from(Tensor::from_vector({c}, rv));

  stats.mean = vector_on(gm, x.device());
  stats.var = vector_on(gv, x.device());
  stats.inv_std = vector_on(inv, x.device());
  stats.eps = eps;
  stats.act = act;
  stats.global_count = static_cast<std::int64_t>(total);
  // normalised with the global statistics: on the CPU by the training op's own second half (the
  // same rounding as one process), elsewhere by the inference op, which does exactly that
  if (x.is_cpu()) {
    const ThreadScope relpos_threads_;
    return cpu::batchnorm_normalize_train(x, gamma, beta, act, stats);
  }
  Tensor y = ops::batchnorm_infer(x, gamma, beta, stats.mean, stats.var, eps, Act::None);
  if (act == Act::None) {
    stats.aux = Tensor();
    return y;
  }
  stats.aux = y;  // the pre-activation output, for the activation's backward
  return ops::activation(y, act);
}

ops::BatchNormGrads synced_batchnorm_backward(BatchNormSync& sync, const Tensor& x, const Tensor& gamma,
                                              const ops::BatchStats& stats, const Tensor& dy) {
  // the CPU's backward takes the activation's saved state as its forward left it; elsewhere the
  // activation's gradient comes first
  const bool cpu = x.is_cpu();
  const Tensor dy_pre = cpu || stats.act == Act::None ? dy : ops::activation_backward(stats.aux, dy, stats.act);
  ops::BatchStats local_stats = stats;
  if (!cpu) {
    local_stats.act = Act::None;
    local_stats.aux = Tensor();
  }
  local_stats.global_count = 0;
  // The backend's backward with the global mean and variance: dgamma and dbeta are this process's
  // sums, and dx = gamma inv_std (dy - dbeta / n - xhat dgamma / n) with this process's sums and count.
  ops::BatchNormGrads g = local_backward(x, gamma, local_stats, dy_pre);
  const std::int64_t c = x.dim(1);
  const std::size_t cs = static_cast<std::size_t>(c);
  const double n = static_cast<double>(x.dim(0) * x.dim(2) * x.dim(3));
  const double total = static_cast<double>(stats.global_count);
  const std::vector<float> dgamma = g.dgamma.to_vector(), dbeta = g.dbeta.to_vector();
  std::vector<double> mine(2 * cs);
  for (std::size_t i = 0; i < cs; ++i) {
    mine[i] = dgamma[i];
    mine[cs + i] = dbeta[i];
  }
  const std::vector<double> all = gathered(sync, mine);
  std::vector<double> sum(2 * cs, 0.0);
  for (int p = 0; p < sync.processes(); ++p)
    for (std::size_t i = 0; i < 2 * cs; ++i) sum[i] += all[static_cast<std::size_t>(p) * 2 * cs + i];
  // dx needs the global sums: add gamma inv_std ((dbeta/n - Dbeta/N) + xhat (dgamma/n - Dgamma/N)),
  // an affine map of x per channel, which the inference op computes.
  const std::vector<float> gam = gamma.to_vector(), inv = stats.inv_std.to_vector();
  std::vector<float> scale(cs), shift(cs);
  for (std::size_t i = 0; i < cs; ++i) {
    const double k = static_cast<double>(gam[i]) * inv[i];
    scale[i] = static_cast<float>(k * (dgamma[i] / n - sum[i] / total));
    shift[i] = static_cast<float>(k * (dbeta[i] / n - sum[cs + i] / total));
  }
  const Tensor fix = ops::batchnorm_infer(x, vector_on(scale, x.device()), vector_on(shift, x.device()), stats.mean,
                                          stats.var, stats.eps, Act::None);
  g.dx = ops::add(g.dx, fix);
  return g;  // dgamma and dbeta stay this process's sums: the gradient all-reduce combines them
}

}  // namespace relpos::detail
