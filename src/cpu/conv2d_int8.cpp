// Int8 convolution on the CPU through oneDNN 2.x: the float32 channels-last input is quantized
// with the layer's static scale (to u8 or s8; or it comes quantized from the previous int8 layer,
// which then wrote u8 in this layer's scale instead of float32), the convolution multiplies it with s8
// weights (reordered once, per-output-channel scales), accumulates in s32 and writes float32 with
// the bias (in the accumulator's units, as oneDNN 2.x adds it before scaling), the residual add
// (sum post-op) and the activation fused: out = act(in_scale *
// w_scale[o] * acc + bias[o] + residual). oneDNN picks the kernel for the CPU: VNNI on AVX-512,
// AMX on Sapphire Rapids, and vpmaddubsw on plain AVX2 (where its own weight reorder halves the
// weights of an s8-input layer to keep the 16-bit pair sums from saturating).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "cpu/cpu_ops.hpp"
#include "cpu/dnnl_util.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

namespace {

struct Geometry {
  std::int64_t n, c, h, w, o, kh, kw, oh, ow;
  int groups;
};

// Without VNNI, oneDNN multiplies u8 by s8 with vpmaddubsw, whose 16-bit sums of two products
// saturate when both are large (2 * 255 * 127 > 32767). For s8 input oneDNN halves the weights
// itself; for u8 input the plan does: q' = round(q / 2), scale' = 2 * scale (|q'| <= 64, so
// 2 * 255 * 64 < 32767).
bool int8_pairs_saturate() {
  static const bool saturate = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    return !(isa == dnnl::cpu_isa::avx2_vnni || isa == dnnl::cpu_isa::avx512_core_vnni ||
             isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx);
  }();
  return saturate;
}

dnnl::memory::desc int8_weights_md(const Geometry& g, tag t) {
  if (g.groups == 1) return dnnl::memory::desc({g.o, g.c, g.kh, g.kw}, dt::s8, t);
  return dnnl::memory::desc({g.groups, g.o / g.groups, g.c / g.groups, g.kh, g.kw}, dt::s8,
                            t == tag::any ? tag::any : tag::goihw);
}

struct Int8Plan {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  dnnl::memory weights, bias;
  bool has_bias = false;
  std::shared_ptr<void> held, held_bias;  // the memory of weights and bias (arena_memory)
};

// oneDNN 2.6's AMX 1x1 int8 kernel with a binary post-op writes whole 16-pixel tiles past the end of
// a u8 destination whose pixel count is not a multiple of 16 (6x6 maps: 12 rows of output channels,
// 24 KiB beyond it), corrupting the heap: sasa_resnet26 int8 at 192x192 crashed. The next
// implementation oneDNN offers for the same convolution takes its place.
void skip_amx_1x1_with_binary(dnnl::convolution_forward::primitive_desc& pd) {
  while (std::string(pd.impl_info_str()).rfind("jit_1x1:avx512_core_amx", 0) == 0)
    if (!pd.next_impl()) RELPOS_FAIL("conv2d_int8: oneDNN offers no int8 1x1 convolution with a float residual but its AMX one");
}

// out_scale > 0: the output is u8 with that scale, else float32. sum_scale > 0: a residual is added
// (sum post-op) from the destination, which holds it beforehand in units of sum_scale: its float32
// value (sum_scale 1) or, for u8 output, its u8 codes (sum_scale = residual scale / out_scale).
// add_f32 (u8 output only): a float32 residual of the output's shape is added by a binary post-op
// instead; the chain then runs in real units (output scales acc_scale, add, act) and a final
// linear post-op divides by out_scale before the conversion to u8.
std::shared_ptr<Int8Plan> make_plan(const Geometry& g, const ops::Int8ConvWeights& w, const ops::ConvSpec& spec,
                                    Act act, float sum_scale, float out_scale, bool add_f32) {
  RELPOS_CHECK(w.scale->numel() == g.o, "conv2d_int8: " << w.scale->numel() << " weight scales for " << g.o
                                                        << " output channels");
  RELPOS_CHECK(ops::usable_int8_scale(w.input_scale),
               "conv2d_int8: the input scale must be a positive normal float, got " << w.input_scale);
  auto plan = std::make_shared<Int8Plan>();
  const bool halve = !w.input_signed && int8_pairs_saturate();
  const auto src_md = dnnl::memory::desc({g.n, g.c, g.h, g.w}, w.input_signed ? dt::s8 : dt::u8, tag::nhwc);
  const auto dst_md = dnnl::memory::desc({g.n, g.o, g.oh, g.ow}, out_scale > 0 ? dt::u8 : dt::f32, tag::nhwc);
  dnnl::primitive_attr attr = scratch_attr();
  std::vector<float> acc_scale(static_cast<std::size_t>(g.o)), scales(acc_scale.size());
  const float* ws = w.scale->data();
  for (std::size_t o = 0; o < scales.size(); ++o) {
    acc_scale[o] = w.input_scale * ws[o] * (halve ? 2.0f : 1.0f);  // one unit of the s32 accumulator
    scales[o] = out_scale > 0 && !add_f32 ? acc_scale[o] / out_scale : acc_scale[o];
  }
  attr.set_output_scales(1 << 1, scales);  // per output channel (dimension 1 of dst)
  dnnl::post_ops po;
  if (sum_scale > 0) po.append_sum(sum_scale);
  if (add_f32) po.append_binary(dnnl::algorithm::binary_add, dnnl::memory::desc({g.n, g.o, g.oh, g.ow}, dt::f32, tag::nhwc));
  if (act == Act::ReLU) po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  if (act == Act::SiLU) po.append_eltwise(1.0f, dnnl::algorithm::eltwise_swish, 1.0f, 0.0f);
  if (add_f32) po.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, 1.0f / out_scale, 0.0f);
  attr.set_post_ops(po);
  const dims strides{spec.stride, spec.stride}, pad_l{spec.pad, spec.pad};
  const dims pad_r{(g.oh - 1) * spec.stride + g.kh - g.h - spec.pad, (g.ow - 1) * spec.stride + g.kw - g.w - spec.pad};
  const auto wany = int8_weights_md(g, tag::any);
  if (w.bias) {
    RELPOS_CHECK(w.bias->numel() == g.o, "conv2d_int8: bias has " << w.bias->numel() << " values for " << g.o
                                                                  << " output channels");
    auto bmd = dnnl::memory::desc({g.o}, dt::f32, tag::a);
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                      src_md, wany, bmd, dst_md, strides, pad_l, pad_r);
    plan->pd = dnnl::convolution_forward::primitive_desc(d, attr, engine());
    if (add_f32) skip_amx_1x1_with_binary(plan->pd);  // while `d` lives: next_impl() reads it
    plan->has_bias = true;
    plan->bias = arena_memory(bmd, plan->held_bias);
    // oneDNN 2.x adds the bias to the accumulator before the output scales: dst = scale * (acc +
    // bias); so the bias goes in in accumulator units (3.x adds it after scaling instead)
    float* b = static_cast<float*>(plan->bias.get_data_handle());
    for (std::size_t o = 0; o < acc_scale.size(); ++o) b[o] = w.bias->data()[o] / acc_scale[o];
  } else {
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                      src_md, wany, dst_md, strides, pad_l, pad_r);
    plan->pd = dnnl::convolution_forward::primitive_desc(d, attr, engine());
    if (add_f32) skip_amx_1x1_with_binary(plan->pd);
  }
  plan->prim = dnnl::convolution_forward(plan->pd);

  // the weights: integers held as float32 -> s8, then into the kernel's layout (the reorder adds
  // oneDNN's compensation for s8 input and its scale adjustment where the CPU needs them)
  const auto plain_md = int8_weights_md(g, g.groups == 1 ? tag::oihw : tag::goihw);
  dnnl::memory plain(plain_md, engine());
  auto* q = static_cast<std::int8_t*>(plain.get_data_handle());
  const float* src = w.weight->data();
  for (std::int64_t i = 0; i < w.weight->numel(); ++i) {
    const float v = src[i];
    RELPOS_CHECK(v >= -127.0f && v <= 127.0f && v == std::nearbyint(v),
                 "conv2d_int8: weight value " << v << " is not an integer in [-127, 127]");
    q[i] = static_cast<std::int8_t>(halve ? std::nearbyint(0.5f * v) : v);
  }
  plan->weights = arena_memory(plan->pd.weights_desc(), plan->held);
  dnnl::reorder(plain, plan->weights).execute(stream(), plain, plan->weights);
  stream().wait();
  return plan;
}

std::shared_ptr<Int8Plan> plan_for(const Geometry& g, const ops::Int8ConvWeights& w, const ops::ConvSpec& s,
                                   Act act, float sum_scale, float out_scale, bool add_f32, OpCache* cache) {
  std::ostringstream os;
  os.precision(9);
  os << "conv8:" << omp_get_max_threads() << ":" << g.n << ',' << g.c << ',' << g.h << ',' << g.w << ':' << s.stride
     << ',' << s.pad << ',' << s.groups << ':' << sum_scale << ',' << static_cast<int>(act) << (w.bias != nullptr)
     << ':' << out_scale << (add_f32 ? "+f32" : "");
  const std::string key = os.str();
  std::shared_ptr<Int8Plan> plan;
  if (cache) plan = std::static_pointer_cast<Int8Plan>(cache->find(key));
  if (!plan) {
    plan = make_plan(g, w, s, act, sum_scale, out_scale, add_f32);
    if (cache) cache->put(key, plan);
  }
  return plan;
}

Geometry checked_geometry(const ops::QuantizedTensor& x, const ops::Int8ConvWeights& w, const ops::ConvSpec& spec) {
  RELPOS_CHECK(x.defined() && x.shape.size() == 4, "conv2d_int8: the quantized input must be (N, C, H, W)");
  RELPOS_CHECK(x.scale == w.input_scale && x.is_signed == w.input_signed,
               "conv2d_int8: the input was quantized with scale " << x.scale << (x.is_signed ? " s8" : " u8")
                                                                  << ", the layer takes " << w.input_scale
                                                                  << (w.input_signed ? " s8" : " u8"));
  // the geometry of a float tensor of the same shape (only its shape is read)
  Geometry g{};
  g.n = x.shape[0], g.c = x.shape[1], g.h = x.shape[2], g.w = x.shape[3];
  const Tensor& wt = *w.weight;
  RELPOS_CHECK(wt.ndim() == 4 && wt.layout() == Layout::Contiguous, "conv2d_int8: bad weight " << wt.describe());
  g.o = wt.dim(0), g.kh = wt.dim(2), g.kw = wt.dim(3), g.groups = spec.groups;
  RELPOS_CHECK(spec.groups >= 1 && g.c % g.groups == 0 && g.o % g.groups == 0 && wt.dim(1) * g.groups == g.c,
               "conv2d_int8: weight " << to_string(wt.shape()) << " does not fit input " << to_string(x.shape)
                                      << " with " << g.groups << " groups");
  g.oh = (g.h + 2 * spec.pad - g.kh) / spec.stride + 1;
  g.ow = (g.w + 2 * spec.pad - g.kw) / spec.stride + 1;
  RELPOS_CHECK(g.oh > 0 && g.ow > 0, "conv2d_int8: input " << to_string(x.shape) << " is smaller than the kernel");
  return g;
}

dnnl::memory src_mem(const Int8Plan& plan, const ops::QuantizedTensor& x) {
  return dnnl::memory(plan.pd.src_desc(), engine(), const_cast<void*>(x.data()));
}

// add: the float32 tensor of a binary_add post-op (the plan's first post-op), or nullptr.
void run(const Int8Plan& plan, const ops::QuantizedTensor& x, dnnl::memory dst, const Tensor* add = nullptr) {
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, src_mem(plan, x)}, {DNNL_ARG_WEIGHTS, plan.weights}, {DNNL_ARG_DST, std::move(dst)}};
  if (plan.has_bias) args.emplace(DNNL_ARG_BIAS, plan.bias);
  if (add)
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                 mem(dnnl::memory::desc(plan.pd.dst_desc().dims(), dt::f32, tag::nhwc), *add));
  execute(plan.prim, plan.pd.scratchpad_desc(), std::move(args));
}


}  // namespace

ops::QuantizedTensor quantize_activation(const Tensor& x_in, float scale, bool is_signed) {
  RELPOS_CHECK(ops::usable_int8_scale(scale), "quantize_activation: the scale must be a positive normal float, got " << scale);
  const Tensor x = as_channels_last(x_in);
  ops::QuantizedTensor q = ops::QuantizedTensor::empty(x.shape(), scale, is_signed);
  const float inv = 1.0f / scale, lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to nearest even
  // memory-bound: below a few MB one thread does it in about a millisecond, less than waking (or,
  // on a busy machine, waiting for) the others
  constexpr std::int64_t kParallelFrom = std::int64_t{1} << 21;
  const float* src = x.data();
  const std::int64_t n = x.numel();
  if (is_signed) {
    auto* dst = static_cast<std::int8_t*>(q.data());
#pragma omp parallel for simd schedule(static) if (n > kParallelFrom)
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = std::min(std::max(src[i] * inv, lo), hi);
      dst[i] = static_cast<std::int8_t>(static_cast<int>((v + magic) - magic));
    }
  } else {
    auto* dst = static_cast<std::uint8_t*>(q.data());
#pragma omp parallel for simd schedule(static) if (n > kParallelFrom)
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = std::min(std::max(src[i] * inv, lo), hi);
      dst[i] = static_cast<std::uint8_t>(static_cast<int>((v + magic) - magic));
    }
  }
  return q;
}

Tensor conv2d_int8(const ops::QuantizedTensor& x, const ops::Int8ConvWeights& w, const ops::ConvSpec& spec,
                   const ops::Epilogue& ep, OpCache* cache) {
  const Geometry g = checked_geometry(x, w, spec);
  const auto plan = plan_for(g, w, spec, ep.act, ep.residual ? 1.0f : 0.0f, 0.0f, false, cache);
  Tensor y = output_for({g.n, g.o, g.oh, g.ow}, ep, "conv2d_int8");
  run(*plan, x, mem(plan->pd.dst_desc(), y));
  return y;
}

ops::QuantizedTensor conv2d_int8_requantized(const ops::QuantizedTensor& x, const ops::Int8ConvWeights& w,
                                             const ops::ConvSpec& spec, Act act, float out_scale,
                                             const ops::Residual& residual, OpCache* cache) {
  RELPOS_CHECK(act == Act::ReLU, "conv2d_int8_requantized: only a ReLU output (never negative) goes to u8");
  RELPOS_CHECK(ops::usable_int8_scale(out_scale), "conv2d_int8_requantized: bad output scale " << out_scale);
  RELPOS_CHECK(!(residual.u8 && residual.f32), "conv2d_int8_requantized: one residual, u8 or float32");
  const Geometry g = checked_geometry(x, w, spec);
  ops::QuantizedTensor y = ops::QuantizedTensor::empty({g.n, g.o, g.oh, g.ow}, out_scale, false);
  float sum_scale = 0.0f;
  if (residual.u8) {
    const ops::QuantizedTensor& r = *residual.u8;
    RELPOS_CHECK(r.defined() && r.shape == y.shape && !r.is_signed,
                 "conv2d_int8_requantized: the residual must be u8 of the output's shape " << to_string(y.shape)
                                                                                         << ", got " << to_string(r.shape));
    sum_scale = r.scale / out_scale;
    std::memcpy(y.data(), r.data(), static_cast<std::size_t>(numel_of(y.shape)));
  }
  Tensor add;
  if (residual.f32) {
    RELPOS_CHECK(residual.f32->shape() == y.shape && residual.f32->is_cpu(),
                 "conv2d_int8_requantized: the residual " << residual.f32->describe() << " does not match the output "
                                                          << to_string(y.shape));
    add = as_channels_last(*residual.f32);
  }
  const auto plan = plan_for(g, w, spec, act, sum_scale, out_scale, add.defined(), cache);
  run(*plan, x, dnnl::memory(plan->pd.dst_desc(), engine(), y.data()), add.defined() ? &add : nullptr);
  return y;
}

Tensor dequantize_activation(const ops::QuantizedTensor& q) {
  RELPOS_CHECK(q.defined() && q.shape.size() == 4, "dequantize_activation: the input must be (N, C, H, W)");
  Tensor y(q.shape, Device::CPU, Layout::ChannelsLast);
  float* dst = y.data();
  const std::int64_t n = y.numel();
  const float s = q.scale;
  constexpr std::int64_t kParallelFrom = std::int64_t{1} << 21;  // as quantize_activation
  if (q.is_signed) {
    const auto* src = static_cast<const std::int8_t*>(q.data());
#pragma omp parallel for simd schedule(static) if (n > kParallelFrom)
    for (std::int64_t i = 0; i < n; ++i) dst[i] = s * static_cast<float>(src[i]);
  } else {
    const auto* src = static_cast<const std::uint8_t*>(q.data());
#pragma omp parallel for simd schedule(static) if (n > kParallelFrom)
    for (std::int64_t i = 0; i < n; ++i) dst[i] = s * static_cast<float>(src[i]);
  }
  return y;
}

}  // namespace relpos::cpu

namespace relpos::ops {
QuantizedTensor QuantizedTensor::empty(const Shape& shape, float scale, bool is_signed) {
  QuantizedTensor q;
  q.shape = shape;
  q.scale = scale;
  q.is_signed = is_signed;
  q.storage = Tensor({(numel_of(shape) + 3) / 4});  // bytes in a float tensor's storage
  return q;
}
}  // namespace relpos::ops

