// relpos: the tensor operations the layers are built from. Each function dispatches on the
// device of its inputs to the CPU backend (oneDNN) or the CUDA backend (cuDNN, cuBLAS and our
// kernels); both backends implement exactly the same contract and are tested against the same
// references. 4-D activations are taken in either layout and returned ChannelsLast.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "relpos/runtime.hpp"
#include "relpos/tensor.hpp"

namespace relpos {

enum class Act : std::uint8_t { None, ReLU, SiLU };
Act parse_act(const std::string& s);  // "relu" | "silu" | "none" | "identity"
std::string to_string(Act a);

namespace ops {

struct ConvSpec {
  int stride = 1;
  int pad = 0;
  int groups = 1;
};

// Applied to a convolution's output: out = act(conv(x) + bias + residual).
struct Epilogue {
  const Tensor* residual = nullptr;
  Act act = Act::None;
  // The caller no longer needs the residual: the output may be written over it (a channels-last
  // residual on the CPU then saves copying it into a new output tensor).
  bool overwrite_residual = false;
};

// x (N, C, H, W), w (O, C/groups, kh, kw) Contiguous, bias (O) or nullptr.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvSpec& spec,
              const Epilogue& epilogue = {});
struct ConvGrads {
  Tensor dx;  // undefined when not asked for
  Tensor dw;
};
ConvGrads conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvSpec& spec,
                          bool need_dx);

// Batch norm over (N, H, W) per channel.
Tensor batchnorm_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                       const Tensor& var, float eps, Act act);
// Batch norm with batch statistics (training) and its backward are in the library's internals
// (src/core/ops_internal.hpp): what they save between the two differs by backend.

Tensor activation(const Tensor& x, Act act);
// x is the activation's input.
Tensor activation_backward(const Tensor& x, const Tensor& dy, Act act);
// act(a + b)
Tensor add(const Tensor& a, const Tensor& b, Act act = Act::None);
// a += b (same shape and layout)
void add_inplace(Tensor& a, const Tensor& b);
// The channels of a and then those of b, per pixel: (N, Ca + Cb, H, W), channels-last, from a
// (N, Ca, H, W) and b (N, Cb, Hb, Wb) read at every b_stride-th row and column from the first (the
// pixels a 1x1 convolution of that stride reads), so (Hb - 1) / b_stride + 1 == H, likewise W.
// A residual block's conv3 and projection shortcut run as one convolution over it
// (src/layers/residual_block.cpp).
Tensor concat_channels(const Tensor& a, const Tensor& b, int b_stride = 1);

enum class PoolKind : std::uint8_t { Max, Avg };
struct PoolSpec {
  PoolKind kind = PoolKind::Max;
  int kernel = 2;
  int stride = 2;
  int pad = 0;  // max pool pads with -inf; avg pool here never pads (count_include_pad moot)
};
Tensor pool2d(const Tensor& x, const PoolSpec& spec);
Tensor pool2d_backward(const Tensor& x, const Tensor& dy, const PoolSpec& spec);
// (N, C, H, W) -> (N, C)
Tensor global_avg_pool(const Tensor& x);
Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape);

// x (N, in) @ w (out, in)^T + b (out)
Tensor linear(const Tensor& x, const Tensor& w, const Tensor* b);
struct LinearGrads {
  Tensor dx, dw, db;
};
LinearGrads linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy);

// Row-wise softmax of a 2-D tensor.
Tensor softmax(const Tensor& x);
// Mean cross-entropy of logits (N, K) against integer labels; label smoothing eps spreads eps
// uniformly over the K classes (as torch.nn.CrossEntropyLoss(label_smoothing=eps)).
struct CrossEntropy {
  float loss = 0.0f;
  Tensor dlogits;  // d loss / d logits
};
CrossEntropy cross_entropy(const Tensor& logits, const std::vector<int>& labels, float smoothing = 0.0f);

// Plain row-major matmul of 2-D tensors: a (M, K) @ b (K, N) with optional transposes.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// Optimizer updates in place. SGD: g = grad + wd * p; buf = momentum * buf + g (buf = g on the
// first step); p -= lr * (nesterov ? g + momentum * buf : buf). AdamW: p -= lr * wd * p, then the
// bias-corrected Adam step with moments m, v at step number `step` (1-based).
void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr, float momentum, bool nesterov,
                float weight_decay, bool first_step);
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, float lr, float beta1, float beta2,
                  float eps, float weight_decay, long step);

}  // namespace ops
}  // namespace relpos
