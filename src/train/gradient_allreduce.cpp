#include "train/gradient_allreduce.hpp"

#include <cstring>

#include "relpos/error.hpp"
#include "train/nccl_group.hpp"

namespace relpos::detail {

GradientAllreduce::GradientAllreduce(ProcessGroup& group, const std::vector<ParamRef>& params, double bucket_mb,
                                     NcclGroup* nccl)
    : group_(group), params_(params), nccl_(nccl) {
  const double limit = bucket_mb * 1024.0 * 1024.0;
  Bucket b;
  double bytes = 0.0;
  for (std::size_t i = params_.size(); i-- > 0;) {
    if (!params_[i].grad) continue;  // a buffer (batch-norm running statistics)
    b.params.push_back(i);
    b.lowest = i;
    bytes += static_cast<double>(params_[i].value->bytes());
    if (bucket_mb > 0 && bytes >= limit) {
      buckets_.push_back(std::move(b));
      b = Bucket{};
      bytes = 0.0;
    }
  }
  if (!b.params.empty()) {
    if (bucket_mb <= 0) b.lowest = 0;  // one bucket, after the whole backward
    buckets_.push_back(std::move(b));
  }
  for (Bucket& k : buckets_) {
    std::size_t n = 0;
    for (std::size_t i : k.params) n += static_cast<std::size_t>(params_[i].value->numel());
    if (!nccl_) k.flat.resize(n);
  }
}

void GradientAllreduce::start(Bucket& b) {
  if (nccl_) {
    nccl_->begin();
    for (std::size_t i : b.params) {
      Tensor& g = *params_[i].grad;
      if (!g.defined()) g = Tensor::zeros(params_[i].value->shape(), params_[i].value->device(), params_[i].value->layout());
      nccl_->allreduce_mean(g);
    }
    nccl_->end();
    return;
  }
  float* out = b.flat.data();
  for (std::size_t i : b.params) {
    const Tensor& g = *params_[i].grad;
    const std::size_t n = static_cast<std::size_t>(params_[i].value->numel());
    if (!g.defined()) {
      std::memset(out, 0, n * sizeof(float));
    } else {
      RELPOS_CHECK(static_cast<std::size_t>(g.numel()) == n, params_[i].name << ": gradient of the wrong size");
      const Tensor host = g.to(Device::CPU);
      std::memcpy(out, host.data(), n * sizeof(float));
    }
    out += n;
  }
  group_.iallreduce_sum(b.flat.data(), b.flat.size());
}

void GradientAllreduce::ready(std::size_t first) {
  while (next_ < buckets_.size() && buckets_[next_].lowest >= first) start(buckets_[next_++]);
  group_.progress();
}

void GradientAllreduce::finish() {
  ready(0);
  next_ = 0;
  if (nccl_) return;  // queued on the stream, before the optimizer's kernels
  group_.wait_all();
  const float scale = 1.0f / static_cast<float>(group_.size());
  for (Bucket& b : buckets_) {
    const float* in = b.flat.data();
    for (std::size_t i : b.params) {
      Tensor& g = *params_[i].grad;
      if (!g.defined()) g = Tensor(params_[i].value->shape(), params_[i].value->device(), params_[i].value->layout());
      Tensor host = g.is_cpu() ? g : Tensor(g.shape(), Device::CPU, g.layout());  // a CPU gradient in place
      float* d = host.data();
      const std::int64_t n = g.numel();
      for (std::int64_t k = 0; k < n; ++k) d[k] = in[k] * scale;
      in += n;
      if (!g.is_cpu()) g.copy_from(host);
    }
  }
}

}  // namespace relpos::detail
