// Convolution on the GPU through cuDNN. Activations are NHWC; weights are kept (transposed
// once per plan) in cuDNN's NHWC filter layout (KRSC). With a ReLU epilogue, bias, residual add
// and activation run fused in cudnnConvolutionBiasActivationForward.
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "core/device_memory.hpp"
#include "cuda/cuda_common.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/elementwise.cuh"

namespace relpos::cuda {

namespace {

struct Geometry {
  int n, c, h, w, o, kh, kw, oh, ow, groups, stride, pad;
};

// (the arguments were checked for both backends before the op reached this one: src/core/ops.cpp)
Geometry geometry(const Tensor& x, const Tensor& w, const ops::ConvSpec& s) {
  Geometry g{};
  g.n = static_cast<int>(x.dim(0)), g.c = static_cast<int>(x.dim(1)), g.h = static_cast<int>(x.dim(2)),
  g.w = static_cast<int>(x.dim(3));
  g.o = static_cast<int>(w.dim(0)), g.kh = static_cast<int>(w.dim(2)), g.kw = static_cast<int>(w.dim(3));
  g.groups = s.groups, g.stride = s.stride, g.pad = s.pad;
  g.oh = (g.h + 2 * g.pad - g.kh) / g.stride + 1;
  g.ow = (g.w + 2 * g.pad - g.kw) / g.stride + 1;
  return g;
}

struct Descs {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t act = nullptr;
  explicit Descs(const Geometry& g) {
    RELPOS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    RELPOS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    RELPOS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bias));
    RELPOS_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    RELPOS_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    RELPOS_CUDNN_CHECK(cudnnCreateActivationDescriptor(&act));
    RELPOS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, g.n, g.c, g.h, g.w));
    RELPOS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, g.n, g.o, g.oh, g.ow));
    RELPOS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(bias, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, g.o, 1, 1));
    RELPOS_CUDNN_CHECK(
        cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, g.o, g.c / g.groups, g.kh, g.kw));
    RELPOS_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, g.pad, g.pad, g.stride, g.stride, 1, 1,
                                                       CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    RELPOS_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, g.groups));
    RELPOS_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
    // (NaN through the fused ReLU becomes 0 here, where the CPU keeps it: CUDNN_PROPAGATE_NAN in the
    // fused call has not been run on a GPU yet, so the tested setting stays; docs/gpu.md)
    RELPOS_CUDNN_CHECK(cudnnSetActivationDescriptor(act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    int n, c, h, ww;
    RELPOS_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &n, &c, &h, &ww));
    RELPOS_CHECK(n == g.n && c == g.o && h == g.oh && ww == g.ow, "internal: cuDNN output size disagrees");
  }
  ~Descs() {
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyTensorDescriptor(bias);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroyActivationDescriptor(act);
  }
  Descs(const Descs&) = delete;
  Descs& operator=(const Descs&) = delete;
};

// OIHW -> OHWI (cuDNN's KRSC) and back: the layout change of images, per output channel.
Tensor to_krsc(const Tensor& w) {
  Tensor out(w.shape(), Device::CUDA);
  detail::cuda_nchw_to_nhwc(w.data(), out.data(), w.dim(0), w.dim(1), w.dim(2) * w.dim(3));
  return out;
}
Tensor from_krsc(const Tensor& w) {
  Tensor out(w.shape(), Device::CUDA);
  detail::cuda_nhwc_to_nchw(w.data(), out.data(), w.dim(0), w.dim(1), w.dim(2) * w.dim(3));
  return out;
}

template <typename Perf>
const Perf& pick(const std::vector<Perf>& perfs, int returned, const char* what) {
  for (int i = 0; i < returned; ++i)
    if (perfs[static_cast<std::size_t>(i)].status == CUDNN_STATUS_SUCCESS) return perfs[static_cast<std::size_t>(i)];
  RELPOS_FAIL("cuDNN found no " << what << " algorithm for this convolution");
}

// cuDNN's algorithm heuristics cost about a millisecond a query, and training convolves with new
// weights every step (no per-layer plan can be kept): the choices are kept per geometry.
std::string geometry_key(const Geometry& g) {
  std::ostringstream os;
  os << g.n << ',' << g.c << ',' << g.h << ',' << g.w << ',' << g.o << ',' << g.kh << ',' << g.kw << ',' << g.stride << ','
     << g.pad << ',' << g.groups << ',' << tf32();
  return os.str();
}

template <typename Algo>
struct AlgoChoice {
  Algo algo{};
  std::size_t ws = 0;
};

template <typename Algo, typename Query>
AlgoChoice<Algo> choose(const Geometry& g, Query&& query) {
  static std::mutex mutex;
  static std::unordered_map<std::string, AlgoChoice<Algo>> chosen;
  const std::string key = geometry_key(g);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = chosen.find(key);
    if (it != chosen.end()) return it->second;
  }
  const AlgoChoice<Algo> c = query();
  std::lock_guard<std::mutex> lock(mutex);
  chosen.emplace(key, c);
  return c;
}

// cuDNN's heuristic query for one kind of algorithm (forward, backward filter, backward data):
// the first usable one and its workspace size, remembered per geometry.
template <typename Perf, typename Query, typename WorkspaceOf>
auto choose_algo(const Geometry& g, int count, const char* what, Query&& query, WorkspaceOf&& workspace_of) {
  using Algo = decltype(Perf{}.algo);
  return choose<Algo>(g, [&] {
    std::vector<Perf> perfs(static_cast<std::size_t>(count));
    int returned = 0;
    RELPOS_CUDNN_CHECK(query(count, &returned, perfs.data()));
    AlgoChoice<Algo> c;
    c.algo = pick(perfs, returned, what).algo;
    RELPOS_CUDNN_CHECK(workspace_of(c.algo, &c.ws));
    return c;
  });
}

struct Plan {
  explicit Plan(const Geometry& g) : d(g) {}
  Descs d;
  cudnnConvolutionFwdAlgo_t algo{};
  std::size_t ws = 0;
  Tensor w_krsc, bias;
};

std::shared_ptr<Plan> make_plan(const Geometry& g, const Tensor& w, const Tensor* bias, bool fused_relu) {
  auto plan = std::make_shared<Plan>(g);
  cudnnHandle_t h = context().cudnn;
  const Descs& d = plan->d;
  const auto choice = choose_algo<cudnnConvolutionFwdAlgoPerf_t>(
      g, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, "forward",
      [&](int n, int* returned, cudnnConvolutionFwdAlgoPerf_t* perfs) {
        return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, n, returned, perfs);
      },
      [&](cudnnConvolutionFwdAlgo_t a, std::size_t* ws) {
        return cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, a, ws);
      });
  plan->algo = choice.algo;
  plan->ws = choice.ws;
  plan->w_krsc = to_krsc(w);
  if (bias) plan->bias = bias->clone();
  else if (fused_relu) plan->bias = Tensor::zeros({g.o}, Device::CUDA);  // the fused call needs one
  return plan;
}

std::string key_of(const Geometry& g, const ops::Epilogue& ep, bool bias) {
  return "cudnn-conv:" + geometry_key(g) + ':' + std::to_string(ep.residual != nullptr) +
         std::to_string(static_cast<int>(ep.act)) + std::to_string(bias);
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& w, const Tensor* bias, const ops::ConvSpec& spec,
              const ops::Epilogue& ep, OpCache* cache) {
  require_cuda(x_in, "conv2d");
  const Tensor x = x_in.channels_last();
  const Geometry g = geometry(x, w, spec);
  const bool fused_relu = ep.act == Act::ReLU;
  std::shared_ptr<Plan> plan;
  const std::string key = key_of(g, ep, bias != nullptr);
  if (cache) plan = std::static_pointer_cast<Plan>(cache->find(key));
  if (!plan) {
    plan = make_plan(g, w, bias, fused_relu);
    // Other threads use a cached plan on their own streams: its weights must be written first.
    if (cache) {
      RELPOS_CUDA_CHECK(cudaStreamSynchronize(stream()));
      cache->put(key, plan);
    }
  }
  Tensor y({g.n, g.o, g.oh, g.ow}, Device::CUDA, Layout::ChannelsLast);
  const float one = 1.0f, zero = 0.0f;
  cudnnHandle_t h = context().cudnn;
  void* ws = plan->ws ? workspace(plan->ws) : nullptr;
  if (fused_relu) {
    // y = relu(conv(x) + residual + bias)
    const Tensor* z = ep.residual;
    const Tensor zl = z ? z->channels_last() : Tensor();
    const float alpha2 = z ? 1.0f : 0.0f;
    RELPOS_CUDNN_CHECK(cudnnConvolutionBiasActivationForward(
        h, &one, plan->d.x, x.data(), plan->d.w, plan->w_krsc.data(), plan->d.conv, plan->algo, ws, plan->ws, &alpha2,
        plan->d.y, z ? zl.data() : y.data(), plan->d.bias, plan->bias.data(), plan->d.act, plan->d.y, y.data()));
    return y;
  }
  float beta = 0.0f;
  if (ep.residual) {
    y.copy_from(*ep.residual);
    beta = 1.0f;
  }
  RELPOS_CUDNN_CHECK(cudnnConvolutionForward(h, &one, plan->d.x, x.data(), plan->d.w, plan->w_krsc.data(), plan->d.conv,
                                             plan->algo, ws, plan->ws, &beta, plan->d.y, y.data()));
  if (plan->bias.defined())
    RELPOS_CUDNN_CHECK(cudnnAddTensor(h, &one, plan->d.bias, plan->bias.data(), &one, plan->d.y, y.data()));
  if (ep.act != Act::None) apply_activation_inplace(y, ep.act);
  (void)zero;
  return y;
}

ops::ConvGrads conv2d_backward(const Tensor& x_in, const Tensor& w, const Tensor& dy_in, const ops::ConvSpec& spec,
                               bool need_dx) {
  require_cuda(x_in, "conv2d backward");
  const Tensor x = x_in.channels_last();
  const Tensor dy = dy_in.channels_last();
  const Geometry g = geometry(x, w, spec);
  RELPOS_CHECK(dy.shape() == Shape({g.n, g.o, g.oh, g.ow}), "conv2d backward: gradient " << dy.describe());
  Descs d(g);
  cudnnHandle_t h = context().cudnn;
  const float one = 1.0f, zero = 0.0f;
  ops::ConvGrads grads;
  {
    const auto choice = choose_algo<cudnnConvolutionBwdFilterAlgoPerf_t>(
        g, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, "backward-filter",
        [&](int n, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perfs) {
          return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, n, returned, perfs);
        },
        [&](cudnnConvolutionBwdFilterAlgo_t a, std::size_t* ws) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, a, ws);
        });
    const auto algo = choice.algo;
    const std::size_t ws = choice.ws;
    Tensor dw_krsc(w.shape(), Device::CUDA);
    RELPOS_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, d.x, x.data(), d.y, dy.data(), d.conv, algo,
                                                      ws ? workspace(ws) : nullptr, ws, &zero, d.w, dw_krsc.data()));
    grads.dw = from_krsc(dw_krsc);
  }
  if (need_dx) {
    const Tensor w_krsc = to_krsc(w);
    const auto choice = choose_algo<cudnnConvolutionBwdDataAlgoPerf_t>(
        g, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, "backward-data",
        [&](int n, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perfs) {
          return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, n, returned, perfs);
        },
        [&](cudnnConvolutionBwdDataAlgo_t a, std::size_t* ws) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, a, ws);
        });
    const auto algo = choice.algo;
    const std::size_t ws = choice.ws;
    grads.dx = Tensor(x.shape(), Device::CUDA, Layout::ChannelsLast);
    RELPOS_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, d.w, w_krsc.data(), d.y, dy.data(), d.conv, algo,
                                                    ws ? workspace(ws) : nullptr, ws, &zero, d.x, grads.dx.data()));
  }
  return grads;
}

}  // namespace relpos::cuda
