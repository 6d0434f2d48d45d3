// Batch norm on the GPU, NHWC, with our own kernels (cuDNN 9's legacy batch-norm calls cost
// milliseconds each on small maps). The map is viewed as an M x C matrix (M = N H W rows).
// Per-channel sums are taken in double: blocks of 32 channels x 8 row lanes each sum a chunk of
// rows, write one partial per chunk, and a finalize kernel adds the partials in a fixed order (so
// results do not depend on scheduling).
#include <algorithm>

#include "cuda/cuda_common.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/elementwise.cuh"

namespace relpos::cuda {

namespace {

constexpr int kLanes = 8;  // row lanes per block (blockDim.y); blockDim.x = 32 channels

struct Chunks {
  std::int64_t count, rows;  // chunks of `rows` rows each
};

Chunks chunks_for(std::int64_t m, std::int64_t c) {
  const std::int64_t tiles = (c + 31) / 32;
  const std::int64_t want = std::max<std::int64_t>(1, std::min<std::int64_t>(1024 / tiles, (m + 63) / 64));
  const std::int64_t rows = (m + want - 1) / want;
  return {(m + rows - 1) / rows, rows};
}

// part[k * c + ch] = sum over the chunk's rows of a (and of a * b, or a^2 when b is null).
__global__ void partial_sums_kernel(const float* a, const float* b, const float* center, double* part1, double* part2,
                                    std::int64_t m, std::int64_t c, std::int64_t chunk_rows) {
  __shared__ double s1[kLanes][32], s2[kLanes][32];
  const std::int64_t ch = blockIdx.x * 32LL + threadIdx.x, k = blockIdx.y;
  const std::int64_t r0 = k * chunk_rows, r1 = std::min(m, r0 + chunk_rows);
  double x1 = 0.0, x2 = 0.0;
  if (ch < c) {
    const float mu = center ? center[ch] : 0.0f;
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kLanes) {
      const float va = a[r * c + ch];
      const float vb = b ? b[r * c + ch] - mu : va;
      x1 += va;
      x2 += static_cast<double>(va) * vb;
    }
  }
  s1[threadIdx.y][threadIdx.x] = x1;
  s2[threadIdx.y][threadIdx.x] = x2;
  __syncthreads();
  if (threadIdx.y == 0 && ch < c) {
    for (int l = 1; l < kLanes; ++l) {
      x1 += s1[l][threadIdx.x];
      x2 += s2[l][threadIdx.x];
    }
    part1[k * c + ch] = x1;
    part2[k * c + ch] = x2;
  }
}

// Adds a channel's partials over the chunks, in chunk order.
__device__ void sum_partials(const double* part1, const double* part2, std::int64_t chunks, std::int64_t c,
                             std::int64_t ch, double& s1, double& s2) {
  s1 = 0.0, s2 = 0.0;
  for (std::int64_t k = 0; k < chunks; ++k) {
    s1 += part1[k * c + ch];
    s2 += part2[k * c + ch];
  }
}

// Training statistics: mean, 1/sqrt(var + eps) (biased var), running stats (unbiased var).
__global__ void bn_stats_kernel(const double* part1, const double* part2, std::int64_t chunks, std::int64_t m,
                                std::int64_t c, float eps, float momentum, float* mean, float* inv_std,
                                float* running_mean, float* running_var) {
  const std::int64_t ch = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  double s, sq;
  sum_partials(part1, part2, chunks, c, ch, s, sq);
  const double mu = s / static_cast<double>(m);
  const double var = std::max(0.0, sq / static_cast<double>(m) - mu * mu);
  mean[ch] = static_cast<float>(mu);
  inv_std[ch] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  running_mean[ch] = (1.0f - momentum) * running_mean[ch] + momentum * static_cast<float>(mu);
  const double unbiased = m > 1 ? var * static_cast<double>(m) / static_cast<double>(m - 1) : var;
  running_var[ch] = (1.0f - momentum) * running_var[ch] + momentum * static_cast<float>(unbiased);
}

// y = (x - mean) * scale + shift with scale = gamma * inv_std (inv_std from var when given).
__global__ void bn_apply_kernel(const float* x, float* y, float* y_act, const float* gamma, const float* beta,
                                const float* mean, const float* inv_std, const float* var, float eps, std::int64_t n,
                                std::int64_t c, int act) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t ch = i % c;
    const float is = var ? rsqrtf(var[ch] + eps) : inv_std[ch];
    const float v = (x[i] - mean[ch]) * is * gamma[ch] + beta[ch];
    if (y) y[i] = v;
    if (y_act) y_act[i] = act_fwd_keep_nan(v, act);
  }
}

// dbeta = sum dy, dgamma = inv_std * sum dy (x - mean).
__global__ void bn_grad_params_kernel(const double* part1, const double* part2, std::int64_t chunks, std::int64_t c,
                                      const float* inv_std, float* dgamma, float* dbeta) {
  const std::int64_t ch = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  double s, sx;
  sum_partials(part1, part2, chunks, c, ch, s, sx);
  dbeta[ch] = static_cast<float>(s);
  dgamma[ch] = static_cast<float>(sx * inv_std[ch]);
}

// dx = gamma inv_std (dy - dbeta / M - xhat dgamma / M), xhat = (x - mean) inv_std.
__global__ void bn_dx_kernel(const float* x, const float* dy, const float* gamma, const float* mean,
                             const float* inv_std, const float* dgamma, const float* dbeta, float* dx, std::int64_t n,
                             std::int64_t c, float inv_m) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t ch = i % c;
    const float is = inv_std[ch];
    const float xhat = (x[i] - mean[ch]) * is;
    dx[i] = gamma[ch] * is * (dy[i] - dbeta[ch] * inv_m - xhat * dgamma[ch] * inv_m);
  }
}


void check4(const Tensor& x, const char* what) {
  require_cuda(x, what);
  RELPOS_CHECK(x.ndim() == 4, what << ": input must be (N, C, H, W), got " << x.describe());
}

// Runs partial_sums_kernel over an M x C map; returns the chunk count (partials in p1, p2).
std::int64_t partial_sums(const float* a, const float* b, const float* center, std::int64_t m, std::int64_t c,
                          Tensor& scratch, double*& p1, double*& p2) {
  const Chunks ch = chunks_for(m, c);
  // doubles in a float tensor: 2 per partial, two arrays
  scratch = Tensor({4 * ch.count * c}, Device::CUDA);
  p1 = reinterpret_cast<double*>(scratch.data());
  p2 = p1 + ch.count * c;
  partial_sums_kernel<<<dim3(static_cast<unsigned>((c + 31) / 32), static_cast<unsigned>(ch.count)), dim3(32, kLanes), 0,
                        stream()>>>(a, b, center, p1, p2, m, c, ch.rows);
  RELPOS_CUDA_LAUNCHED();
  return ch.count;
}

}  // namespace

Tensor batchnorm_infer(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                       const Tensor& var, float eps, Act act) {
  check4(x_in, "batch norm");
  const Tensor x = x_in.channels_last();
  Tensor y(x.shape(), Device::CUDA, Layout::ChannelsLast);
  if (x.numel() == 0) return y;
  bn_apply_kernel<<<grid_for(x.numel()), 256, 0, stream()>>>(x.data(), nullptr, y.data(), gamma.data(), beta.data(),
                                                             mean.data(), nullptr, var.data(), eps, x.numel(), x.dim(1),
                                                             code(act));
  RELPOS_CUDA_LAUNCHED();
  return y;
}

Tensor batchnorm_train(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, float eps, float momentum, Act act, ops::BatchStats& stats) {
  check4(x_in, "batch norm");
  const Tensor x = x_in.channels_last();
  const std::int64_t c = x.dim(1), m = x.dim(0) * x.dim(2) * x.dim(3);
  RELPOS_CHECK(m > 1, "batch norm in training needs more than one value per channel");
  stats.mean = Tensor({c}, Device::CUDA);
  stats.inv_std = Tensor({c}, Device::CUDA);
  stats.var = Tensor();
  stats.eps = eps;
  stats.act = act;
  Tensor scratch;
  double *p1 = nullptr, *p2 = nullptr;
  const std::int64_t chunks = partial_sums(x.data(), nullptr, nullptr, m, c, scratch, p1, p2);
  // Running variance gets the unbiased batch variance, as in PyTorch.
  bn_stats_kernel<<<blocks_for(c), 256, 0, stream()>>>(p1, p2, chunks, m, c, eps, momentum, stats.mean.data(),
                                                       stats.inv_std.data(), running_mean.data(), running_var.data());
  RELPOS_CUDA_LAUNCHED();
  Tensor y(x.shape(), Device::CUDA, Layout::ChannelsLast);
  Tensor out = act == Act::None ? y : Tensor(x.shape(), Device::CUDA, Layout::ChannelsLast);
  bn_apply_kernel<<<grid_for(x.numel()), 256, 0, stream()>>>(
      x.data(), act == Act::None ? nullptr : y.data(), out.data(), gamma.data(), beta.data(), stats.mean.data(),
      stats.inv_std.data(), nullptr, eps, x.numel(), c, code(act));
  RELPOS_CUDA_LAUNCHED();
  stats.aux = act == Act::None ? Tensor() : y;  // the pre-activation output, for the activation's backward
  return out;
}

ops::BatchNormGrads batchnorm_backward(const Tensor& x_in, const Tensor& gamma, const ops::BatchStats& stats,
                                       const Tensor& dy_in) {
  check4(x_in, "batch norm backward");
  RELPOS_CHECK(stats.inv_std.defined() && stats.inv_std.is_cuda(), "batch norm backward: statistics are not from the GPU");
  const Tensor x = x_in.channels_last();
  const Tensor dy = (stats.act == Act::None ? dy_in : activation_backward(stats.aux, dy_in, stats.act)).channels_last();
  const std::int64_t c = x.dim(1), m = x.dim(0) * x.dim(2) * x.dim(3);
  ops::BatchNormGrads g;
  g.dx = Tensor(x.shape(), Device::CUDA, Layout::ChannelsLast);
  g.dgamma = Tensor({c}, Device::CUDA);
  g.dbeta = Tensor({c}, Device::CUDA);
  Tensor scratch;
  double *p1 = nullptr, *p2 = nullptr;
  const std::int64_t chunks = partial_sums(dy.data(), x.data(), stats.mean.data(), m, c, scratch, p1, p2);
  bn_grad_params_kernel<<<blocks_for(c), 256, 0, stream()>>>(p1, p2, chunks, c, stats.inv_std.data(), g.dgamma.data(),
                                                             g.dbeta.data());
  RELPOS_CUDA_LAUNCHED();
  bn_dx_kernel<<<grid_for(x.numel()), 256, 0, stream()>>>(x.data(), dy.data(), gamma.data(), stats.mean.data(),
                                                          stats.inv_std.data(), g.dgamma.data(), g.dbeta.data(),
                                                          g.dx.data(), x.numel(), c, 1.0f / static_cast<float>(m));
  RELPOS_CUDA_LAUNCHED();
  return g;
}

}  // namespace relpos::cuda
