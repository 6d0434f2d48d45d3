// Internal: the CPU backend (oneDNN, OpenMP and our attention kernels).
#pragma once

#include "relpos/attention_ops.hpp"
#include "core/ops_internal.hpp"
#include "relpos/ops.hpp"

namespace relpos::cpu {
#include "core/backend_ops.inc"
// int8 inference (CPU only, no CUDA twin yet): src/cpu/conv2d_int8.cpp
ops::QuantizedTensor quantize_activation(const Tensor& x, float scale, bool is_signed);
Tensor conv2d_int8(const ops::QuantizedTensor& x, const ops::Int8ConvWeights& w, const ops::ConvSpec& spec,
                   const ops::Epilogue& epilogue, OpCache* cache);
ops::QuantizedTensor conv2d_int8_requantized(const ops::QuantizedTensor& x, const ops::Int8ConvWeights& w,
                                             const ops::ConvSpec& spec, Act act, float out_scale,
                                             const ops::Residual& residual, OpCache* cache);
Tensor dequantize_activation(const ops::QuantizedTensor& q);
// ops::activation_backward_sum for ReLU: (y > 0) (.) (dy_a + dy_b), in y's layout (elementwise.cpp).
Tensor relu_backward_sum(const Tensor& y, const Tensor& dy_a, const Tensor& dy_b);
// Batch norm in training (batchnorm.cpp). The statistics half: stats.mean, stats.var (biased) and
// stats.eps of x, running statistics updated with momentum.
void batchnorm_statistics(const Tensor& x, Tensor& running_mean, Tensor& running_var, float eps, float momentum,
                          ops::BatchStats& stats);
// A residual added before the activation: x as it is, or with gamma set through a batch norm of its
// own with the statistics in *stats (a projection shortcut's, folded into the sum).
struct NormedResidual {
  const Tensor* x;
  const Tensor* gamma = nullptr;
  const Tensor* beta = nullptr;
  const ops::BatchStats* stats = nullptr;
};
// The normalising half: act(batch norm with the statistics in stats.mean and stats.var [+ the
// residual]), filling the rest of stats for batchnorm_backward; with a residual, act is ReLU or none
// and the backward is that of a batch norm without activation (the caller's own undoes act). The
// synchronised batch norm (core/batchnorm_sync.cpp) normalises with it, so it rounds as one process.
Tensor batchnorm_normalize_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Act act,
                                 ops::BatchStats& stats, const NormedResidual* residual = nullptr);
// ops::batchnorm_backward_relu_sum on the CPU: the first pass reads y, dy_a and dy_b (may be
// undefined) and writes ds = (y > 0) (dy_a + dy_b) as it sums.
ops::BatchNormGrads batchnorm_backward_relu_sum(const Tensor& x, const Tensor& gamma, const ops::BatchStats& stats,
                                                const Tensor& y, const Tensor& dy_a, const Tensor& dy_b, Tensor& ds);
// ops::batchnorm_conv_backward and ops::batchnorm_relu_sum_conv_backward with the fused kernels
// (conv1x1_grad_kernels.hpp), for the convolutions conv1x1_grads_fit takes.
bool conv1x1_grads_fit(const Tensor& x, const Tensor& conv_x, const Tensor& w, const ops::ConvSpec& spec);
ops::BatchNormConvGrads batchnorm_conv1x1_backward(const Tensor& x, const Tensor& gamma, const ops::BatchStats& stats,
                                                   const Tensor& dy, const Tensor& conv_x, const Tensor& w,
                                                   const ops::ConvSpec& spec, bool need_dx);
ops::BatchNormConvGrads batchnorm_relu_sum_conv1x1_backward(const Tensor& x, const Tensor& gamma,
                                                            const ops::BatchStats& stats, const Tensor& y,
                                                            const Tensor& dy_a, const Tensor& dy_b, Tensor& ds,
                                                            const Tensor& conv_x, const Tensor& w,
                                                            const ops::ConvSpec& spec, bool need_dx);
// ops::batchnorm_train_add: both halves (residual null: batchnorm_train).
Tensor batchnorm_train_add(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                           Tensor& running_var, float eps, float momentum, const Tensor* residual, Act act,
                           ops::BatchStats& stats);
// Inference: act(local attention of the 1x1 projection w (Ct, Cin, 1, 1) of x, plus v_bias per output
// channel, 2x2 average pooled with pool2x2) with no qkv tensor in between: sasa_attention.cpp.
// cache: the calling layer's, for the projection's oneDNN plan (or null: made for this call).
Tensor sasa_projected_attention(const Tensor& x, const Tensor& w, const Tensor* v_bias, const Tensor& r_row,
                                const Tensor& r_col, const SasaSpec& spec, Act act, bool pool2x2, OpCache* cache);
ops::QuantizedTensor max_pool2d_quantized(const ops::QuantizedTensor& x, const ops::PoolSpec& spec);
}  // namespace relpos::cpu
