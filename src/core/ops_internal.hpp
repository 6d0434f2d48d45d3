// Internal: the ops' forms that take library internals (plan caches, what batch norm saves for
// its backward). Implemented with the public ops in src/core/ops.cpp.
#pragma once

#include "core/op_cache.hpp"
#include "core/runtime_internal.hpp"
#include "relpos/ops.hpp"

namespace relpos {

namespace ops {

struct BatchStats {  // what the backward needs; each backend fills what it uses
  Tensor mean;     // (C) batch mean
  Tensor var;      // (C) biased batch variance (CPU)
  Tensor inv_std;  // (C) 1 / sqrt(var + eps) (CUDA: cuDNN's saved inverse variance)
  float eps = 1e-5f;
  Act act = Act::None;
  Tensor aux;      // the activation's saved state: oneDNN's fused-ReLU workspace, or the
                   // pre-activation output
  std::int64_t global_count = 0;  // synchronised batch norm (core/batchnorm_sync.hpp): values per
                                  // channel over every process; 0: this batch's own statistics
};


// ops::conv2d with the calling layer's plan cache.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvSpec& spec, const Epilogue& epilogue,
              OpCache* cache);

// act(batch norm with batch statistics); updates running_mean and running_var in place with
// `momentum` (running_var takes the unbiased batch variance). ReLU runs fused on the CPU.
Tensor batchnorm_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, float eps, float momentum, Act act, BatchStats& stats);
struct BatchNormGrads {
  Tensor dx, dgamma, dbeta;
};
// dy is the gradient of the activated output.
BatchNormGrads batchnorm_backward(const Tensor& x, const Tensor& gamma, const BatchStats& stats,
                                  const Tensor& dy);

}  // namespace ops
}  // namespace relpos
