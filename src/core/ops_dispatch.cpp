// Routes each op to the backend that holds its inputs.
#include <omp.h>

#include <atomic>
#include <initializer_list>

#include "core/op_profile.hpp"
#include "cpu/cpu_ops.hpp"
#include "relpos/error.hpp"
#ifdef RELPOS_WITH_CUDA
#include "cuda/cuda_ops.hpp"
#define RELPOS_DISPATCH(t, fn, ...)                          \
  detail::apply_thread_setting();                             \
  const detail::OpTimer relpos_op_timer_(#fn, (t).is_cuda()); \
  return (t).is_cuda() ? cuda::fn(__VA_ARGS__) : cpu::fn(__VA_ARGS__)
#else
#define RELPOS_DISPATCH(t, fn, ...)                   \
  detail::apply_thread_setting();                      \
  const detail::OpTimer relpos_op_timer_(#fn, false); \
  return cpu::fn(__VA_ARGS__)
#endif

namespace relpos {

Act parse_act(const std::string& s) {
  if (s == "relu") return Act::ReLU;
  if (s == "silu" || s == "swish") return Act::SiLU;
  if (s == "none" || s == "identity" || s.empty()) return Act::None;
  RELPOS_FAIL("unknown activation '" << s << "' (expected relu, silu or none)");
}

std::string to_string(Act a) {
  switch (a) {
    case Act::ReLU: return "relu";
    case Act::SiLU: return "silu";
    case Act::None: return "none";
  }
  return "?";
}

namespace {
std::atomic<bool> g_allow_tf32{false};
std::atomic<int> g_num_threads{0};
}  // namespace

void set_num_threads(int n) {
  RELPOS_CHECK(n >= 0 && n <= 1024, "set_num_threads: " << n << " threads (0 to 1024)");
  g_num_threads = n;
  detail::apply_thread_setting();
}
int num_threads() { return g_num_threads; }

void detail::apply_thread_setting() {
  const int n = g_num_threads;
  if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
}
void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

std::shared_ptr<void> OpCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = plans_.find(key);
  return it == plans_.end() ? nullptr : it->second;
}

void OpCache::put(const std::string& key, std::shared_ptr<void> plan) {
  std::lock_guard<std::mutex> lock(mutex_);
  plans_.emplace(key, std::move(plan));
}

void OpCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  plans_.clear();
}

void OpCache::use_weights(const void* data, std::int64_t numel) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (data == weights_ && numel == weights_numel_) return;
  plans_.clear();
  weights_ = data;
  weights_numel_ = numel;
}

namespace ops {
namespace {
void same_device(const char* op, const Tensor& x, std::initializer_list<const Tensor*> others) {
  for (const Tensor* t : others)
    RELPOS_CHECK(t == nullptr || !t->defined() || t->device() == x.device(),
                 op << ": inputs on different devices (" << to_string(x.device()) << " and "
                    << to_string(t->device()) << ")");
}
}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvSpec& spec,
              const Epilogue& epilogue, OpCache* cache) {
  same_device("conv2d", x, {&w, bias, epilogue.residual});
  if (cache) cache->use_weights(w.data(), w.numel());
  RELPOS_DISPATCH(x, conv2d, x, w, bias, spec, epilogue, cache);
}
ConvGrads conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvSpec& spec, bool need_dx) {
  same_device("conv2d backward", x, {&w, &dy});
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
  RELPOS_DISPATCH(x, batchnorm_train, x, gamma, beta, running_mean, running_var, eps, momentum, act, stats);
}
BatchNormGrads batchnorm_backward(const Tensor& x, const Tensor& gamma, const BatchStats& stats, const Tensor& dy) {
  same_device("batch norm backward", x, {&gamma, &dy});
  RELPOS_DISPATCH(x, batchnorm_backward, x, gamma, stats, dy);
}
Tensor activation(const Tensor& x, Act act) { RELPOS_DISPATCH(x, activation, x, act); }
Tensor activation_backward(const Tensor& x, const Tensor& dy, Act act) {
  same_device("activation backward", x, {&dy});
  RELPOS_DISPATCH(x, activation_backward, x, dy, act);
}
Tensor add(const Tensor& a, const Tensor& b, Act act) {
  same_device("add", a, {&b});
  RELPOS_DISPATCH(a, add, a, b, act);
}
void add_inplace(Tensor& a, const Tensor& b) {
  same_device("add", a, {&b});
  RELPOS_DISPATCH(a, add_inplace, a, b);
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
Tensor bot_attention(const Tensor& qkv, const Tensor& pos_h, const Tensor& pos_w, const BotAttnSpec& spec,
                     Tensor* probs) {
  RELPOS_DISPATCH(qkv, bot_attention, qkv, pos_h, pos_w, spec, probs);
}
BotAttnGrads bot_attention_backward(const Tensor& qkv, const Tensor& pos_h, const Tensor& pos_w,
                                    const BotAttnSpec& spec, const Tensor& probs, const Tensor& dout) {
  same_device("attention backward", qkv, {&probs, &dout});
  RELPOS_DISPATCH(qkv, bot_attention_backward, qkv, pos_h, pos_w, spec, probs, dout);
}
Tensor rel_pos_logits(const Tensor& q, const Tensor& table_h, const Tensor& table_w, int height, int width,
                      int clip) {
  same_device("rel_pos_logits", q, {&table_h, &table_w});
  RELPOS_DISPATCH(q, rel_pos_logits, q, table_h, table_w, height, width, clip);
}
Tensor sasa_attention(const Tensor& qkv, const Tensor& r_row, const Tensor& r_col, const SasaSpec& spec,
                      Tensor* probs) {
  RELPOS_DISPATCH(qkv, sasa_attention, qkv, r_row, r_col, spec, probs);
}
SasaGrads sasa_attention_backward(const Tensor& qkv, const Tensor& r_row, const Tensor& r_col, const SasaSpec& spec,
                                  const Tensor& probs, const Tensor& dout) {
  same_device("local attention backward", qkv, {&probs, &dout});
  RELPOS_DISPATCH(qkv, sasa_attention_backward, qkv, r_row, r_col, spec, probs, dout);
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
