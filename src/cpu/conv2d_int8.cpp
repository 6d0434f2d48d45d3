// Int8 convolution on the CPU through oneDNN 2.x: the float32 channels-last input is quantized
// with the layer's static scale (a reorder to u8 or s8), the convolution multiplies it with s8
// weights (reordered once, per-output-channel scales), accumulates in s32 and writes float32 with
// the bias (in the accumulator's units, as oneDNN 2.x adds it before scaling), the residual add
// (sum post-op) and the activation fused: out = act(in_scale *
// w_scale[o] * acc + bias[o] + residual). oneDNN picks the kernel for the CPU: VNNI on AVX-512,
// AMX on Sapphire Rapids, and vpmaddubsw on plain AVX2 (where its own weight reorder halves the
// weights of an s8-input layer to keep the 16-bit pair sums from saturating).
#include <omp.h>

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

Geometry geometry_of(const Tensor& x, const Tensor& w, const ops::ConvSpec& spec) {
  RELPOS_CHECK(x.ndim() == 4, "conv2d_int8: input must be (N, C, H, W), got " << x.describe());
  RELPOS_CHECK(w.ndim() == 4 && w.layout() == Layout::Contiguous,
               "conv2d_int8: weight must be a contiguous (O, C/groups, kh, kw) tensor, got " << w.describe());
  RELPOS_CHECK(spec.groups >= 1 && spec.stride >= 1 && spec.pad >= 0, "conv2d_int8: bad spec");
  Geometry g{};
  g.n = x.dim(0), g.c = x.dim(1), g.h = x.dim(2), g.w = x.dim(3);
  g.o = w.dim(0), g.kh = w.dim(2), g.kw = w.dim(3), g.groups = spec.groups;
  RELPOS_CHECK(g.c % g.groups == 0 && g.o % g.groups == 0 && w.dim(1) * g.groups == g.c,
               "conv2d_int8: weight " << to_string(w.shape()) << " does not fit input " << to_string(x.shape())
                                      << " with " << g.groups << " groups");
  g.oh = (g.h + 2 * spec.pad - g.kh) / spec.stride + 1;
  g.ow = (g.w + 2 * spec.pad - g.kw) / spec.stride + 1;
  RELPOS_CHECK(g.oh > 0 && g.ow > 0, "conv2d_int8: input " << to_string(x.shape()) << " is smaller than the "
                                                           << g.kh << "x" << g.kw << " kernel");
  return g;
}

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
  dnnl::memory::desc fsrc_md, qsrc_md;
  dnnl::reorder::primitive_desc quant_pd;
  dnnl::reorder quant;
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  dnnl::memory weights, bias;
  bool has_bias = false;
};

std::shared_ptr<Int8Plan> make_plan(const Geometry& g, const ops::Int8ConvWeights& w, const ops::ConvSpec& spec,
                                    const ops::Epilogue& ep) {
  RELPOS_CHECK(w.scale->numel() == g.o, "conv2d_int8: " << w.scale->numel() << " weight scales for " << g.o
                                                        << " output channels");
  RELPOS_CHECK(std::isfinite(w.input_scale) && w.input_scale > 0,
               "conv2d_int8: the input scale must be positive, got " << w.input_scale);
  auto plan = std::make_shared<Int8Plan>();
  const dt qtype = w.input_signed ? dt::s8 : dt::u8;
  const bool halve = !w.input_signed && int8_pairs_saturate();
  plan->fsrc_md = md_nhwc({g.n, g.c, g.h, g.w});
  plan->qsrc_md = dnnl::memory::desc({g.n, g.c, g.h, g.w}, qtype, tag::nhwc);

  // quantization of the input: q = saturate(round(x / input_scale))
  {
    dnnl::primitive_attr attr = scratch_attr();
    attr.set_output_scales(0, {1.0f / w.input_scale});
    plan->quant_pd = dnnl::reorder::primitive_desc(engine(), plan->fsrc_md, engine(), plan->qsrc_md, attr);
    plan->quant = dnnl::reorder(plan->quant_pd);
  }

  const auto dst_md = md_nhwc({g.n, g.o, g.oh, g.ow});
  dnnl::primitive_attr attr = scratch_attr();
  std::vector<float> scales(static_cast<std::size_t>(g.o));
  const float* ws = w.scale->data();
  for (std::size_t o = 0; o < scales.size(); ++o) scales[o] = w.input_scale * ws[o] * (halve ? 2.0f : 1.0f);
  attr.set_output_scales(1 << 1, scales);  // per output channel (dimension 1 of dst)
  dnnl::post_ops po;
  if (ep.residual) po.append_sum(1.0f);
  if (ep.act == Act::ReLU) po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  if (ep.act == Act::SiLU) po.append_eltwise(1.0f, dnnl::algorithm::eltwise_swish, 1.0f, 0.0f);
  attr.set_post_ops(po);
  const dims strides{spec.stride, spec.stride}, pad_l{spec.pad, spec.pad};
  const dims pad_r{(g.oh - 1) * spec.stride + g.kh - g.h - spec.pad, (g.ow - 1) * spec.stride + g.kw - g.w - spec.pad};
  const auto wany = int8_weights_md(g, tag::any);
  if (w.bias) {
    RELPOS_CHECK(w.bias->numel() == g.o, "conv2d_int8: bias has " << w.bias->numel() << " values for " << g.o
                                                                  << " output channels");
    auto bmd = dnnl::memory::desc({g.o}, dt::f32, tag::a);
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                      plan->qsrc_md, wany, bmd, dst_md, strides, pad_l, pad_r);
    plan->pd = dnnl::convolution_forward::primitive_desc(d, attr, engine());
    plan->has_bias = true;
    plan->bias = dnnl::memory(bmd, engine());
    // oneDNN 2.x adds the bias to the accumulator before the output scales: dst = scale * (acc +
    // bias); so the bias goes in divided by the scale (3.x adds it after scaling instead)
    float* b = static_cast<float*>(plan->bias.get_data_handle());
    for (std::size_t o = 0; o < scales.size(); ++o) b[o] = w.bias->data()[o] / scales[o];
  } else {
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                      plan->qsrc_md, wany, dst_md, strides, pad_l, pad_r);
    plan->pd = dnnl::convolution_forward::primitive_desc(d, attr, engine());
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
  plan->weights = dnnl::memory(plan->pd.weights_desc(), engine());
  dnnl::reorder(plain, plan->weights).execute(stream(), plain, plan->weights);
  stream().wait();
  return plan;
}

std::string plan_key(const Geometry& g, const ops::ConvSpec& s, const ops::Epilogue& ep, bool bias) {
  std::ostringstream os;
  os << "conv8:" << omp_get_max_threads() << ":" << g.n << ',' << g.c << ',' << g.h << ',' << g.w << ':' << s.stride
     << ',' << s.pad << ',' << s.groups << ':' << (ep.residual != nullptr) << static_cast<int>(ep.act) << bias;
  return os.str();
}

// The quantized input: one buffer per thread, reused from layer to layer.
struct QuantBuffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  ~QuantBuffer() { std::free(p); }
  void* get(std::size_t n) {
    if (n > bytes) {
      std::free(p);
      bytes = (n + 4095) / 4096 * 4096;
      p = std::aligned_alloc(64, bytes);
      RELPOS_CHECK(p != nullptr, "out of memory for a " << n << "-byte int8 activation");
    }
    return p;
  }
};

}  // namespace

Tensor conv2d_int8(const Tensor& x_in, const ops::Int8ConvWeights& w, const ops::ConvSpec& spec,
                   const ops::Epilogue& ep, OpCache* cache) {
  const Tensor x = as_channels_last(x_in);
  const Geometry g = geometry_of(x, *w.weight, spec);
  std::shared_ptr<Int8Plan> plan;
  const std::string key = plan_key(g, spec, ep, w.bias != nullptr);
  if (cache) plan = std::static_pointer_cast<Int8Plan>(cache->find(key));
  if (!plan) {
    plan = make_plan(g, w, spec, ep);
    if (cache) cache->put(key, plan);
  }
  thread_local QuantBuffer qbuf;
  dnnl::memory qsrc(plan->qsrc_md, engine(), qbuf.get(plan->qsrc_md.get_size()));
  execute(plan->quant, plan->quant_pd.scratchpad_desc(),
          {{DNNL_ARG_FROM, mem(plan->fsrc_md, x)}, {DNNL_ARG_TO, qsrc}});

  Tensor y({g.n, g.o, g.oh, g.ow}, Device::CPU, Layout::ChannelsLast);
  if (ep.residual) {
    RELPOS_CHECK(ep.residual->shape() == y.shape(), "conv2d_int8: residual " << ep.residual->describe()
                                                                              << " does not match output "
                                                                              << to_string(y.shape()));
    y.copy_from(*ep.residual);
  }
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, qsrc},
                                             {DNNL_ARG_WEIGHTS, plan->weights},
                                             {DNNL_ARG_DST, mem(plan->pd.dst_desc(), y)}};
  if (plan->has_bias) args.emplace(DNNL_ARG_BIAS, plan->bias);
  execute(plan->prim, plan->pd.scratchpad_desc(), std::move(args));
  return y;
}

}  // namespace relpos::cpu
