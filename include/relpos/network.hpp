// relpos: a network built from a ModelConfig: stem -> stages of residual blocks -> head, with
// timm's byobnet tensor names. Inference (infer, infer_features) is const and safe to call from
// many threads at once; training (forward, backward) is for one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "relpos/attention_maps.hpp"
#include "relpos/model_config.hpp"
#include "relpos/tensor.hpp"

namespace relpos {

// A parameter or buffer of the network under its timm name.
struct ParamRef {
  std::string name;  // e.g. "stages.0.0.conv1_1x1.conv.weight"
  Tensor* value = nullptr;
  Tensor* grad = nullptr;  // nullptr for buffers (batch-norm running statistics)
  bool no_weight_decay = false;  // biases, norm parameters, position tables
  bool int8 = false;  // an int8 layer's weights: integer values in [-127, 127], stored as int8
};

// A layer that runs in int8 (docs/int8.md) and how its input is quantized:
// q = saturate(round(x / input_scale)) in s8 when input_signed, else in u8.
struct Int8Layer {
  std::string name;  // "stages.0.0.conv1_1x1", "stages.3.0.self_attn.qkv"
  float input_scale = 1.0f;
  bool input_signed = false;
};

// One row of `relpos info`: a layer, its output shape, parameters and multiply-adds.
struct LayerRow {
  std::string name;
  std::string kind;
  Shape out_shape;
  std::int64_t params = 0;
  std::int64_t macs = 0;
};

class Network {
 public:
  // Builds the layers with timm's initialisation drawn from `seed` (or, with initialize false,
  // leaves the weights at zero for a loader to fill in).
  explicit Network(const ModelConfig& config, std::uint32_t seed = 0, bool initialize = true);
  ~Network();
  Network(Network&&) noexcept;
  Network& operator=(Network&&) noexcept;

  const ModelConfig& config() const;
  // Every parameter and buffer, in timm's state_dict order.
  const std::vector<ParamRef>& params() const;
  const ParamRef* find(const std::string& name) const;
  std::int64_t num_params() const;  // trainable values (buffers excluded)

  Device device() const;
  void to(Device device);
  // Must be called after the weights changed (loading, training steps) and before infer():
  // folds batch norms into convolutions and drops cached kernels. Not thread-safe.
  void prepare_inference();

  // x: (N, in_chans, H, W) on the network's device. Returns logits (N, num_classes).
  Tensor infer(const Tensor& x) const;
  // The stem's last feature map before pooling, then each stage's output (like timm's
  // features_only), each (N, C, h, w) channels-last.
  std::vector<Tensor> infer_features(const Tensor& x) const;
  // infer() that also returns what every attention layer computed, in network order
  // (relpos/attention_maps.hpp); the logits go to *logits when given. Same path, same numbers.
  std::vector<AttentionMaps> infer_attention(const Tensor& x, Tensor* logits = nullptr) const;

  // Training mode (batch statistics, running stats updated); forward saves what backward needs.
  Tensor forward(const Tensor& x);
  // Sets every parameter's gradient from d loss / d logits. With `ready`, calls ready(first) as soon
  // as the gradients of params()[first..] are final (after the head, each block and the stem,
  // `first` falling to 0): data-parallel training sends them while the backward goes on.
  void backward(const Tensor& dlogits, const std::function<void(std::size_t first)>& ready = {});
  void release_saved();

  // Each layer's output shape, parameters and multiply-adds for a batch at height x width input
  // (0: the config's input_size; a model of fixed input size takes only that).
  std::vector<LayerRow> summarize(int batch = 1, int height = 0, int width = 0) const;

  // int8 inference (docs/int8.md). The layers that can run in int8 (convolutions and attention
  // qkv projections), in network order.
  std::vector<std::string> quantizable_layers() const;
  // Runs exactly the named layers in int8, each quantized from its current float weights (batch
  // norm folded, weights per output channel), and every other layer in float32. params() changes
  // to match: an int8 layer registers its int8 weights, scales, bias and input scale instead of
  // its float weights and batch norm. Throws naming a layer that is not quantizable.
  void set_int8_layers(const std::vector<Int8Layer>& layers);
  std::vector<Int8Layer> int8_layers() const;  // empty for a float model

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;  // null in a moved-from network
  Impl& impl() const;           // throws relpos::Error for a moved-from network
};

}  // namespace relpos
