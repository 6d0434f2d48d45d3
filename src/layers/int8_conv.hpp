// Internal: a convolution's int8 form (docs/int8.md). Weights are per-output-channel symmetric
// int8: scale[o] = max |w[o]| / 127 and q = round(w / scale[o]), held as integer-valued float32
// tensors (the files store them as int8); the float bias carries the folded batch norm; the input
// is quantized with a static scale found by calibration, to u8 when it is never negative (after a
// ReLU) and to s8 otherwise. Tensor names under the layer's prefix ("stem.conv1.conv."):
// weight (int8), weight_scale, bias (when the layer has one), input_scale ([1]).
#pragma once

#include <string>
#include <vector>

#include "core/ops_internal.hpp"
#include "relpos/network.hpp"

namespace relpos {

// How a layer's input is quantized: q = saturate(round(x / scale)) in u8, or s8 when is_signed.
struct Int8Input {
  float scale = 1.0f;
  bool is_signed = false;
};

// Per-output-channel symmetric quantization of weights (O, ...): integer values in [-127, 127]
// and one scale per output channel (a channel of zeros gets scale 1).
struct QuantizedWeights {
  Tensor q;      // same shape as the weights, integer values
  Tensor scale;  // (O)
};
QuantizedWeights quantize_per_channel(const Tensor& w);
Tensor dequantize_per_channel(const Tensor& q, const Tensor& scale);

class Int8Conv {
 public:
  // Quantizes float weights w (O, C/groups, kh, kw) with their float bias (or nullptr).
  Int8Conv(const Tensor& w, const Tensor* bias, Int8Input input);
  void collect(const std::string& prefix, std::vector<ParamRef>& out);
  // act(conv(x) + bias + residual), float32 in and out.
  Tensor infer(const Tensor& x, const ops::ConvSpec& spec, const ops::Epilogue& ep) const;
  // x quantized as this layer takes it.
  ops::QuantizedTensor quantize(const Tensor& x) const;
  // From an input quantized as this layer takes it; float32 out.
  Tensor infer(const ops::QuantizedTensor& x, const ops::ConvSpec& spec, const ops::Epilogue& ep) const;
  // ReLU(conv(x) + bias [+ residual]) written as u8 in the input scale of `next` (which must take
  // u8); the residual (u8 in its own scale, or float32) has the output's shape.
  ops::QuantizedTensor infer_requantized(const ops::QuantizedTensor& x, const ops::ConvSpec& spec,
                                         const Int8Conv& next, const ops::Residual& residual = {}) const;
  void prepare_inference() { cache_.clear(); }
  bool input_signed() const { return signed_; }
  float input_scale() const;
  std::int64_t params() const { return weight_.numel() + bias_.numel(); }

 private:
  ops::Int8ConvWeights weights() const;
  Tensor weight_, scale_, bias_, input_scale_;
  bool signed_ = false;
  mutable OpCache cache_;
};

// During int8 inference a block's input or output (docs/int8.md): float32 (f), or u8 (q) already in
// the input scale of the int8 layer that reads it, so no float32 pass lies between two blocks.
struct BlockFlow {
  Tensor f;
  ops::QuantizedTensor q;
};

// A layer that can run in int8: a convolution with its batch norm (ConvNormAct) or an attention
// layer's qkv projection. Its name is the prefix of its tensors ("stages.0.0.conv1_1x1").
class Quantizable {
 public:
  virtual ~Quantizable() = default;
  virtual const std::string& layer_name() const = 0;
  // Runs the layer in int8, quantized from its float weights (batch norm folded), with this
  // input quantization; nullptr: float again. Changes the tensors the layer registers.
  virtual void set_int8(const Int8Input* input) = 0;
  virtual const Int8Conv* int8() const = 0;
};

}  // namespace relpos
