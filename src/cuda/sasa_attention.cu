// SASA local attention on the GPU (docs/attention.md): one thread per (pixel, head), as the CPU
// kernel does per loop iteration. The embedding gradients go through per-head GEMMs of the
// per-query window sums (no atomics, so they are deterministic).
#include <cfloat>

#include "core/attention_geometry.hpp"
#include "cuda/cuda_common.hpp"
#include "cuda/cuda_ops.hpp"

namespace relpos::cuda {

namespace {

struct Args {
  int B, H, W, N, Ct, Co, heads, dqk, dv, k, r, half;
  float s;
};

Args args_of(const SasaGeometry& g) {
  return {static_cast<int>(g.B), static_cast<int>(g.H), static_cast<int>(g.W), static_cast<int>(g.N),
          static_cast<int>(g.Ct), static_cast<int>(g.Co), g.heads, g.dqk, g.dv, g.k, g.r, g.half, g.s};
}

__device__ __forceinline__ float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// thread t = (image*N + pixel)*heads + head
__global__ void sasa_forward_kernel(const float* qkv, const float* rr, const float* rc, float* probs, float* out, Args a) {
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= static_cast<std::int64_t>(a.B) * a.N * a.heads) return;
  const int h = static_cast<int>(t % a.heads);
  const std::int64_t i = t / a.heads;
  const int b = static_cast<int>(i / a.N), y = static_cast<int>((i % a.N) / a.W), x = static_cast<int>(i % a.W);
  const float* q = qkv + i * a.Ct + h * a.dqk;
  const int kk = a.k * a.k;
  float* p = probs + t * kk;
  const int y0 = max(0, y - a.r), y1 = min(a.H - 1, y + a.r), x0 = max(0, x - a.r), x1 = min(a.W - 1, x + a.r);
  for (int e = 0; e < kk; ++e) p[e] = 0.0f;
  float m = -FLT_MAX;
  for (int wy = y0; wy <= y1; ++wy) {
    const float pr = dot(q, rr + (wy - y + a.r) * a.half, a.half);
    for (int wx = x0; wx <= x1; ++wx) {
      const float* kj = qkv + (static_cast<std::int64_t>(b) * a.N + wy * a.W + wx) * a.Ct + a.heads * a.dqk + h * a.dqk;
      const float l = a.s * dot(q, kj, a.dqk) + pr + dot(q + a.half, rc + (wx - x + a.r) * a.half, a.half);
      p[(wy - y + a.r) * a.k + (wx - x + a.r)] = l;
      m = fmaxf(m, l);
    }
  }
  float sum = 0.0f;
  for (int wy = y0; wy <= y1; ++wy)
    for (int wx = x0; wx <= x1; ++wx) {
      float& e = p[(wy - y + a.r) * a.k + (wx - x + a.r)];
      e = expf(e - m);
      sum += e;
    }
  const float inv = 1.0f / sum;
  float* o = out + i * a.Co + h * a.dv;
  for (int c = 0; c < a.dv; ++c) o[c] = 0.0f;
  for (int wy = y0; wy <= y1; ++wy)
    for (int wx = x0; wx <= x1; ++wx) {
      float& e = p[(wy - y + a.r) * a.k + (wx - x + a.r)];
      e *= inv;
      const float* vj = qkv + (static_cast<std::int64_t>(b) * a.N + wy * a.W + wx) * a.Ct + 2 * a.heads * a.dqk + h * a.dv;
      for (int c = 0; c < a.dv; ++c) o[c] += e * vj[c];
    }
}

// Pass 1, per query: d logits (into dlog), d q, and the window's row / column sums of d logits
// (sums (heads, B*N, k) each) for the embedding gradients.
__global__ void sasa_back_query_kernel(const float* qkv, const float* rr, const float* rc, const float* probs,
                                       const float* dout, float* dlog, float* dqkv, float* sum_row, float* sum_col, Args a) {
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= static_cast<std::int64_t>(a.B) * a.N * a.heads) return;
  const int h = static_cast<int>(t % a.heads);
  const std::int64_t i = t / a.heads;
  const int b = static_cast<int>(i / a.N), y = static_cast<int>((i % a.N) / a.W), x = static_cast<int>(i % a.W);
  const int kk = a.k * a.k;
  const float* p = probs + t * kk;
  float* dl = dlog + t * kk;
  const float* go = dout + i * a.Co + h * a.dv;
  const int y0 = max(0, y - a.r), y1 = min(a.H - 1, y + a.r), x0 = max(0, x - a.r), x1 = min(a.W - 1, x + a.r);
  float pdp = 0.0f;
  for (int e = 0; e < kk; ++e) dl[e] = 0.0f;
  for (int wy = y0; wy <= y1; ++wy)
    for (int wx = x0; wx <= x1; ++wx) {
      const int at = (wy - y + a.r) * a.k + (wx - x + a.r);
      const float* vj = qkv + (static_cast<std::int64_t>(b) * a.N + wy * a.W + wx) * a.Ct + 2 * a.heads * a.dqk + h * a.dv;
      dl[at] = dot(go, vj, a.dv);
      pdp += p[at] * dl[at];
    }
  float* dq = dqkv + i * a.Ct + h * a.dqk;
  for (int c = 0; c < a.dqk; ++c) dq[c] = 0.0f;
  float* srow = sum_row + (static_cast<std::int64_t>(h) * a.B * a.N + i) * a.k;
  float* scol = sum_col + (static_cast<std::int64_t>(h) * a.B * a.N + i) * a.k;
  for (int e = 0; e < a.k; ++e) srow[e] = scol[e] = 0.0f;
  for (int wy = y0; wy <= y1; ++wy)
    for (int wx = x0; wx <= x1; ++wx) {
      const int oy = wy - y + a.r, ox = wx - x + a.r, at = oy * a.k + ox;
      const float d = p[at] * (dl[at] - pdp);
      dl[at] = d;
      const float* kj = qkv + (static_cast<std::int64_t>(b) * a.N + wy * a.W + wx) * a.Ct + a.heads * a.dqk + h * a.dqk;
      for (int c = 0; c < a.dqk; ++c) dq[c] += a.s * d * kj[c];
      srow[oy] += d;
      scol[ox] += d;
    }
  for (int e = 0; e < a.k; ++e) {
    for (int c = 0; c < a.half; ++c) {
      dq[c] += srow[e] * rr[e * a.half + c];
      dq[a.half + c] += scol[e] * rc[e * a.half + c];
    }
  }
}

// Pass 2, per key: gather d k and d v from the queries whose windows hold it.
__global__ void sasa_back_key_kernel(const float* qkv, const float* probs, const float* dout, const float* dlog,
                                     float* dqkv, Args a) {
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= static_cast<std::int64_t>(a.B) * a.N * a.heads) return;
  const int h = static_cast<int>(t % a.heads);
  const std::int64_t j = t / a.heads;
  const int b = static_cast<int>(j / a.N), y = static_cast<int>((j % a.N) / a.W), x = static_cast<int>(j % a.W);
  const int kk = a.k * a.k;
  float* dk = dqkv + j * a.Ct + a.heads * a.dqk + h * a.dqk;
  float* dv = dqkv + j * a.Ct + 2 * a.heads * a.dqk + h * a.dv;
  for (int c = 0; c < a.dqk; ++c) dk[c] = 0.0f;
  for (int c = 0; c < a.dv; ++c) dv[c] = 0.0f;
  const int y0 = max(0, y - a.r), y1 = min(a.H - 1, y + a.r), x0 = max(0, x - a.r), x1 = min(a.W - 1, x + a.r);
  for (int qy = y0; qy <= y1; ++qy)
    for (int qx = x0; qx <= x1; ++qx) {
      const std::int64_t i = static_cast<std::int64_t>(b) * a.N + qy * a.W + qx;
      const std::int64_t at = (i * a.heads + h) * kk + (y - qy + a.r) * a.k + (x - qx + a.r);
      const float dl = a.s * dlog[at], p = probs[at];
      const float* q = qkv + i * a.Ct + h * a.dqk;
      const float* go = dout + i * a.Co + h * a.dv;
      for (int c = 0; c < a.dqk; ++c) dk[c] += dl * q[c];
      for (int c = 0; c < a.dv; ++c) dv[c] += p * go[c];
    }
}

unsigned grid(const Args& a) { return blocks_for(static_cast<std::int64_t>(a.B) * a.N * a.heads, 128); }

}  // namespace

Tensor sasa_attention(const Tensor& qkv_in, const Tensor& r_row, const Tensor& r_col, const SasaSpec& spec, Tensor* probs,
                      Act act) {
  require_cuda(qkv_in, "local attention");
  const Tensor qkv = qkv_in.channels_last();
  const SasaGeometry g = sasa_geometry(qkv, r_row, r_col, spec);
  const Args a = args_of(g);
  Tensor out({g.B, g.Co, g.H, g.W}, Device::CUDA, Layout::ChannelsLast);
  Tensor p({g.B, g.H, g.W, g.heads, g.k * g.k}, Device::CUDA);
  if (probs) *probs = p;
  if (g.B * g.N == 0) return out;
  sasa_forward_kernel<<<grid(a), 128, 0, stream()>>>(qkv.data(), r_row.data(), r_col.data(), p.data(), out.data(), a);
  RELPOS_CUDA_LAUNCHED();
  return act == Act::None ? out : activation(out, act);  // (a pass of its own on the GPU)
}

ops::SasaGrads sasa_attention_backward(const Tensor& qkv_in, const Tensor& r_row, const Tensor& r_col,
                                       const SasaSpec& spec, const Tensor& probs, const Tensor& dout_in) {
  require_cuda(qkv_in, "local attention backward");
  const Tensor qkv = qkv_in.channels_last();
  const Tensor dout = dout_in.channels_last();
  const SasaGeometry g = sasa_geometry(qkv, r_row, r_col, spec);
  const Args a = args_of(g);
  RELPOS_CHECK(probs.shape() == Shape({g.B, g.H, g.W, g.heads, g.k * g.k}) && probs.is_cuda(),
               "local attention backward: saved probabilities do not fit");
  ops::SasaGrads grads;
  grads.dqkv = Tensor(qkv.shape(), Device::CUDA, Layout::ChannelsLast);
  grads.dr_row = Tensor(r_row.shape(), Device::CUDA);
  grads.dr_col = Tensor(r_col.shape(), Device::CUDA);
  Tensor dlog(probs.shape(), Device::CUDA);
  Tensor srow({g.heads, g.B * g.N, g.k}, Device::CUDA), scol({g.heads, g.B * g.N, g.k}, Device::CUDA);
  sasa_back_query_kernel<<<grid(a), 128, 0, stream()>>>(qkv.data(), r_row.data(), r_col.data(), probs.data(), dout.data(),
                                                        dlog.data(), grads.dqkv.data(), srow.data(), scol.data(), a);
  RELPOS_CUDA_LAUNCHED();
  sasa_back_key_kernel<<<grid(a), 128, 0, stream()>>>(qkv.data(), probs.data(), dout.data(), dlog.data(),
                                                      grads.dqkv.data(), a);
  RELPOS_CUDA_LAUNCHED();
  // d r_row[e, :] = sum over queries and heads of sum_row[e] q[:half]  (likewise columns, q[half:])
  const std::int64_t rows = g.B * g.N;
  for (int h = 0; h < g.heads; ++h) {
    const float* Q = qkv.data() + h * g.dqk;
    const float beta = h == 0 ? 0.0f : 1.0f;
    gemm(true, false, g.k, g.half, rows, 1.0f, srow.data() + h * rows * g.k, g.k, Q, g.Ct, beta, grads.dr_row.data(), g.half);
    gemm(true, false, g.k, g.half, rows, 1.0f, scol.data() + h * rows * g.k, g.k, Q + g.half, g.Ct, beta,
         grads.dr_col.data(), g.half);
  }
  return grads;
}

}  // namespace relpos::cuda
