// BoTNet global attention with 2D relative positions on the CPU (docs/attention.md).
//
// Per image b and head h, with Q, K, V read in place from the channels-last qkv tensor (row
// stride = qkv channels):
//   qh = a * Q Rh^T  (N x rows_h),  qw = a * Q Rw^T  (N x rows_w)       [oneDNN sgemm]
//   L  = s * Q K^T                                                        [sgemm]
//   A  = softmax(L + qh[i, ry(i, j)] + qw[i, rx(i, j)]) row-wise          [bot_softmax_kernels]
//   O  = A V, written straight into the channels-last output              [sgemm]
// The expansion reads each query's rows_h + rows_w table entries and adds them over the key
// grid, so the position term costs N*(rows_h + rows_w)*d multiply-adds, never an N x N x d
// gather. Work is split over (image, head, block of query rows).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <omp.h>

#include "core/attention_geometry.hpp"
#include "cpu/bot_softmax_kernels.hpp"
#include "cpu/cpu_features.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/dnnl_util.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

namespace {

// Query rows per task: as many as keep a block's logits within 256 KiB (a whole 16x16 map's 256 rows:
// fewer, larger matrix products), at least 64, and fewer when that leaves a thread without two tasks.
std::int64_t row_block(std::int64_t images_heads, std::int64_t n) {
  std::int64_t blk = std::min(n, std::max<std::int64_t>(64, (64 << 10) / std::max<std::int64_t>(n, 1)));
  const std::int64_t want = 2 * static_cast<std::int64_t>(omp_get_max_threads());
  while (blk > 64 && images_heads * ((n + blk - 1) / blk) < want) blk = std::max<std::int64_t>(64, (blk + 1) / 2);
  return std::max<std::int64_t>(1, blk);
}

inline int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// row[j] += qh_row[ry] + qw_row[rx] for query (yi, xi) over all keys j = (yj, xj).
// qwx is scratch of W floats.
inline void add_rel_row(float* row, const float* qh_row, const float* qw_row, int yi, int xi, int H,
                        int W, int kh, int kw, float* qwx) {
  for (int xj = 0; xj < W; ++xj) qwx[xj] = qw_row[clampi(xj - xi, -kw, kw) + kw];
  for (int yj = 0; yj < H; ++yj) {
    const float a = qh_row[clampi(yj - yi, -kh, kh) + kh];
    float* r = row + static_cast<std::int64_t>(yj) * W;
#pragma omp simd
    for (int xj = 0; xj < W; ++xj) r[xj] += a + qwx[xj];
  }
}

// The reverse: d qh and d qw of one query from its row of d logits (accumulated).
inline void reduce_rel_row(const float* drow, float* dqh_row, float* dqw_row, int yi, int xi, int H, int W,
                           int kh, int kw, float alpha, float* colsum) {
  std::fill(colsum, colsum + W, 0.0f);
  for (int yj = 0; yj < H; ++yj) {
    const float* r = drow + static_cast<std::int64_t>(yj) * W;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int xj = 0; xj < W; ++xj) {
      s += r[xj];
      colsum[xj] += r[xj];
    }
    dqh_row[clampi(yj - yi, -kh, kh) + kh] += alpha * s;
  }
  for (int xj = 0; xj < W; ++xj) dqw_row[clampi(xj - xi, -kw, kw) + kw] += alpha * colsum[xj];
}

}  // namespace

const bot::Kernels& bot::kernels() {
  static const Kernels& k = avx512_kernels() ? avx512::kKernels : avx2_kernels() ? avx2::kKernels : generic::kKernels;
  return k;
}

Tensor bot_attention(const Tensor& qkv_in, const Tensor& pos_h, const Tensor& pos_w,
                     const BotAttnSpec& spec, Tensor* probs) {
  const Tensor qkv = as_channels_last(qkv_in);
  const BotGeometry g = bot_geometry(qkv, pos_h, pos_w, spec);
  Tensor out({g.B, g.Co, g.H, g.W}, Device::CPU, Layout::ChannelsLast);
  if (probs) *probs = Tensor({g.B, spec.heads, g.N, g.N});

  const std::int64_t blk = row_block(g.B * spec.heads, g.N);
  const std::int64_t nblk = (g.N + blk - 1) / blk;
  const bot::Kernels& rows_k = bot::kernels();

  // Absolute positions fold into the keys: s q.k + a q.P = q.(s k + a P).
  std::vector<float> kprime;
  if (spec.pos == PosEncoding::Absolute) {
    kprime.resize(static_cast<std::size_t>(g.B * spec.heads * g.N * spec.dqk));
#pragma omp parallel for collapse(2) schedule(static)
    for (std::int64_t b = 0; b < g.B; ++b)
      for (int h = 0; h < spec.heads; ++h) {
        const float* k = g.k_ptr(qkv.data(), b, h);
        const float* p = g.table_h(pos_h.data(), h);
        float* kp = kprime.data() + ((b * spec.heads + h) * g.N) * spec.dqk;
        for (std::int64_t j = 0; j < g.N; ++j)
          for (int c = 0; c < spec.dqk; ++c)
            kp[j * spec.dqk + c] = g.s * k[j * g.Ct + c] + g.alpha_pos * p[j * spec.dqk + c];
      }
  }

  const std::int64_t tasks = g.B * spec.heads * nblk;
#pragma omp parallel
  {
    // (not value-initialised: the sgemm writes every logit before anything reads it)
    const std::unique_ptr<float[]> logits(probs ? nullptr : new float[static_cast<std::size_t>(blk * g.N)]);
    std::vector<float> qh(static_cast<std::size_t>(blk * g.Th)), qw(static_cast<std::size_t>(blk * g.Tw));
    std::vector<float> scratch(static_cast<std::size_t>(bot::scratch_floats(g.H, g.W)));
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const std::int64_t b = t / (spec.heads * nblk);
      const int h = static_cast<int>((t / nblk) % spec.heads);
      const std::int64_t i0 = (t % nblk) * blk;
      const std::int64_t rows = std::min(blk, g.N - i0);
      const float* q = g.q_ptr(qkv.data(), b, h) + i0 * g.Ct;
      float* L = probs ? probs->data() + ((b * spec.heads + h) * g.N + i0) * g.N : logits.get();
      if (spec.pos == PosEncoding::Absolute) {
        const float* kp = kprime.data() + ((b * spec.heads + h) * g.N) * spec.dqk;
        gemm(false, true, rows, g.N, spec.dqk, 1.0f, q, g.Ct, kp, spec.dqk, 0.0f, L, g.N);
      } else {
        gemm(false, true, rows, g.N, spec.dqk, g.s, q, g.Ct, g.k_ptr(qkv.data(), b, h), g.Ct, 0.0f, L, g.N);
      }
      bot::RelTerms rel;
      if (spec.pos == PosEncoding::Relative) {
        gemm(false, true, rows, g.Th, spec.dqk, g.alpha_pos, q, g.Ct, g.table_h(pos_h.data(), h), spec.dqk,
             0.0f, qh.data(), g.Th);
        gemm(false, true, rows, g.Tw, spec.dqk, g.alpha_pos, q, g.Ct, g.table_w(pos_w.data(), h), spec.dqk,
             0.0f, qw.data(), g.Tw);
        rel = {qh.data(), qw.data(), g.Th, g.Tw, g.kh, g.kw};
      }
      rows_k.rel_softmax_rows(L, rows, i0, g.H, g.W, rel, scratch.data());
      gemm(false, false, rows, spec.dv, g.N, 1.0f, L, g.N, g.v_ptr(qkv.data(), b, h), g.Ct, 0.0f,
           out.data() + (b * g.N + i0) * g.Co + h * spec.dv, g.Co);
    }
  }
  return out;
}

ops::BotAttnGrads bot_attention_backward(const Tensor& qkv_in, const Tensor& pos_h, const Tensor& pos_w,
                                         const BotAttnSpec& spec, const Tensor& probs,
                                         const Tensor& dout_in) {
  const Tensor qkv = as_channels_last(qkv_in);
  const Tensor dout = as_channels_last(dout_in);
  const BotGeometry g = bot_geometry(qkv, pos_h, pos_w, spec);
  RELPOS_CHECK(probs.shape() == Shape({g.B, spec.heads, g.N, g.N}),
               "attention backward: saved probabilities " << probs.describe() << " do not fit");
  RELPOS_CHECK(dout.shape() == Shape({g.B, g.Co, g.H, g.W}),
               "attention backward: gradient " << dout.describe() << " does not match the output");
  ops::BotAttnGrads grads;
  grads.dqkv = Tensor(qkv.shape(), Device::CPU, Layout::ChannelsLast);
  const bool rel = spec.pos == PosEncoding::Relative, absolute = spec.pos == PosEncoding::Absolute;
  if (rel || absolute) grads.dpos_h = Tensor::zeros(pos_h.shape());
  if (rel) grads.dpos_w = Tensor::zeros(pos_w.shape());
  const std::int64_t N = g.N, d = spec.dqk;
  // Each (image, head) task writes its table gradients into its own slot; the slots are summed
  // in task order afterwards, so the result does not depend on thread scheduling.
  const std::int64_t tasks = g.B * spec.heads;
  const std::int64_t slot_h = (rel || absolute) ? g.Th * d : 0, slot_w = rel ? g.Tw * d : 0;
  std::vector<float> part_h(static_cast<std::size_t>(tasks * slot_h)), part_w(static_cast<std::size_t>(tasks * slot_w));

#pragma omp parallel
  {
    std::vector<float> dL(static_cast<std::size_t>(N * N));
    std::vector<float> dqh(rel ? static_cast<std::size_t>(N * g.Th) : 0);
    std::vector<float> dqw(rel ? static_cast<std::size_t>(N * g.Tw) : 0);
    std::vector<float> colsum(static_cast<std::size_t>(g.W));
    std::vector<float> kp(absolute ? static_cast<std::size_t>(N * d) : 0);
    std::vector<float> dkp(absolute ? static_cast<std::size_t>(N * d) : 0);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const std::int64_t b = t / spec.heads;
      const int h = static_cast<int>(t % spec.heads);
      const float* P = probs.data() + t * N * N;
      const float* Q = g.q_ptr(qkv.data(), b, h);
      const float* K = g.k_ptr(qkv.data(), b, h);
      const float* V = g.v_ptr(qkv.data(), b, h);
      const float* dO = dout.data() + b * N * g.Co + h * spec.dv;
      float* dQ = g.q_ptr(grads.dqkv.data(), b, h);
      float* dK = g.k_ptr(grads.dqkv.data(), b, h);
      float* dV = g.v_ptr(grads.dqkv.data(), b, h);
      // dV = P^T dO ; dP = dO V^T
      gemm(true, false, N, spec.dv, N, 1.0f, P, N, dO, g.Co, 0.0f, dV, g.Ct);
      gemm(false, true, N, N, spec.dv, 1.0f, dO, g.Co, V, g.Ct, 0.0f, dL.data(), N);
      // softmax backward: dL = P * (dP - sum_j P dP)
      for (std::int64_t i = 0; i < N; ++i) {
        const float* p = P + i * N;
        float* r = dL.data() + i * N;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (std::int64_t j = 0; j < N; ++j) dot += p[j] * r[j];
#pragma omp simd
        for (std::int64_t j = 0; j < N; ++j) r[j] = p[j] * (r[j] - dot);
      }
      if (absolute) {
        const float* pos = g.table_h(pos_h.data(), h);
        for (std::int64_t j = 0; j < N; ++j)
          for (std::int64_t c = 0; c < d; ++c) kp[j * d + c] = g.s * K[j * g.Ct + c] + g.alpha_pos * pos[j * d + c];
        gemm(false, false, N, d, N, 1.0f, dL.data(), N, kp.data(), d, 0.0f, dQ, g.Ct);
        gemm(true, false, N, d, N, 1.0f, dL.data(), N, Q, g.Ct, 0.0f, dkp.data(), d);
        float* ah = part_h.data() + t * slot_h;
        for (std::int64_t j = 0; j < N; ++j)
          for (std::int64_t c = 0; c < d; ++c) {
            dK[j * g.Ct + c] = g.s * dkp[j * d + c];
            ah[j * d + c] = g.alpha_pos * dkp[j * d + c];
          }
        continue;
      }
      // dQ = s dL K ; dK = s dL^T Q
      gemm(false, false, N, d, N, g.s, dL.data(), N, K, g.Ct, 0.0f, dQ, g.Ct);
      gemm(true, false, N, d, N, g.s, dL.data(), N, Q, g.Ct, 0.0f, dK, g.Ct);
      if (!rel) continue;
      std::fill(dqh.begin(), dqh.end(), 0.0f);
      std::fill(dqw.begin(), dqw.end(), 0.0f);
      for (std::int64_t i = 0; i < N; ++i)
        reduce_rel_row(dL.data() + i * N, dqh.data() + i * g.Th, dqw.data() + i * g.Tw, static_cast<int>(i / g.W),
                       static_cast<int>(i % g.W), static_cast<int>(g.H), static_cast<int>(g.W), g.kh, g.kw,
                       g.alpha_pos, colsum.data());
      // dQ += dqh Rh + dqw Rw ; dRh += dqh^T Q ; dRw += dqw^T Q
      gemm(false, false, N, d, g.Th, 1.0f, dqh.data(), g.Th, g.table_h(pos_h.data(), h), d, 1.0f, dQ, g.Ct);
      gemm(false, false, N, d, g.Tw, 1.0f, dqw.data(), g.Tw, g.table_w(pos_w.data(), h), d, 1.0f, dQ, g.Ct);
      gemm(true, false, g.Th, d, N, 1.0f, dqh.data(), g.Th, Q, g.Ct, 0.0f, part_h.data() + t * slot_h, d);
      gemm(true, false, g.Tw, d, N, 1.0f, dqw.data(), g.Tw, Q, g.Ct, 0.0f, part_w.data() + t * slot_w, d);
    }
  }
  for (std::int64_t t = 0; t < tasks && slot_h > 0; ++t) {
    const int h = static_cast<int>(t % spec.heads);
    float* dh = g.table_h(grads.dpos_h.data(), h);
    for (std::int64_t i = 0; i < slot_h; ++i) dh[i] += part_h[static_cast<std::size_t>(t * slot_h + i)];
    if (slot_w == 0) continue;
    float* dw = g.table_w(grads.dpos_w.data(), h);
    for (std::int64_t i = 0; i < slot_w; ++i) dw[i] += part_w[static_cast<std::size_t>(t * slot_w + i)];
  }
  return grads;
}

Tensor rel_pos_logits(const Tensor& q_in, const Tensor& table_h, const Tensor& table_w, int height, int width,
                      int clip) {
  const Tensor q = q_in.to(Device::CPU).contiguous();
  RELPOS_CHECK(q.ndim() == 3 && q.dim(1) == static_cast<std::int64_t>(height) * width,
               "rel_pos_logits: q must be (batch, " << height << "*" << width << ", d), got " << q.describe());
  const std::int64_t bh = q.dim(0), N = q.dim(1), d = q.dim(2);
  const int kh = clip > 0 ? clip : height - 1, kw = clip > 0 ? clip : width - 1;
  const std::int64_t th = 2 * kh + 1, tw = 2 * kw + 1;
  RELPOS_CHECK(table_h.shape() == Shape({th, d}) && table_w.shape() == Shape({tw, d}),
               "rel_pos_logits: tables " << to_string(table_h.shape()) << " and " << to_string(table_w.shape())
                                         << " do not fit a " << height << "x" << width << " map (need ["
                                         << th << ", " << d << "] and [" << tw << ", " << d << "])");
  Tensor out = Tensor::zeros({bh, N, N});
#pragma omp parallel
  {
    std::vector<float> qh(static_cast<std::size_t>(N * th)), qw(static_cast<std::size_t>(N * tw));
    std::vector<float> qwx(static_cast<std::size_t>(width));
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < bh; ++b) {
      const float* qb = q.data() + b * N * d;
      gemm(false, true, N, th, d, 1.0f, qb, d, table_h.data(), d, 0.0f, qh.data(), th);
      gemm(false, true, N, tw, d, 1.0f, qb, d, table_w.data(), d, 0.0f, qw.data(), tw);
      for (std::int64_t i = 0; i < N; ++i)
        add_rel_row(out.data() + (b * N + i) * N, qh.data() + i * th, qw.data() + i * tw,
                    static_cast<int>(i / width), static_cast<int>(i % width), height, width, kh, kw, qwx.data());
    }
  }
  return out;
}

}  // namespace relpos::cpu
