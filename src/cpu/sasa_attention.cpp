// Stand-alone local self-attention (SASA) on the CPU (docs/attention.md, "SASA local attention").
//
// Each pixel's query attends over the k x k window centred on it; keys outside the image are
// left out of the softmax. With channels-last qkv, a pixel's q, k and v are contiguous, so the
// window dot products run over contiguous channels. The position term of a window entry at
// offset (dy, dx) is q[:d/2].r_row[dy] + q[d/2:].r_col[dx]: 2k small dot products per query.
// Probabilities are stored (B, H, W, heads, k*k), zero where masked.
#include <algorithm>
#include <cmath>
#include <limits>
#include <omp.h>
#include <vector>

#include "core/attention_geometry.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/dnnl_util.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

namespace {

inline float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

inline void axpy(float a, const float* x, float* y, int n) {
#pragma omp simd
  for (int c = 0; c < n; ++c) y[c] += a * x[c];
}

struct Window {
  int y0, y1, x0, x1;  // inclusive image bounds of the window around (y, x)
};
inline Window window_of(const SasaGeometry& g, std::int64_t y, std::int64_t x) {
  return {static_cast<int>(std::max<std::int64_t>(0, y - g.r)), static_cast<int>(std::min<std::int64_t>(g.H - 1, y + g.r)),
          static_cast<int>(std::max<std::int64_t>(0, x - g.r)), static_cast<int>(std::min<std::int64_t>(g.W - 1, x + g.r))};
}

}  // namespace

Tensor sasa_attention(const Tensor& qkv_in, const Tensor& r_row, const Tensor& r_col, const SasaSpec& spec,
                      Tensor* probs) {
  const Tensor qkv = as_channels_last(qkv_in);
  const SasaGeometry g = sasa_geometry(qkv, r_row, r_col, spec);
  Tensor out({g.B, g.Co, g.H, g.W}, Device::CPU, Layout::ChannelsLast);
  const std::int64_t kk = static_cast<std::int64_t>(g.k) * g.k;
  if (probs) *probs = Tensor({g.B, g.H, g.W, g.heads, g.k * g.k});
  const float* base = qkv.data();
  const float* rr = r_row.data();
  const float* rc = r_col.data();

#pragma omp parallel
  {
    std::vector<float> pr(static_cast<std::size_t>(g.k)), pc(static_cast<std::size_t>(g.k));
    std::vector<float> local(static_cast<std::size_t>(kk));
#pragma omp for collapse(2) schedule(static)
    for (std::int64_t b = 0; b < g.B; ++b)
      for (std::int64_t y = 0; y < g.H; ++y)
        for (std::int64_t x = 0; x < g.W; ++x) {
          const std::int64_t i = b * g.N + y * g.W + x;
          const Window win = window_of(g, y, x);
          for (int h = 0; h < g.heads; ++h) {
            const float* q = base + i * g.Ct + h * g.dqk;
            float* p = probs ? probs->data() + (i * g.heads + h) * kk : local.data();
            for (int a = 0; a < g.k; ++a) {
              pr[static_cast<std::size_t>(a)] = dot(q, rr + a * g.half, g.half);
              pc[static_cast<std::size_t>(a)] = dot(q + g.half, rc + a * g.half, g.half);
            }
            std::fill(p, p + kk, 0.0f);
            float m = -std::numeric_limits<float>::infinity();
            for (int wy = win.y0; wy <= win.y1; ++wy)
              for (int wx = win.x0; wx <= win.x1; ++wx) {
                const int oy = wy - static_cast<int>(y) + g.r, ox = wx - static_cast<int>(x) + g.r;
                const float* kj = base + (b * g.N + wy * g.W + wx) * g.Ct + g.heads * g.dqk + h * g.dqk;
                const float l = g.s * dot(q, kj, g.dqk) + pr[static_cast<std::size_t>(oy)] +
                                pc[static_cast<std::size_t>(ox)];
                p[oy * g.k + ox] = l;
                m = std::max(m, l);
              }
            float sum = 0.0f;
            for (int wy = win.y0; wy <= win.y1; ++wy)
              for (int wx = win.x0; wx <= win.x1; ++wx) {
                float& e = p[(wy - y + g.r) * g.k + (wx - x + g.r)];
                e = std::exp(e - m);
                sum += e;
              }
            const float inv = 1.0f / sum;
            float* o = out.data() + i * g.Co + h * g.dv;
            std::fill(o, o + g.dv, 0.0f);
            for (int wy = win.y0; wy <= win.y1; ++wy)
              for (int wx = win.x0; wx <= win.x1; ++wx) {
                float& e = p[(wy - y + g.r) * g.k + (wx - x + g.r)];
                e *= inv;
                const float* vj = base + (b * g.N + wy * g.W + wx) * g.Ct + 2 * g.heads * g.dqk + h * g.dv;
                axpy(e, vj, o, g.dv);
              }
          }
        }
  }
  return out;
}

ops::SasaGrads sasa_attention_backward(const Tensor& qkv_in, const Tensor& r_row, const Tensor& r_col,
                                       const SasaSpec& spec, const Tensor& probs, const Tensor& dout_in) {
  const Tensor qkv = as_channels_last(qkv_in);
  const Tensor dout = as_channels_last(dout_in);
  const SasaGeometry g = sasa_geometry(qkv, r_row, r_col, spec);
  const std::int64_t kk = static_cast<std::int64_t>(g.k) * g.k;
  RELPOS_CHECK(probs.shape() == Shape({g.B, g.H, g.W, g.heads, kk}),
               "local attention backward: saved probabilities " << probs.describe() << " do not fit");
  RELPOS_CHECK(dout.shape() == Shape({g.B, g.Co, g.H, g.W}),
               "local attention backward: gradient " << dout.describe() << " does not match the output");
  ops::SasaGrads grads;
  grads.dqkv = Tensor(qkv.shape(), Device::CPU, Layout::ChannelsLast);
  grads.dr_row = Tensor::zeros(r_row.shape());
  grads.dr_col = Tensor::zeros(r_col.shape());
  std::vector<float> dlog(static_cast<std::size_t>(probs.numel()));  // d logits, same layout as probs
  const float* base = qkv.data();
  const float* P = probs.data();
  const float* dO = dout.data();
  float* dbase = grads.dqkv.data();
  const float* rr = r_row.data();
  const float* rc = r_col.data();
  const std::int64_t tsize = static_cast<std::int64_t>(g.k) * g.half;

  // Pass 1, per query: d logits, d q, and the embedding gradients. Each thread sums into its
  // own slot (static schedule), and the slots are added in thread order: the same result on
  // every run with the same thread count.
  const int nthreads = omp_get_max_threads();
  std::vector<float> part(static_cast<std::size_t>(nthreads) * 2 * static_cast<std::size_t>(tsize), 0.0f);
#pragma omp parallel num_threads(nthreads)
  {
    float* acc_row = part.data() + static_cast<std::size_t>(omp_get_thread_num()) * 2 * static_cast<std::size_t>(tsize);
    float* acc_col = acc_row + tsize;
    std::vector<float> sum_row(static_cast<std::size_t>(g.k)), sum_col(static_cast<std::size_t>(g.k));
#pragma omp for collapse(2) schedule(static)
    for (std::int64_t b = 0; b < g.B; ++b)
      for (std::int64_t y = 0; y < g.H; ++y)
        for (std::int64_t x = 0; x < g.W; ++x) {
          const std::int64_t i = b * g.N + y * g.W + x;
          const Window win = window_of(g, y, x);
          for (int h = 0; h < g.heads; ++h) {
            const float* p = P + (i * g.heads + h) * kk;
            float* dl = dlog.data() + (i * g.heads + h) * kk;
            const float* q = base + i * g.Ct + h * g.dqk;
            const float* go = dO + i * g.Co + h * g.dv;
            std::fill(dl, dl + kk, 0.0f);
            float pdp = 0.0f;
            for (int wy = win.y0; wy <= win.y1; ++wy)
              for (int wx = win.x0; wx <= win.x1; ++wx) {
                const std::int64_t at = (wy - y + g.r) * g.k + (wx - x + g.r);
                const float* vj = base + (b * g.N + wy * g.W + wx) * g.Ct + 2 * g.heads * g.dqk + h * g.dv;
                dl[at] = dot(go, vj, g.dv);
                pdp += p[at] * dl[at];
              }
            float* dq = dbase + i * g.Ct + h * g.dqk;
            std::fill(dq, dq + g.dqk, 0.0f);
            std::fill(sum_row.begin(), sum_row.end(), 0.0f);
            std::fill(sum_col.begin(), sum_col.end(), 0.0f);
            for (int wy = win.y0; wy <= win.y1; ++wy)
              for (int wx = win.x0; wx <= win.x1; ++wx) {
                const int oy = wy - static_cast<int>(y) + g.r, ox = wx - static_cast<int>(x) + g.r;
                float& d = dl[oy * g.k + ox];
                d = p[oy * g.k + ox] * (d - pdp);
                const float* kj = base + (b * g.N + wy * g.W + wx) * g.Ct + g.heads * g.dqk + h * g.dqk;
                axpy(g.s * d, kj, dq, g.dqk);
                sum_row[static_cast<std::size_t>(oy)] += d;
                sum_col[static_cast<std::size_t>(ox)] += d;
              }
            for (int a = 0; a < g.k; ++a) {
              const float sr = sum_row[static_cast<std::size_t>(a)], sc = sum_col[static_cast<std::size_t>(a)];
              axpy(sr, rr + a * g.half, dq, g.half);
              axpy(sc, rc + a * g.half, dq + g.half, g.half);
              axpy(sr, q, acc_row + a * g.half, g.half);
              axpy(sc, q + g.half, acc_col + a * g.half, g.half);
            }
          }
        }
  }
  for (int th = 0; th < nthreads; ++th)
    for (std::int64_t t = 0; t < tsize; ++t) {
      grads.dr_row.data()[t] += part[(static_cast<std::size_t>(th) * 2) * static_cast<std::size_t>(tsize) + static_cast<std::size_t>(t)];
      grads.dr_col.data()[t] += part[(static_cast<std::size_t>(th) * 2 + 1) * static_cast<std::size_t>(tsize) + static_cast<std::size_t>(t)];
    }

  // Pass 2, per key: gather d k and d v from the queries whose windows hold it.
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t b = 0; b < g.B; ++b)
    for (std::int64_t y = 0; y < g.H; ++y)
      for (std::int64_t x = 0; x < g.W; ++x) {
        const std::int64_t j = b * g.N + y * g.W + x;
        const Window win = window_of(g, y, x);  // the queries that see this key
        for (int h = 0; h < g.heads; ++h) {
          float* dk = dbase + j * g.Ct + g.heads * g.dqk + h * g.dqk;
          float* dv = dbase + j * g.Ct + 2 * g.heads * g.dqk + h * g.dv;
          std::fill(dk, dk + g.dqk, 0.0f);
          std::fill(dv, dv + g.dv, 0.0f);
          for (int qy = win.y0; qy <= win.y1; ++qy)
            for (int qx = win.x0; qx <= win.x1; ++qx) {
              const std::int64_t i = b * g.N + qy * g.W + qx;
              const std::int64_t at = (i * g.heads + h) * kk + (y - qy + g.r) * g.k + (x - qx + g.r);
              axpy(g.s * dlog[static_cast<std::size_t>(at)], base + i * g.Ct + h * g.dqk, dk, g.dqk);
              axpy(P[at], dO + i * g.Co + h * g.dv, dv, g.dv);
            }
        }
      }
  return grads;
}

}  // namespace relpos::cpu
