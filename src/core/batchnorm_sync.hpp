// Internal: synchronised batch norm for data-parallel training (--sync-bn). While a BatchNormSync
// is installed, batch norm in training normalises with the mean and variance of the global batch
// (every process's part of it), and its backward subtracts the global means of the gradient terms,
// so N processes with batch B compute what one process with batch N x B would. Backend-neutral:
// the local statistics and gradient sums come from the backend's own ops, the exchange happens on
// the host (2 C values per layer and direction).
#pragma once

#include <cstddef>

#include "core/ops_internal.hpp"

namespace relpos::detail {

// How the statistics travel between processes (the trainer's process group implements it).
class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  // Every process's n values, process after process, into all (n x processes). Every process
  // combines them in that same order, so all of them get the same bits.
  virtual void allgather(const double* mine, std::size_t n, double* all) = 0;
  virtual int processes() const = 0;
};

// Installs (or, with nullptr, removes) the synchronisation for this process's training. Set while
// one train() runs; not meant for concurrent trainings in one process.
void set_batchnorm_sync(BatchNormSync* sync);
BatchNormSync* batchnorm_sync();

// The synchronised forms of ops::batchnorm_train and ops::batchnorm_backward (same contracts);
// the backward is taken when the forward's stats say they were global (stats.global_count > 0).
Tensor synced_batchnorm_train(BatchNormSync& sync, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              Tensor& running_mean, Tensor& running_var, float eps, float momentum, Act act,
                              ops::BatchStats& stats);
ops::BatchNormGrads synced_batchnorm_backward(BatchNormSync& sync, const Tensor& x, const Tensor& gamma,
                                              const ops::BatchStats& stats, const Tensor& dy);

}  // namespace relpos::detail
