// Convolution on the CPU through oneDNN: activations stay channels-last (nhwc) between layers,
// weights are reordered once into the layout the chosen kernel wants and kept in the layer's
// OpCache, and bias, residual add and activation run fused as oneDNN post-ops. Spatial kernels
// (3x3 and larger) run in the activation layout oneDNN picks for them on AVX2 (nChw8c), with
// reorders in and out: its AVX2 nhwc kernels for them are slower by more than the reorders cost;
// on AVX-512 they stay nhwc (tools/bench/README.md has the measurements). 3x3 stride-1 convolutions
// with channel counts in multiples of 8 run through relpos's own Winograd kernels instead, forward
// and both gradients, on CPUs with AVX2 and FMA (conv2d_winograd.hpp).
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/environment.hpp"
#include "cpu/conv1x1_grads.hpp"
#include "cpu/conv2d_narrow_input.hpp"
#include "cpu/conv2d_winograd.hpp"
#include "cpu/cpu_features.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/dnnl_util.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

namespace winograd {

bool available() {
  static const bool on = [] {
    const char* env = detail::setting("RELPOS_WINOGRAD");
    return !(env && std::string(env) == "0") && avx2_kernels();
  }();
  return on;
}

bool suits(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kh, std::int64_t kw, int stride,
           int pad, int groups, Act act) {
  // (the transformed kernels take 4x the memory of the kernels: up to 1024 x 1024 channels)
  return kh == 3 && kw == 3 && stride == 1 && pad == 1 && groups == 1 && in_channels % 8 == 0 &&
         out_channels % 8 == 0 && in_channels * out_channels <= (1 << 20) && (act == Act::None || act == Act::ReLU);
}

bool suits_stride2(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kh, std::int64_t kw, int stride,
                   int pad, int groups, Act act) {
  // Measured on AVX2 only (tools/bench/README.md); where the AVX-512 build would run, oneDNN's
  // direct kernels stay, unmeasured against it.
  return !avx512_kernels() && stride == 2 && suits(in_channels, out_channels, kh, kw, 1, pad, groups, act);
}

bool suits_weight_grad_s2(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kh, std::int64_t kw,
                          int stride, int pad, int groups, std::int64_t pixels) {
  // Measured on AVX2 only (a 2-vCPU EPYC, 2026-11-27, 12 pairs; the whole backward, both gradients,
  // against oneDNN's direct kernels in their blocked layout, tools/bench/README.md): from 64 x 64
  // channels and 196 output pixels a batch 0.85 to 0.94x (128x64x28x28 0.888, 128x128x14x14 0.870,
  // 16x128x14x14 0.863, 8x64x28x28 0.892, 1x64x56x56 0.901, 4x128x14x14 0.918, 1x64x28x28 0.940,
  // 16x64x28x28 -> 256 0.867); on 98 and 128 pixels (one chunk of 128, so one thread) 1.36 and 1.27x;
  // with 32 channels 1.00 and 1.04x.
  return suits_stride2(in_channels, out_channels, kh, kw, stride, pad, groups, Act::None) && in_channels >= 64 &&
         out_channels >= 64 && in_channels * out_channels <= 128 * 128 && pixels >= 196;
}

bool suits_input_grad_s2(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kh, std::int64_t kw,
                         int stride, int pad, int groups, std::int64_t n, std::int64_t pixels) {
  // Measured on AVX2 only (a 2-vCPU EPYC, 2026-11-28, 12 pairs; the whole backward, both gradients,
  // the weight gradient relpos's either way, against oneDNN's direct input gradient and its reorders,
  // tools/bench/README.md): 128x64x28x28 -> 64 0.94 to 0.95, 128x128x14x14 -> 128 0.91 to 0.94,
  // 32x64x56x56 -> 128 0.944, 16x64x28x28 -> 128 0.947, 16x128x28x28 -> 64 0.984, 16x256x32x32 ->
  // 256 0.975, 8x64x56x56 -> 64 0.981; losing with 32 channels (32x32x56x56 1.051), on fewer
  // output pixels (4x64x28x28 1.016, 8x128x14x14 1.076) and on few images (the threads take whole
  // images: 1x128x14x14 2.1).
  return suits_stride2(in_channels, out_channels, kh, kw, stride, pad, groups, Act::None) && in_channels % 16 == 0 &&
         in_channels >= 64 && out_channels >= 64 && n >= 8 && pixels >= 3000;
}

bool suits_training(std::int64_t in_channels, std::int64_t out_channels, std::int64_t n, std::int64_t h,
                    std::int64_t w, bool weight_grad) {
  // Measured against oneDNN's direct kernels, 2 threads, AVX-512 (batch 128 at 28x28 and 14x14, 32
  // at 56x56 down to 16 at 7x7): the forward and input gradient win up to 128 x 128 channels (28x28
  // c32: 2.8 against 4.5 ms forward) and lose from 256 x 256 (7x7 c512: 38 against 10 ms), where
  // the weights transformed again at every call and the tiles padded over small maps cost more
  // than the products save. The weight gradient loses on small maps (28x28 c32: 6.3 against 4.3
  // ms; 14x14 c64: 5.5 against 4.1) and wins from 56x56 (c64: 16.7 against 18.5 ms).
  // With AVX2 only (a 2-vCPU EPYC, 2026-11-27), oneDNN's weight gradient is the slower one from
  // about 2048 pixels on, whatever the map: the whole backward (both gradients) 128x32x28x28 0.53x,
  // 128x64x14x14 0.63x, 128x128x7x7 0.70x, 4x32x28x28 0.57x, 16x32x14x14 0.78x, 48x128x7x7 0.97x,
  // 3x64x28x28 0.87x; 32x128x7x7 and 8x128x14x14 (1568 pixels) 1.01x, 8x32x14x14 1.10x,
  // 8x128x7x7 1.81x.
  if (in_channels * out_channels > 128 * 128) return false;
  if (!weight_grad) return true;
  return avx512_kernels() ? h * w >= 56 * 56 : n * h * w >= 2048;
}

}  // namespace winograd

namespace {

struct ConvGeometry {
  std::int64_t n, c, h, w, o, kh, kw, oh, ow;
  int groups;
};

// (the arguments were checked for both backends before the op reached this one: src/core/ops.cpp)
ConvGeometry geometry(const Tensor& x, const Tensor& w, const ops::ConvSpec& spec) {
  ConvGeometry g{};
  g.n = x.dim(0), g.c = x.dim(1), g.h = x.dim(2), g.w = x.dim(3);
  g.o = w.dim(0), g.kh = w.dim(2), g.kw = w.dim(3), g.groups = spec.groups;
  g.oh = (g.h + 2 * spec.pad - g.kh) / spec.stride + 1;
  g.ow = (g.w + 2 * spec.pad - g.kw) / spec.stride + 1;
  return g;
}

dnnl::memory::desc weights_md(const ConvGeometry& g, tag t) {
  if (g.groups == 1) return dnnl::memory::desc({g.o, g.c, g.kh, g.kw}, dt::f32, t);
  return dnnl::memory::desc({g.groups, g.o / g.groups, g.c / g.groups, g.kh, g.kw}, dt::f32,
                            t == tag::any ? tag::any : tag::goihw);
}

// oneDNN runs AVX-512 kernels on this CPU (its nhwc kernels there are as fast as its blocked ones).
bool onednn_avx512() {
  static const bool on = [] {
    const int isa = static_cast<int>(dnnl::get_effective_cpu_isa());
    return (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  }();
  return on;
}

// Whether the convolution runs on activations in the layout oneDNN picks rather than in nhwc: spatial
// kernels where oneDNN's kernels are AVX2 (nChw8c). A residual (sum post-op onto the output) keeps
// nhwc, so the output is written in place. With AVX-512 everything stays nhwc: there the blocked
// layout's reorders cost more than it saves (tools/bench/README.md).
bool kernel_layout(const ConvGeometry& g, bool residual) {
  return g.kh * g.kw > 1 && g.groups == 1 && !residual && !onednn_avx512();
}

dnnl::memory::desc act_md(const Shape& shape, bool any) {
  return any ? dnnl::memory::desc({shape[0], shape[1], shape[2], shape[3]}, dt::f32, tag::any) : md_nhwc(shape);
}

// `have` in the layout `want`: itself when they agree, else a reorder into memory held by `hold`
// (from the host tensor cache); with copy == false only the memory, for an output (write_back
// then copies it into `have`). Used for activations, gradients and the backward's weights.
dnnl::memory in_layout(const dnnl::memory& have, const dnnl::memory::desc& want, Tensor& hold, bool copy) {
  if (have.get_desc() == want) return have;
  hold = Tensor({static_cast<std::int64_t>((want.get_size() + 3) / 4)});
  dnnl::memory m(want, engine(), hold.data());
  if (copy) {
    dnnl::reorder(have, m).execute(stream(), const_cast<dnnl::memory&>(have), m);
    stream().wait();
  }
  return m;
}

// Copies `from` into `to` when they are different memories (an output computed in another layout).
void write_back(const dnnl::memory& from, const dnnl::memory& to) {
  if (from.get_data_handle() == to.get_data_handle()) return;
  dnnl::reorder(from, to).execute(stream(), const_cast<dnnl::memory&>(from), const_cast<dnnl::memory&>(to));
  stream().wait();
}

dims strides_of(const ops::ConvSpec& s) { return {s.stride, s.stride}; }
dims pads_of(const ops::ConvSpec& s) { return {s.pad, s.pad}; }

// pad_r so that oneDNN agrees with the floor in the output size
dims pads_r(const ConvGeometry& g, const ops::ConvSpec& s) {
  return {(g.oh - 1) * s.stride + g.kh - g.h - s.pad, (g.ow - 1) * s.stride + g.kw - g.w - s.pad};
}

void add_act(dnnl::post_ops& po, Act act) {
  if (act == Act::ReLU) po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  if (act == Act::SiLU) po.append_eltwise(1.0f, dnnl::algorithm::eltwise_swish, 1.0f, 0.0f);
}

struct ConvPlan {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  // The activations' nhwc descriptions, whether pd takes them as they are, and pd's scratchpad:
  // made once, as querying and comparing descriptions on every call costs microseconds
  dnnl::memory::desc src_nhwc, dst_nhwc, scratchpad;
  bool src_as_is = false, dst_as_is = false;
  dnnl::memory weights;  // in the layout pd wants
  bool has_bias = false;
  dnnl::memory bias;
  std::shared_ptr<void> held, held_bias;  // the memory of weights and bias (arena_memory)
};

std::shared_ptr<ConvPlan> make_plan(const ConvGeometry& g, const Tensor& w, const Tensor* bias,
                                    const ops::ConvSpec& spec, const ops::Epilogue& ep,
                                    dnnl::prop_kind prop) {
  const bool any = kernel_layout(g, ep.residual != nullptr);
  auto src_md = act_md({g.n, g.c, g.h, g.w}, any);
  auto dst_md = act_md({g.n, g.o, g.oh, g.ow}, any);
  auto wany = weights_md(g, tag::any);
  dnnl::primitive_attr attr = scratch_attr();
  dnnl::post_ops po;
  if (ep.residual) po.append_sum(1.0f);
  add_act(po, ep.act);
  attr.set_post_ops(po);
  auto plan = std::make_shared<ConvPlan>();
  if (bias) {
    RELPOS_CHECK(bias->numel() == g.o, "conv2d: bias has " << bias->numel() << " values for " << g.o
                                                           << " output channels");
    auto bmd = dnnl::memory::desc({g.o}, dt::f32, tag::a);
    dnnl::convolution_forward::desc d(prop, dnnl::algorithm::convolution_direct, src_md, wany, bmd,
                                      dst_md, strides_of(spec), pads_of(spec), pads_r(g, spec));
    plan->pd = dnnl::convolution_forward::primitive_desc(d, attr, engine());
    plan->has_bias = true;
    plan->bias = arena_memory(bmd, plan->held_bias);
    std::memcpy(plan->bias.get_data_handle(), bias->data(), static_cast<std::size_t>(g.o) * 4);
  } else {
    dnnl::convolution_forward::desc d(prop, dnnl::algorithm::convolution_direct, src_md, wany, dst_md,
                                      strides_of(spec), pads_of(spec), pads_r(g, spec));
    plan->pd = dnnl::convolution_forward::primitive_desc(d, attr, engine());
  }
  plan->prim = dnnl::convolution_forward(plan->pd);
  plan->src_nhwc = md_nhwc({g.n, g.c, g.h, g.w});
  plan->dst_nhwc = md_nhwc({g.n, g.o, g.oh, g.ow});
  plan->src_as_is = plan->pd.src_desc() == plan->src_nhwc;
  plan->dst_as_is = plan->pd.dst_desc() == plan->dst_nhwc;
  plan->scratchpad = plan->pd.scratchpad_desc();
  auto wplain = mem(weights_md(g, tag::oihw), w);
  if (plan->pd.weights_desc() == wplain.get_desc()) {
    plan->weights = arena_memory(wplain.get_desc(), plan->held);
    std::memcpy(plan->weights.get_data_handle(), w.data(), w.bytes());
  } else {
    plan->weights = arena_memory(plan->pd.weights_desc(), plan->held);
    dnnl::reorder(wplain, plan->weights).execute(stream(), wplain, plan->weights);
    stream().wait();
  }
  return plan;
}

// The plan cache's key: the folded geometry, the spec, the epilogue and the thread count, as raw
// bytes after a "conv:" prefix (built on every call: an ostringstream there cost about 8 us a
// convolution in the network, its code and locale cold after each convolution's kernels).
std::string plan_key(const ConvGeometry& g, const ops::ConvSpec& s, const ops::Epilogue& ep, bool bias) {
  const std::int64_t v[] = {omp_get_max_threads(), g.n, g.c, g.h, g.w, s.stride, s.pad, s.groups,
                            ep.residual != nullptr, static_cast<std::int64_t>(ep.act), bias};
  return std::string("conv:") + std::string(reinterpret_cast<const char*>(v), sizeof v);
}

// A 1x1 convolution without padding over channels-last images is a product of (pixels x C) and
// (C x O) whatever the image boundaries are, so the batch is folded into the height: (N, C, H, W) ->
// (1, C, N*H, W). oneDNN then blocks the pixels of all images together, which is faster for small
// maps (8x8 at batch 8: 10 to 13% per layer; over the network's 1x1 convolutions about 3%). With
// stride s the fold needs H to be a multiple of s, so every image's first row stays on the grid.
ConvGeometry batch_folded(const ConvGeometry& g, const ops::ConvSpec& spec) {
  if (g.n == 1 || g.kh != 1 || g.kw != 1 || spec.pad != 0 || g.groups != 1 || g.h % spec.stride != 0) return g;
  ConvGeometry f = g;
  f.h = g.n * g.h;
  f.oh = g.n * g.oh;
  f.n = 1;
  return f;
}

#if defined(__x86_64__)
// Where x's elements lie, planar or channels-last, for the narrow-input kernels
narrow_input::InputView input_view(const Tensor& x, const ConvGeometry& g) {
  const bool planar = x.layout() != Layout::ChannelsLast;
  return {x.data(), g.n, g.h, g.w, g.c * g.h * g.w, planar ? g.h * g.w : 1, planar ? g.w : g.w * g.c, planar ? 1 : g.c};
}
#endif

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& w, const Tensor* bias, const ops::ConvSpec& spec,
              const ops::Epilogue& ep, OpCache* cache) {
  const ConvGeometry g = geometry(x_in, w, spec);  // (shapes only: the same in either layout)
#if defined(__x86_64__)  // conv2d_winograd.cpp and conv2d_narrow_input.cpp are built for x86-64 only
  // A 3x3 convolution of an input with few channels (an RGB image): read in the layout it comes
  // in, no reorder (conv2d_narrow_input.hpp). The kernels are packed once with a plan cache
  // (inference), at every call without (training, where the weights change; 9 x in x out floats)
  // (a tensor elsewhere than in host memory goes on to as_channels_last's error)
  if (!ep.residual && x_in.is_cpu() && winograd::available()) {
    if (narrow_input::suits(g.c, g.o, g.kh, g.kw, spec.stride, spec.pad, g.groups, ep.act)) {
      const std::string key = "narrow_input:" + std::to_string(bias != nullptr);
      auto wt = cache ? std::static_pointer_cast<narrow_input::Weights>(cache->find(key)) : nullptr;
      if (!wt) {
        wt = narrow_input::pack(w.data(), g.o, g.c, bias ? bias->data() : nullptr);
        if (cache) cache->put(key, wt);
      }
      Tensor y = output_for({g.n, g.o, g.oh, g.ow}, ep, "conv2d");
      narrow_input::conv3x3(input_view(x_in, g), spec.stride, *wt, ep.act, y.data());
      return y;
    }
  }
#endif
  const Tensor x = as_channels_last(x_in);
#if defined(__x86_64__)
  // A 3x3 convolution through Winograd F(4x4, 3x3): at stride 1 directly, at stride 2 (AVX2) the
  // same transforms on the input's even and odd rows and columns (conv2d_winograd.hpp: conv3x3_s2).
  // For inference the transformed kernels stay in the layer's plan cache; in training (no cache)
  // they are made for each call, as the weights change, where suits_training takes the convolution
  // (at stride 2 the forward of botnet-fmnist's 128x64x28x28 and 128x128x14x14 convolutions 0.886x
  // and 0.843x of oneDNN's, 32x64x56x56 0.676x, 16x128x28x28 1.015x; AVX2, 2 threads).
  const bool wino_s1 = winograd::suits(g.c, g.o, g.kh, g.kw, spec.stride, spec.pad, g.groups, ep.act);
  const bool wino_s2 = winograd::suits_stride2(g.c, g.o, g.kh, g.kw, spec.stride, spec.pad, g.groups, ep.act);
  if (!ep.residual && winograd::available() && (wino_s1 || wino_s2) &&
      (cache || winograd::suits_training(g.c, g.o, g.n, g.h, g.w, false))) {
    const std::string key = std::string(wino_s1 ? "winograd:" : "winograd_s2:") + std::to_string(bias != nullptr);
    std::shared_ptr<winograd::Weights> wt;
    if (cache) wt = std::static_pointer_cast<winograd::Weights>(cache->find(key));
    if (!wt) {
      const float* b = bias ? bias->data() : nullptr;
      wt = wino_s1 ? winograd::transform_weights(w.data(), g.o, g.c, b, false)
                   : winograd::transform_weights_s2(w.data(), g.o, g.c, b);
      if (cache) cache->put(key, wt);
    }
    Tensor y = output_for({g.n, g.o, g.oh, g.ow}, ep, "conv2d");
    if (wino_s1)
      winograd::conv3x3(x.data(), g.n, g.h, g.w, *wt, ep.act, y.data());
    else
      winograd::conv3x3_s2(x.data(), g.n, g.h, g.w, *wt, ep.act, y.data());
    return y;
  }
#endif
  std::shared_ptr<ConvPlan> plan;
  const ConvGeometry gd = batch_folded(g, spec);
  if (cache) {
    const std::string key = plan_key(gd, spec, ep, bias != nullptr);
    plan = std::static_pointer_cast<ConvPlan>(cache->find(key));
    if (!plan) {
      plan = make_plan(gd, w, bias, spec, ep, dnnl::prop_kind::forward_inference);
      cache->put(key, plan);
    }
  } else {
    plan = make_plan(gd, w, bias, spec, ep, dnnl::prop_kind::forward_training);
  }
  Tensor y = output_for({g.n, g.o, g.oh, g.ow}, ep, "conv2d");
  const dnnl::memory y_mem = mem(plan->dst_nhwc, y);
  Tensor x_hold, y_hold;
  const dnnl::memory x_mem = mem(plan->src_nhwc, x);
  const dnnl::memory src = plan->src_as_is ? x_mem : in_layout(x_mem, plan->pd.src_desc(), x_hold, true);
  const dnnl::memory dst = plan->dst_as_is ? y_mem : in_layout(y_mem, plan->pd.dst_desc(), y_hold, false);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, plan->weights}, {DNNL_ARG_DST, dst}};
  if (plan->has_bias) args.emplace(DNNL_ARG_BIAS, plan->bias);
  execute(plan->prim, plan->scratchpad, std::move(args));
  write_back(dst, y_mem);
  return y;
}

ops::ConvGrads conv2d_backward(const Tensor& x_in, const Tensor& w, const Tensor& dy_in,
                               const ops::ConvSpec& spec, bool need_dx) {
  const Tensor x = as_channels_last(x_in);
  const Tensor dy = as_channels_last(dy_in);
  const ConvGeometry g = geometry(x, w, spec);
  RELPOS_CHECK(dy.shape() == Shape({g.n, g.o, g.oh, g.ow}),
               "conv2d_backward: gradient " << dy.describe() << " does not match the output shape");
  ops::ConvGrads grads;
  // A 1x1 convolution with 128 output channels or more, on AVX2-only CPUs: both gradients by
  // relpos's own kernels (conv1x1_grads.hpp), dy read in place. Against oneDNN's two gradients
  // (2 threads, Zen 3): 0.85 to 0.96 from 128 output channels on, the batch-1 8x8 128 -> 128 0.61;
  // 1.06 to 1.16 with 32 or 64 (where they stay with oneDNN). Not measured with AVX-512.
  if (g.o >= 128 && !avx512_kernels() && conv1x1_grads_fit(dy, x, w, spec)) {
    grads.dw = Tensor(w.shape());
    if (need_dx) grads.dx = Tensor(x.shape(), Device::CPU, Layout::ChannelsLast);
    const float* dyp = dy.data();
    const std::int64_t oc = g.o;
    conv1x1::grads({g.n, g.h, g.w, g.c, g.o, spec.stride},
                   [dyp, oc](std::int64_t r0, std::int64_t, float*) { return dyp + r0 * oc; }, x.data(), w.data(),
                   grads.dw.data(), need_dx ? grads.dx.data() : nullptr);
    return grads;
  }
  bool want_dw = true, want_dx = need_dx;  // what oneDNN still has to compute
#if defined(__x86_64__)
  // A 3x3 convolution of an input with few channels (a network's first): its weight gradient by
  // relpos's own kernels (conv2d_narrow_input.hpp), reading x in the layout it comes in. (The input
  // gradient of a network's first convolution is not asked for.)
  if (winograd::available() && narrow_input::suits(g.c, g.o, g.kh, g.kw, spec.stride, spec.pad, g.groups, Act::None)) {
    grads.dw = Tensor(w.shape());
    narrow_input::weight_grad(input_view(x, g), spec.stride, dy.data(), g.c, g.o, grads.dw.data());
    want_dw = false;
    if (!want_dx) return grads;
  }
  // A 3x3 stride-1 convolution: Winograd F(4x4, 3x3) for the gradients where it is the faster way
  // (conv2d_winograd.hpp: suits_training). The input gradient is itself such a convolution, of dy
  // with the kernels turned by 180 degrees and their channels swapped; the weight gradient has its
  // own transforms.
  if (winograd::available() && winograd::suits(g.c, g.o, g.kh, g.kw, spec.stride, spec.pad, g.groups, Act::None)) {
    if (winograd::suits_training(g.c, g.o, g.n, g.h, g.w, true)) {
      grads.dw = Tensor(w.shape());
      winograd::conv3x3_weight_grad(x.data(), dy.data(), g.n, g.h, g.w, g.c, g.o, grads.dw.data());
      want_dw = false;
    }
    if (need_dx && winograd::suits_training(g.c, g.o, g.n, g.h, g.w, false)) {
      const auto wt = winograd::transform_weights(w.data(), g.c, g.o, nullptr, true);
      grads.dx = Tensor(x.shape(), Device::CPU, Layout::ChannelsLast);
      winograd::conv3x3(dy.data(), g.n, g.oh, g.ow, *wt, Act::None, grads.dx.data());
      want_dx = false;
    }
    if (!want_dw && !want_dx) return grads;
  }
  // A 3x3 stride-2 convolution: the weight gradient by relpos's own products where they are the
  // faster way (conv2d_winograd.hpp: suits_weight_grad_s2), without oneDNN's reorder of x into its
  // blocked layout.
  if (winograd::available() &&
      winograd::suits_weight_grad_s2(g.c, g.o, g.kh, g.kw, spec.stride, spec.pad, g.groups, g.n * g.oh * g.ow)) {
    grads.dw = Tensor(w.shape());
    winograd::conv3x3_s2_weight_grad(x.data(), dy.data(), g.n, g.h, g.w, g.c, g.o, grads.dw.data());
    want_dw = false;
    if (!want_dx) return grads;
  }
  // Its input gradient likewise (suits_input_grad_s2), dy read as it lies: without oneDNN's
  // reorders of dy and dx
  if (want_dx && winograd::available() &&
      winograd::suits_input_grad_s2(g.c, g.o, g.kh, g.kw, spec.stride, spec.pad, g.groups, g.n, g.n * g.oh * g.ow)) {
    grads.dx = Tensor(x.shape(), Device::CPU, Layout::ChannelsLast);
    winograd::conv3x3_s2_input_grad(dy.data(), w.data(), g.n, g.h, g.w, g.c, g.o, grads.dx.data());
    want_dx = false;
    if (!want_dw) return grads;
  }
#endif
  const bool any = kernel_layout(g, false);
  auto src_md = act_md(x.shape(), any);
  auto dst_md = act_md(dy.shape(), any);
  auto wany = weights_md(g, tag::any);
  auto wplain_md = weights_md(g, tag::oihw);
  const dnnl::memory x_nhwc = mem(md_nhwc(x.shape()), x);
  const dnnl::memory dy_nhwc = mem(md_nhwc(dy.shape()), dy);
  Tensor dy_hold;  // dy in the kernels' layout, shared by both gradients
  dnnl::memory dy_mem;
  auto dy_for = [&](const dnnl::memory::desc& want) {
    if (!dy_mem || dy_mem.get_desc() != want) dy_mem = in_layout(dy_nhwc, want, dy_hold, true);
    return dy_mem;
  };
  dnnl::convolution_forward::desc fd(dnnl::prop_kind::forward_training,
                                     dnnl::algorithm::convolution_direct, src_md, wany, dst_md,
                                     strides_of(spec), pads_of(spec), pads_r(g, spec));
  dnnl::convolution_forward::primitive_desc fpd(fd, scratch_attr(), engine());

  // d weights
  if (want_dw) {
    dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, src_md, wany,
                                               dst_md, strides_of(spec), pads_of(spec), pads_r(g, spec));
    dnnl::convolution_backward_weights::primitive_desc pd(d, scratch_attr(), engine(), fpd);
    grads.dw = Tensor(w.shape());
    const dnnl::memory dw_plain = mem(wplain_md, grads.dw);
    Tensor x_hold, dw_hold;
    const dnnl::memory dw_mem = in_layout(dw_plain, pd.diff_weights_desc(), dw_hold, false);
    execute(dnnl::convolution_backward_weights(pd), pd.scratchpad_desc(),
            {{DNNL_ARG_SRC, in_layout(x_nhwc, pd.src_desc(), x_hold, true)},
             {DNNL_ARG_DIFF_DST, dy_for(pd.diff_dst_desc())},
             {DNNL_ARG_DIFF_WEIGHTS, dw_mem}});
    write_back(dw_mem, dw_plain);
  }
  // d input
  if (want_dx) {
    dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, src_md, wany, dst_md,
                                            strides_of(spec), pads_of(spec), pads_r(g, spec));
    dnnl::convolution_backward_data::primitive_desc pd(d, scratch_attr(), engine(), fpd);
    Tensor w_hold;
    const dnnl::memory w_mem = in_layout(mem(wplain_md, w), pd.weights_desc(), w_hold, true);
    grads.dx = Tensor(x.shape(), Device::CPU, Layout::ChannelsLast);
    const dnnl::memory dx_nhwc = mem(md_nhwc(x.shape()), grads.dx);
    Tensor dx_hold;
    const dnnl::memory dx_mem = in_layout(dx_nhwc, pd.diff_src_desc(), dx_hold, false);
    execute(dnnl::convolution_backward_data(pd), pd.scratchpad_desc(),
            {{DNNL_ARG_DIFF_DST, dy_for(pd.diff_dst_desc())}, {DNNL_ARG_WEIGHTS, w_mem},
             {DNNL_ARG_DIFF_SRC, dx_mem}});
    write_back(dx_mem, dx_nhwc);
  }
  return grads;
}

}  // namespace relpos::cpu
