// The ops of relpos/ops.hpp and core/ops_internal.hpp: each routed to the backend that holds its
// inputs.
#include <initializer_list>

#include "core/batchnorm_sync.hpp"
#include "core/dispatch.hpp"
#include "io/json_reader.hpp"

namespace relpos {

namespace {
constexpr detail::EnumName<Act> kActs[] = {{Act::ReLU, "relu"}, {Act::SiLU, "silu"},     {Act::None, "none"},
                                           {Act::SiLU, "swish"}, {Act::None, "identity"}, {Act::None, ""}};
}  // namespace

Act parse_act(const std::string& s) { return detail::parse_enum(s, kActs, "activation"); }
std::string to_string(Act a) { return detail::enum_name(a, kActs); }

namespace ops {

namespace {
// What both backends take of a convolution's arguments, checked once for both (the CUDA backend
// divided by a zero stride or group count, and read past a short bias, residual or gradient).
// Returns the output's shape.
Shape check_conv(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvSpec& spec) {
  RELPOS_CHECK(x.ndim() == 4, "conv2d: input must be (N, C, H, W), got " << x.describe());
  RELPOS_CHECK(w.ndim() == 4 && w.layout() == Layout::Contiguous,
               "conv2d: weight must be a contiguous (O, C/groups, kh, kw) tensor, got " << w.describe());
  RELPOS_CHECK(spec.groups >= 1 && spec.stride >= 1 && spec.pad >= 0,
               "conv2d: stride " << spec.stride << ", padding " << spec.pad << " and " << spec.groups
                                 << " groups: the stride and groups must be at least 1, the padding not negative");
  RELPOS_CHECK(x.dim(1) % spec.groups == 0 && w.dim(0) % spec.groups == 0 && w.dim(1) * spec.groups == x.dim(1),
               "conv2d: weight " << to_string(w.shape()) << " does not fit input " << to_string(x.shape()) << " with "
                                 << spec.groups << " groups");
  RELPOS_CHECK(!bias || (bias->ndim() == 1 && bias->dim(0) == w.dim(0)),
               "conv2d: bias " << bias->describe() << " must have one value per output channel (" << w.dim(0) << ")");
  const std::int64_t oh = (x.dim(2) + 2 * spec.pad - w.dim(2)) / spec.stride + 1;
  const std::int64_t ow = (x.dim(3) + 2 * spec.pad - w.dim(3)) / spec.stride + 1;
  RELPOS_CHECK(x.dim(2) + 2 * spec.pad >= w.dim(2) && x.dim(3) + 2 * spec.pad >= w.dim(3),
               "conv2d: input " << to_string(x.shape()) << " is smaller than the " << w.dim(2) << "x" << w.dim(3)
                                << " kernel");
  return Shape{x.dim(0), w.dim(0), oh, ow};
}
}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvSpec& spec,
              const Epilogue& epilogue) {
  return conv2d(x, w, bias, spec, epilogue, nullptr);
}
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvSpec& spec,
              const Epilogue& epilogue, OpCache* cache) {
  same_device("conv2d", x, {&w, bias, epilogue.residual});
  const Shape out = check_conv(x, w, bias, spec);
  RELPOS_CHECK(!epilogue.residual || epilogue.residual->shape() == out,
               "conv2d: residual " << epilogue.residual->describe() << " does not match the output " << to_string(out));
  if (cache) cache->use_weights(w.data(), w.numel());
  RELPOS_DISPATCH(x, conv2d, x, w, bias, spec, epilogue, cache);
}
namespace {
void check_int8(const char* op, const Tensor& x, const Int8ConvWeights& w, const Epilogue& epilogue, OpCache* cache) {
  RELPOS_CHECK(w.weight && w.scale, op << ": weights and scales are required");
  same_device(op, x, {w.weight, w.scale, w.bias, epilogue.residual});
  RELPOS_CHECK(x.is_cpu(), "int8 layers run on the CPU only (the input is on " << to_string(x.device()) << ")");
  if (cache) cache->use_weights(w.weight->data(), w.weight->numel());
}
}  // namespace

QuantizedTensor quantize_activation(const Tensor& x, float scale, bool is_signed) {
  RELPOS_CHECK(x.is_cpu(), "int8 layers run on the CPU only (the input is on " << to_string(x.device()) << ")");
  const detail::ThreadScope relpos_threads_;
  const detail::OpTimer timer("quantize_activation", false);
  return cpu::quantize_activation(x, scale, is_signed);
}
Tensor conv2d_int8(const Tensor& x, const Int8ConvWeights& w, const ConvSpec& spec, const Epilogue& epilogue,
                   OpCache* cache) {
  return conv2d_int8(quantize_activation(x, w.input_scale, w.input_signed), w, spec, epilogue, cache);
}
Tensor conv2d_int8(const QuantizedTensor& x, const Int8ConvWeights& w, const ConvSpec& spec, const Epilogue& epilogue,
                   OpCache* cache) {
  check_int8("conv2d_int8", x.storage, w, epilogue, cache);
  const detail::ThreadScope relpos_threads_;
  const detail::OpTimer timer("conv2d_int8", false);
  return cpu::conv2d_int8(x, w, spec, epilogue, cache);
}
QuantizedTensor conv2d_int8_requantized(const QuantizedTensor& x, const Int8ConvWeights& w, const ConvSpec& spec,
                                        Act act, float out_scale, const Residual& residual, OpCache* cache) {
  check_int8("conv2d_int8", x.storage, w, {}, cache);
  const detail::ThreadScope relpos_threads_;
  const detail::OpTimer timer("conv2d_int8", false);
  return cpu::conv2d_int8_requantized(x, w, spec, act, out_scale, residual, cache);
}
Tensor dequantize_activation(const QuantizedTensor& q) {
  RELPOS_CHECK(q.storage.is_cpu(), "int8 layers run on the CPU only");
  const detail::ThreadScope relpos_threads_;
  const detail::OpTimer timer("dequantize_activation", false);
  return cpu::dequantize_activation(q);
}
QuantizedTensor max_pool2d_quantized(const QuantizedTensor& x, const PoolSpec& spec) {
  RELPOS_CHECK(x.storage.is_cpu(), "int8 layers run on the CPU only");
  const detail::ThreadScope relpos_threads_;
  const detail::OpTimer timer("pool2d", false);
  return cpu::max_pool2d_quantized(x, spec);
}
ConvGrads conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvSpec& spec, bool need_dx) {
  same_device("conv2d backward", x, {&w, &dy});
  const Shape out = check_conv(x, w, nullptr, spec);
  RELPOS_CHECK(dy.shape() == out, "conv2d backward: gradient " << dy.describe() << " does not match the output "
                                                               << to_string(out));
  RELPOS_DISPATCH(x, conv2d_backward, x, w, dy, spec, need_dx);
}
Tensor batchnorm_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                       const Tensor& var, float eps, Act act) {
  same_device("batch norm", x, {&gamma, &beta, &mean, &var});
  RELPOS_DISPATCH(x, batchnorm_infer, x, gamma, beta, mean, var, eps, act);
}
Tensor batchnorm_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, float eps, float momentum, Act act, BatchStats& stats) {
  same_device("batch norm", x, {&gamma, &beta, &running_mean, &running_var});
  if (detail::BatchNormSync* sync = detail::batchnorm_sync())
    return detail::synced_batchnorm_train(*sync, x, gamma, beta, running_mean, running_var, eps, momentum, act, stats);
  RELPOS_DISPATCH(x, batchnorm_train, x, gamma, beta, running_mean, running_var, eps, momentum, act, stats);
}
Tensor batchnorm_train_add(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                           Tensor& running_var, float eps, float momentum, const Tensor& residual, Act act,
                           BatchStats& stats) {
  RELPOS_CHECK(act == Act::None || act == Act::ReLU, "internal: batch norm with a residual takes ReLU or none");
  if (x.is_cpu() && !detail::batchnorm_sync()) {
    same_device("batch norm", x, {&gamma, &beta, &running_mean, &running_var, &residual});
    const detail::ThreadScope relpos_threads_;
    const detail::OpTimer timer("batchnorm_train_add", false);
    return cpu::batchnorm_train_add(x, gamma, beta, running_mean, running_var, eps, momentum, &residual, act, stats);
  }
  return add(batchnorm_train(x, gamma, beta, running_mean, running_var, eps, momentum, Act::None, stats), residual, act);
}
Tensor batchnorm_train_add_normed(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                                  Tensor& running_var, BatchStats& stats, const Tensor& r, const Tensor& r_gamma,
                                  const Tensor& r_beta, Tensor& r_running_mean, Tensor& r_running_var,
                                  BatchStats& r_stats, float eps, float momentum, Act act) {
  RELPOS_CHECK(act == Act::None || act == Act::ReLU, "internal: batch norm with a residual takes ReLU or none");
  if (x.is_cpu() && !detail::batchnorm_sync()) {
    same_device("batch norm", x, {&gamma, &beta, &running_mean, &running_var, &r, &r_gamma, &r_beta, &r_running_mean,
                                  &r_running_var});
    const detail::ThreadScope relpos_threads_;
    const detail::OpTimer timer("batchnorm_train_add", false);
    cpu::batchnorm_statistics(r, r_running_mean, r_running_var, eps, momentum, r_stats);
    cpu::batchnorm_statistics(x, running_mean, running_var, eps, momentum, stats);
    const cpu::NormedResidual normed{&r, &r_gamma, &r_beta, &r_stats};
    return cpu::batchnorm_normalize_train(x, gamma, beta, act, stats, &normed);
  }
  const Tensor sc = batchnorm_train(r, r_gamma, r_beta, r_running_mean, r_running_var, eps, momentum, Act::None, r_stats);
  return batchnorm_train_add(x, gamma, beta, running_mean, running_var, eps, momentum, sc, act, stats);
}
BatchNormGrads batchnorm_backward(const Tensor& x, const Tensor& gamma, const BatchStats& stats, const Tensor& dy) {
  same_device("batch norm backward", x, {&gamma, &dy});
  if (stats.global_count > 0) {
    detail::BatchNormSync* sync = detail::batchnorm_sync();
    RELPOS_CHECK(sync, "batch norm backward: the forward was synchronised across processes, the backward is not");
    return detail::synced_batchnorm_backward(*sync, x, gamma, stats, dy);
  }
  RELPOS_DISPATCH(x, batchnorm_backward, x, gamma, stats, dy);
}
BatchNormGrads batchnorm_backward_relu_sum(const Tensor& x, const Tensor& gamma, const BatchStats& stats,
                                           const Tensor& y, const Tensor& dy_a, const Tensor& dy_b, Tensor& ds) {
  if (x.is_cpu() && stats.global_count == 0) {
    same_device("batch norm backward", x, {&gamma, &y, &dy_a});
    if (dy_b.defined()) same_device("batch norm backward", x, {&dy_b});
    const detail::ThreadScope relpos_threads_;
    const detail::OpTimer timer("batchnorm_backward_relu_sum", false);
    return cpu::batchnorm_backward_relu_sum(x, gamma, stats, y, dy_a, dy_b, ds);
  }
  ds = activation_backward_sum(y, dy_a, dy_b, Act::ReLU);
  return batchnorm_backward(x, gamma, stats, ds);
}
BatchNormConvGrads batchnorm_conv_backward(const Tensor& x, const Tensor& gamma, const BatchStats& stats,
                                           const Tensor& dy, const Tensor& conv_x, const Tensor& w,
                                           const ConvSpec& spec, bool need_dx) {
  if (x.is_cpu() && stats.global_count == 0 && cpu::conv1x1_grads_fit(x, conv_x, w, spec)) {
    same_device("batch norm backward", x, {&gamma, &dy, &conv_x, &w});
    const detail::ThreadScope relpos_threads_;
    const detail::OpTimer timer("batchnorm_conv1x1_backward", false);
    return cpu::batchnorm_conv1x1_backward(x, gamma, stats, dy, conv_x, w, spec, need_dx);
  }
  BatchNormGrads bn = batchnorm_backward(x, gamma, stats, dy);
  ConvGrads cg = conv2d_backward(conv_x, w, bn.dx, spec, need_dx);
  return {std::move(bn.dgamma), std::move(bn.dbeta), std::move(cg.dw), std::move(cg.dx)};
}
BatchNormConvGrads batchnorm_relu_sum_conv_backward(const Tensor& x, const Tensor& gamma, const BatchStats& stats,
                                                    const Tensor& y, const Tensor& dy_a, const Tensor& dy_b,
                                                    Tensor& ds, const Tensor& conv_x, const Tensor& w,
                                                    const ConvSpec& spec, bool need_dx) {
  if (x.is_cpu() && stats.global_count == 0 && cpu::conv1x1_grads_fit(x, conv_x, w, spec)) {
    same_device("batch norm backward", x, {&gamma, &y, &dy_a, &conv_x, &w});
    if (dy_b.defined()) same_device("batch norm backward", x, {&dy_b});
    const detail::ThreadScope relpos_threads_;
    const detail::OpTimer timer("batchnorm_relu_sum_conv1x1_backward", false);
    return cpu::batchnorm_relu_sum_conv1x1_backward(x, gamma, stats, y, dy_a, dy_b, ds, conv_x, w, spec,
                                                     need_dx);
  }
  BatchNormGrads bn = batchnorm_backward_relu_sum(x, gamma, stats, y, dy_a, dy_b, ds);
  ConvGrads cg = conv2d_backward(conv_x, w, bn.dx, spec, need_dx);
  return {std::move(bn.dgamma), std::move(bn.dbeta), std::move(cg.dw), std::move(cg.dx)};
}
Tensor activation(const Tensor& x, Act act) { RELPOS_DISPATCH(x, activation, x, act); }
Tensor activation_backward(const Tensor& x, const Tensor& dy, Act act) {
  same_device("activation backward", x, {&dy});
  RELPOS_DISPATCH(x, activation_backward, x, dy, act);
}
Tensor activation_backward_sum(const Tensor& y, const Tensor& dy_a, const Tensor& dy_b, Act act) {
  if (!dy_b.defined()) return activation_backward(y, dy_a, act);
  same_device("activation backward", y, {&dy_a, &dy_b});
  if (y.is_cpu() && act == Act::ReLU) {
    const detail::ThreadScope relpos_threads_;
    const detail::OpTimer timer("relu_backward_sum", false);
    return cpu::relu_backward_sum(y, dy_a, dy_b);
  }
  return activation_backward(y, add(dy_a, dy_b, Act::None), act);
}
Tensor add(const Tensor& a, const Tensor& b, Act act) {
  same_device("add", a, {&b});
  RELPOS_DISPATCH(a, add, a, b, act);
}
void add_inplace(Tensor& a, const Tensor& b) {
  same_device("add", a, {&b});
  RELPOS_DISPATCH(a, add_inplace, a, b);
}
Tensor concat_channels(const Tensor& a, const Tensor& b, int b_stride) {
  same_device("concat_channels", a, {&b});
  RELPOS_CHECK(a.ndim() == 4 && b.ndim() == 4 && a.dim(0) == b.dim(0),
               "concat_channels: inputs must be (N, C, H, W) with one N, got " << a.describe() << " and " << b.describe());
  RELPOS_CHECK(b_stride >= 1 && (b.dim(2) - 1) / b_stride + 1 == a.dim(2) && (b.dim(3) - 1) / b_stride + 1 == a.dim(3),
               "concat_channels: " << b.describe() << " at stride " << b_stride << " does not give the map of "
                                   << a.describe());
  RELPOS_DISPATCH(a, concat_channels, a, b, b_stride);
}
Tensor pool2d(const Tensor& x, const PoolSpec& spec) { RELPOS_DISPATCH(x, pool2d, x, spec); }
Tensor pool2d_backward(const Tensor& x, const Tensor& dy, const PoolSpec& spec) {
  same_device("pool backward", x, {&dy});
  RELPOS_DISPATCH(x, pool2d_backward, x, dy, spec);
}
Tensor global_avg_pool(const Tensor& x) { RELPOS_DISPATCH(x, global_avg_pool, x); }
Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape) {
  RELPOS_DISPATCH(dy, global_avg_pool_backward, dy, x_shape);
}
Tensor linear(const Tensor& x, const Tensor& w, const Tensor* b) {
  same_device("linear", x, {&w, b});
  RELPOS_DISPATCH(x, linear, x, w, b);
}
LinearGrads linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy) {
  same_device("linear backward", x, {&w, &dy});
  RELPOS_DISPATCH(x, linear_backward, x, w, dy);
}
Tensor softmax(const Tensor& x) { RELPOS_DISPATCH(x, softmax, x); }
CrossEntropy cross_entropy(const Tensor& logits, const std::vector<int>& labels, float smoothing) {
  RELPOS_DISPATCH(logits, cross_entropy, logits, labels, smoothing);
}
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  same_device("matmul", a, {&b});
  RELPOS_DISPATCH(a, matmul, a, b, trans_a, trans_b);
}
void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr, float momentum, bool nesterov,
                float weight_decay, bool first_step) {
  same_device("sgd", param, {&grad, &momentum_buf});
  RELPOS_DISPATCH(param, sgd_update, param, grad, momentum_buf, lr, momentum, nesterov, weight_decay, first_step);
}
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, float lr, float beta1, float beta2,
                  float eps, float weight_decay, long step) {
  same_device("adamw", param, {&grad, &m, &v});
  RELPOS_DISPATCH(param, adamw_update, param, grad, m, v, lr, beta1, beta2, eps, weight_decay, step);
}

}  // namespace ops
}  // namespace relpos
