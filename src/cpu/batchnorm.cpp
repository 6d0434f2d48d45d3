// Batch normalisation on the CPU through oneDNN (channels-last), inference and training.
#include "cpu/cpu_ops.hpp"
#include "cpu/dnnl_util.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

namespace {
using bn_flags = dnnl::normalization_flags;

void check_params(const Tensor& x, std::initializer_list<const Tensor*> params) {
  RELPOS_CHECK(x.ndim() == 4, "batch norm: input must be (N, C, H, W), got " << x.describe());
  for (const Tensor* p : params)
    RELPOS_CHECK(p->numel() == x.dim(1), "batch norm: parameter of " << p->numel() << " values for "
                                                                     << x.dim(1) << " channels");
}

dnnl::memory::desc vec_md(std::int64_t c) { return dnnl::memory::desc({c}, dt::f32, tag::a); }

bn_flags train_flags(bool fused_relu) {
  const auto f = bn_flags::use_scale | bn_flags::use_shift;
  return fused_relu ? f | bn_flags::fuse_norm_relu : f;
}
}  // namespace

Tensor batchnorm_infer(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                       const Tensor& var, float eps, Act act) {
  const Tensor x = as_channels_last(x_in);
  check_params(x, {&gamma, &beta, &mean, &var});
  auto md = md_nhwc(x.shape());
  auto flags = bn_flags::use_global_stats | bn_flags::use_scale | bn_flags::use_shift;
  if (act == Act::ReLU) flags = flags | bn_flags::fuse_norm_relu;
  dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_inference, md, eps, flags);
  // SiLU rides along as an eltwise post-op where this oneDNN build and CPU offer one (not every
  // implementation does: seen failing on an Intel AVX-512 machine); otherwise it runs after.
  bool silu_after = false;
  const auto make_pd = [&]() {
    dnnl::primitive_attr attr = scratch_attr();
    if (act == Act::SiLU) {
      dnnl::post_ops po;
      po.append_eltwise(1.0f, dnnl::algorithm::eltwise_swish, 1.0f, 0.0f);
      attr.set_post_ops(po);
      try {
        return dnnl::batch_normalization_forward::primitive_desc(d, attr, engine());
      } catch (const dnnl::error&) {
        silu_after = true;
      }
    }
    return dnnl::batch_normalization_forward::primitive_desc(d, scratch_attr(), engine());
  };
  const dnnl::batch_normalization_forward::primitive_desc pd = make_pd();
  Tensor y(x.shape(), Device::CPU, Layout::ChannelsLast);
  const auto c = x.dim(1);
  execute(dnnl::batch_normalization_forward(pd), pd.scratchpad_desc(),
          {{DNNL_ARG_SRC, mem(md, x)},
           {DNNL_ARG_DST, mem(md, y)},
           {DNNL_ARG_MEAN, mem(vec_md(c), mean)},
           {DNNL_ARG_VARIANCE, mem(vec_md(c), var)},
           {DNNL_ARG_SCALE, mem(vec_md(c), gamma)},
           {DNNL_ARG_SHIFT, mem(vec_md(c), beta)}});
  if (silu_after) return activation(y, Act::SiLU);
  return y;
}

Tensor batchnorm_train(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, float eps, float momentum, Act act, ops::BatchStats& stats) {
  const Tensor x = as_channels_last(x_in);
  check_params(x, {&gamma, &beta, &running_mean, &running_var});
  const std::int64_t count = x.dim(0) * x.dim(2) * x.dim(3);
  RELPOS_CHECK(count > 1, "batch norm in training needs more than one value per channel, got input "
                              << to_string(x.shape()));
  auto md = md_nhwc(x.shape());
  const bool fused = act == Act::ReLU;  // oneDNN fuses ReLU, keeping a bit mask for the backward
  dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_training, md, eps, train_flags(fused));
  dnnl::batch_normalization_forward::primitive_desc pd(d, scratch_attr(), engine());
  const auto c = x.dim(1);
  Tensor y(x.shape(), Device::CPU, Layout::ChannelsLast);
  stats.mean = Tensor({c});
  stats.var = Tensor({c});
  stats.eps = eps;
  stats.act = act;
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, mem(md, x)},
                                             {DNNL_ARG_DST, mem(md, y)},
                                             {DNNL_ARG_MEAN, mem(vec_md(c), stats.mean)},
                                             {DNNL_ARG_VARIANCE, mem(vec_md(c), stats.var)},
                                             {DNNL_ARG_SCALE, mem(vec_md(c), gamma)},
                                             {DNNL_ARG_SHIFT, mem(vec_md(c), beta)}};
  if (fused) {
    stats.aux = Tensor({static_cast<std::int64_t>((pd.workspace_desc().get_size() + 3) / 4)});
    args.emplace(DNNL_ARG_WORKSPACE, mem(pd.workspace_desc(), stats.aux));
  }
  execute(dnnl::batch_normalization_forward(pd), pd.scratchpad_desc(), std::move(args));
  const float unbias = static_cast<float>(count) / static_cast<float>(count - 1);
  float* rm = running_mean.data();
  float* rv = running_var.data();
  const float* m = stats.mean.data();
  const float* v = stats.var.data();
  for (std::int64_t i = 0; i < c; ++i) {
    rm[i] = (1.0f - momentum) * rm[i] + momentum * m[i];
    rv[i] = (1.0f - momentum) * rv[i] + momentum * v[i] * unbias;
  }
  if (fused) return y;  // stats.aux holds the workspace
  if (act == Act::None) {
    stats.aux = Tensor();
    return y;
  }
  stats.aux = y;  // the pre-activation output, for the activation's backward
  return activation(y, act);
}

ops::BatchNormGrads batchnorm_backward(const Tensor& x_in, const Tensor& gamma, const ops::BatchStats& stats,
                                       const Tensor& dy_in) {
  const Tensor x = as_channels_last(x_in);
  check_params(x, {&gamma, &stats.mean, &stats.var});
  RELPOS_CHECK(dy_in.shape() == x.shape(), "batch norm backward: gradient " << dy_in.describe()
                                                                            << " does not match input");
  const bool fused = stats.act == Act::ReLU;
  const Tensor dy = as_channels_last(fused || stats.act == Act::None ? dy_in
                                                                     : activation_backward(stats.aux, dy_in, stats.act));
  auto md = md_nhwc(x.shape());
  dnnl::batch_normalization_forward::desc fd(dnnl::prop_kind::forward_training, md, stats.eps, train_flags(fused));
  dnnl::batch_normalization_forward::primitive_desc fpd(fd, scratch_attr(), engine());
  dnnl::batch_normalization_backward::desc d(dnnl::prop_kind::backward, md, md, stats.eps, train_flags(fused));
  dnnl::batch_normalization_backward::primitive_desc pd(d, scratch_attr(), engine(), fpd);
  const auto c = x.dim(1);
  ops::BatchNormGrads g;
  g.dx = Tensor(x.shape(), Device::CPU, Layout::ChannelsLast);
  g.dgamma = Tensor({c});
  g.dbeta = Tensor({c});
  Tensor beta_unused = Tensor::zeros({c});
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, mem(md, x)},
                                             {DNNL_ARG_DIFF_DST, mem(md, dy)},
                                             {DNNL_ARG_MEAN, mem(vec_md(c), stats.mean)},
                                             {DNNL_ARG_VARIANCE, mem(vec_md(c), stats.var)},
                                             {DNNL_ARG_SCALE, mem(vec_md(c), gamma)},
                                             {DNNL_ARG_SHIFT, mem(vec_md(c), beta_unused)},
                                             {DNNL_ARG_DIFF_SRC, mem(md, g.dx)},
                                             {DNNL_ARG_DIFF_SCALE, mem(vec_md(c), g.dgamma)},
                                             {DNNL_ARG_DIFF_SHIFT, mem(vec_md(c), g.dbeta)}};
  if (fused) {
    RELPOS_CHECK(stats.aux.defined(), "batch norm backward: the fused ReLU's workspace is missing");
    args.emplace(DNNL_ARG_WORKSPACE, mem(fpd.workspace_desc(), stats.aux));
  }
  execute(dnnl::batch_normalization_backward(pd), pd.scratchpad_desc(), std::move(args));
  return g;
}

}  // namespace relpos::cpu
