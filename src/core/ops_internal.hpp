// Internal: the ops' forms that take library internals (plan caches, what batch norm saves for
// its backward). Implemented with the public ops in src/core/ops.cpp.
#pragma once

#include <limits>

#include "core/op_cache.hpp"
#include "core/runtime_internal.hpp"
#include "relpos/attention_ops.hpp"
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


// act'(y) (.) (dy_a + dy_b): an activation's backward whose output gradient comes as two terms not
// yet added (a residual block's output feeds both the next block's body and its shortcut); y is
// what activation_backward takes (for ReLU the output). dy_b may be undefined. For ReLU on the CPU
// one pass over the four tensors instead of an add and a backward pass (two more).
Tensor activation_backward_sum(const Tensor& y, const Tensor& dy_a, const Tensor& dy_b, Act act);

// Inference on the CPU: act(local attention of the 1x1 projection w (Ct, Cin, 1, 1) of x, plus
// v_bias (Co) per output channel), as sasa_attention(conv2d(x, w, bias with v_bias on the value
// rows)) but without the qkv tensor: the projection writes the kernels' planes directly. With
// pool2x2 (an even map) act(the 2x2 average pool of that), written as the rows are done. Only for
// finite inputs is it the same to rounding (a window column off the map reads a neighbouring row
// or plane, with probability 0: an inf or NaN value there would show up as NaN). `cache`: the
// calling layer's, for the projection's oneDNN plan where it uses one (or null: made per call).
Tensor sasa_projected_attention(const Tensor& x, const Tensor& w, const Tensor* v_bias, const Tensor& r_row,
                                const Tensor& r_col, const SasaSpec& spec, Act act, bool pool2x2 = false,
                                OpCache* cache = nullptr);
// ops::conv2d with the calling layer's plan cache.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvSpec& spec, const Epilogue& epilogue,
              OpCache* cache);

// act(batch norm with batch statistics); updates running_mean and running_var in place with
// `momentum` (running_var takes the unbiased batch variance). ReLU runs fused on the CPU.
Tensor batchnorm_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, float eps, float momentum, Act act, BatchStats& stats);
// act(batch norm with batch statistics + residual), act ReLU or none: batchnorm_train with no
// activation, then add(y, residual, act); on the CPU in one pass over the output. stats are those of
// a batch norm without activation: the caller's backward undoes act.
Tensor batchnorm_train_add(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                           Tensor& running_var, float eps, float momentum, const Tensor& residual, Act act,
                           BatchStats& stats);
// act(bn(x) + bn_r(r)), both with batch statistics, act ReLU or none: a projection shortcut's batch
// norm folded into a residual block's sum, its output never written (on the CPU; elsewhere the two
// ops and an add). stats and r_stats are those of two batch norms without activation.
Tensor batchnorm_train_add_normed(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                                  Tensor& running_var, BatchStats& stats, const Tensor& r, const Tensor& r_gamma,
                                  const Tensor& r_beta, Tensor& r_running_mean, Tensor& r_running_var,
                                  BatchStats& r_stats, float eps, float momentum, Act act);
struct BatchNormGrads {
  Tensor dx, dgamma, dbeta;
};
// dy is the gradient of the activated output.
BatchNormGrads batchnorm_backward(const Tensor& x, const Tensor& gamma, const BatchStats& stats,
                                  const Tensor& dy);
// The backward of relu(bn(x) + residual) = y (batchnorm_train_add with ReLU) whose gradient comes
// as two terms dy_a + dy_b (dy_b may be undefined): ds = activation_backward_sum(y, dy_a, dy_b,
// ReLU), the gradient of the sum and so of the residual, and the batch norm's gradients from it. On
// the CPU the batch norm's first pass reads y, dy_a and dy_b instead of a ds written before.
BatchNormGrads batchnorm_backward_relu_sum(const Tensor& x, const Tensor& gamma, const BatchStats& stats,
                                           const Tensor& y, const Tensor& dy_a, const Tensor& dy_b, Tensor& ds);

// The backward of a convolution followed by a batch norm, x = conv(conv_x, w) and bn(x) with the
// statistics in stats: the batch norm's dgamma and dbeta, the convolution's dw and (with need_dx)
// dx. Where the CPU's fused kernels take the convolution (cpu::conv1x1_grads_fit: 1x1, stride 1 or
// 2 without padding, channels in multiples of 16, AVX-512) the batch norm's input gradient is made
// block by block and handed to the convolution's two products while it is in the caches, never
// written whole; elsewhere batchnorm_backward and conv2d_backward run in turn.
struct BatchNormConvGrads {
  Tensor dgamma, dbeta, dw, dx;
};
BatchNormConvGrads batchnorm_conv_backward(const Tensor& x, const Tensor& gamma, const BatchStats& stats,
                                           const Tensor& dy, const Tensor& conv_x, const Tensor& w,
                                           const ConvSpec& spec, bool need_dx);
// The same after batchnorm_train_add with ReLU: the batch norm's part as batchnorm_backward_relu_sum
// (ds is written).
BatchNormConvGrads batchnorm_relu_sum_conv_backward(const Tensor& x, const Tensor& gamma, const BatchStats& stats,
                                                    const Tensor& y, const Tensor& dy_a, const Tensor& dy_b,
                                                    Tensor& ds, const Tensor& conv_x, const Tensor& w,
                                                    const ConvSpec& spec, bool need_dx);

// An int8 convolution's weights (docs/int8.md): integers in [-127, 127] held in float32 storage,
// a float scale per output channel, the float bias (batch norm folded in), and the static scale
// the input is quantized with: q = saturate(round(x / input_scale)) in u8 (an input that is never
// negative, after a ReLU) or s8.
struct Int8ConvWeights {
  const Tensor* weight = nullptr;  // (O, C/groups, kh, kw) Contiguous, integer values
  const Tensor* scale = nullptr;   // (O)
  const Tensor* bias = nullptr;    // (O) or nullptr
  float input_scale = 1.0f;
  bool input_signed = false;
};
// A scale an int8 layer can work with: a positive normal float (a subnormal one's inverse is
// infinite), below 1e30. NaN is not.
inline bool usable_int8_scale(float s) { return s >= std::numeric_limits<float>::min() && s < 1e30f; }

// An activation quantized for an int8 layer: u8 (or s8) values stored N, H, W, C, x = q * scale.
// It passes between two int8 layers without a float32 copy (its bytes live in a float32 Tensor's
// storage, so the caching allocator serves it).
struct QuantizedTensor {
  Tensor storage;
  Shape shape;  // (N, C, H, W)
  float scale = 1.0f;
  bool is_signed = false;
  // Room for `shape` (uninitialised) on the CPU.
  static QuantizedTensor empty(const Shape& shape, float scale, bool is_signed);
  bool defined() const { return storage.defined(); }
  const void* data() const { return storage.data(); }
  void* data() { return storage.data(); }
};
// q = saturate(round(x / scale)) in u8, or s8 when is_signed; x (N, C, H, W) on the CPU.
QuantizedTensor quantize_activation(const Tensor& x, float scale, bool is_signed);

// act(conv(dequantized) + bias + residual) in float32 out; the CPU only (oneDNN int8 kernels:
// VNNI on AVX-512 and AMX where the CPU has them). x is quantized with w's input scale first.
Tensor conv2d_int8(const Tensor& x, const Int8ConvWeights& w, const ConvSpec& spec, const Epilogue& epilogue,
                   OpCache* cache);
// The same from an input already quantized with w's input scale and type.
Tensor conv2d_int8(const QuantizedTensor& x, const Int8ConvWeights& w, const ConvSpec& spec,
                   const Epilogue& epilogue, OpCache* cache);
// What a block's last convolution adds before its activation when it writes u8 (docs/int8.md):
// nothing, the block's u8 input in its own scale (identity shortcut), or a float32 tensor (a
// projection shortcut's output); each of the output's shape.
struct Residual {
  const QuantizedTensor* u8 = nullptr;
  const Tensor* f32 = nullptr;
};
// act(conv + bias [+ residual]) written straight to u8 with out_scale (the next int8 layer's input
// scale); act must be ReLU (the output is never negative).
QuantizedTensor conv2d_int8_requantized(const QuantizedTensor& x, const Int8ConvWeights& w, const ConvSpec& spec,
                                        Act act, float out_scale, const Residual& residual, OpCache* cache);
// x = q * scale in float32, channels-last.
Tensor dequantize_activation(const QuantizedTensor& q);
// Max pooling on quantized values (it commutes with the monotone quantization, so it is exact).
QuantizedTensor max_pool2d_quantized(const QuantizedTensor& x, const PoolSpec& spec);

}  // namespace ops
}  // namespace relpos
