// BoTNet global attention with 2D relative positions on the GPU (docs/attention.md).
//
// Per head h, batched over images with cuBLAS strided-batched GEMMs reading Q, K, V in place from
// the NHWC qkv tensor (row stride = qkv channels):
//   L  = s Q K^T                      (B x N x N, written into the probabilities buffer)
//   qh = a Q Rh^T,  qw = a Q Rw^T     (one GEMM per head over all B*N queries: (B*N) x rows)
// then one kernel per query row expands qh[i, :] and qw[i, :] over the h x w key grid while
// adding them to L, and takes the softmax in the same pass; O = P V lands in the NHWC output.
// The backward kernel turns dP into d logits (softmax backward) and reduces each row into
// d qh[i, :] (sums over key rows) and d qw[i, :] (sums over key columns) in shared memory, never
// forming an N x N x d tensor; cuBLAS then gives dQ, dK, dRh, dRw.
#include <cfloat>

#include "core/attention_geometry.hpp"
#include "cuda/cuda_common.hpp"
#include "cuda/cuda_ops.hpp"

namespace relpos::cuda {

namespace {

// Row-major C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch.
void gemm_batched(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                  std::int64_t lda, std::int64_t sa, const float* b, std::int64_t ldb, std::int64_t sb, float beta,
                  float* c, std::int64_t ldc, std::int64_t sc, std::int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  cublasHandle_t h = context().cublas;
  RELPOS_CUBLAS_CHECK(cublasSetMathMode(h, tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  RELPOS_CUBLAS_CHECK(cublasSgemmStridedBatched(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                                static_cast<int>(ldb), sb, a, static_cast<int>(lda), sa, &beta, c,
                                                static_cast<int>(ldc), sc, static_cast<int>(batch)));
}

__device__ __forceinline__ int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = threadIdx.x < warps ? scratch[threadIdx.x] : (kMax ? -FLT_MAX : 0.0f);
  if (warp == 0)
    for (int off = 16; off > 0; off >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, v, off);
      v = kMax ? fmaxf(v, o) : v + o;
    }
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  v = scratch[0];
  __syncthreads();
  return v;
}

struct RowArgs {
  int N, H, W, heads, B, Th, Tw, kh, kw;
  bool rel;
  bool softmax;
};

// Rows up to this many keys are held in shared memory while a block works on them (one read
// and one write of the N x N matrix instead of three of each); longer rows stream through global
// memory.
constexpr int kMaxSharedRow = 8192;

// One block per (query row i, image*head): L[i, j] += qh[i, ry] + qw[i, rx]; then softmax.
template <bool kShared>
__global__ void expand_softmax_kernel(float* L, const float* qh, const float* qw, RowArgs a) {
  extern __shared__ float sh[];  // Th + Tw table entries, 32 for reductions, then the row (kShared)
  const int i = blockIdx.x, bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads;
  float* grow = L + (static_cast<std::size_t>(bh) * a.N + i) * a.N;
  float* red = sh + (a.rel ? a.Th + a.Tw : 0);  // the launch sizes shared memory the same way
  float* row = kShared ? red + 32 : grow;
  if (a.rel) {
    const std::size_t q = static_cast<std::size_t>(h) * a.B * a.N + static_cast<std::size_t>(b) * a.N + i;
    for (int t = threadIdx.x; t < a.Th; t += blockDim.x) sh[t] = qh[q * a.Th + t];
    for (int t = threadIdx.x; t < a.Tw; t += blockDim.x) sh[a.Th + t] = qw[q * a.Tw + t];
    __syncthreads();
  }
  const int yi = i / a.W, xi = i % a.W;
  float m = -FLT_MAX;
  for (int j = threadIdx.x; j < a.N; j += blockDim.x) {
    float v = grow[j];
    if (a.rel) v += sh[clampi(j / a.W - yi, -a.kh, a.kh) + a.kh] + sh[a.Th + clampi(j % a.W - xi, -a.kw, a.kw) + a.kw];
    row[j] = v;
    m = fmaxf(m, v);
  }
  if (!a.softmax) {
    if (kShared)
      for (int j = threadIdx.x; j < a.N; j += blockDim.x) grow[j] = row[j];
    return;
  }
  m = block_reduce<true>(m, red);  // its barriers also order the row's shared writes
  float s = 0.0f;
  for (int j = threadIdx.x; j < a.N; j += blockDim.x) {
    const float e = expf(row[j] - m);
    row[j] = e;
    s += e;
  }
  s = block_reduce<false>(s, red);
  const float inv = 1.0f / s;
  for (int j = threadIdx.x; j < a.N; j += blockDim.x) grow[j] = row[j] * inv;
}

// One block per (query row i, image*head): dL = P (dP - <P, dP>) in place of dP; with relative
// positions also dqh[i, :] and dqw[i, :] (times alpha) from the row's sums over key rows/columns.
// kShared: the row of dL is kept in shared memory and summed per key row (a warp per row) and per
// key column (a thread per column) without atomics; otherwise shared-memory atomics.
template <bool kShared>
__global__ void softmax_back_reduce_kernel(const float* P, float* dL, float* dqh, float* dqw, RowArgs a, float alpha) {
  extern __shared__ float sh[];  // H row sums and W column sums (rel), 32 for reductions, row (kShared)
  float* rows = sh;
  float* cols = rows + a.H;
  float* red = a.rel ? cols + a.W : sh;  // as the launch sizes it
  float* vals = red + 32;
  const int i = blockIdx.x, bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads;
  const std::size_t off = (static_cast<std::size_t>(bh) * a.N + i) * a.N;
  const float* p = P + off;
  float* d = dL + off;
  float dot = 0.0f;
  for (int j = threadIdx.x; j < a.N; j += blockDim.x) dot += p[j] * d[j];
  dot = block_reduce<false>(dot, red);
  if (a.rel && !kShared) {
    for (int t = threadIdx.x; t < a.H + a.W; t += blockDim.x) sh[t] = 0.0f;
    __syncthreads();
  }
  for (int j = threadIdx.x; j < a.N; j += blockDim.x) {
    const float v = p[j] * (d[j] - dot);
    d[j] = v;
    if (a.rel) {
      if (kShared) {
        vals[j] = v;
      } else {
        atomicAdd(&rows[j / a.W], v);
        atomicAdd(&cols[j % a.W], v);
      }
    }
  }
  if (!a.rel) return;
  __syncthreads();
  if (kShared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int y = warp; y < a.H; y += warps) {
      float sum = 0.0f;
      for (int x = lane; x < a.W; x += 32) sum += vals[y * a.W + x];
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) rows[y] = sum;
    }
    for (int x = threadIdx.x; x < a.W; x += blockDim.x) {
      float sum = 0.0f;
      for (int y = 0; y < a.H; ++y) sum += vals[y * a.W + x];
      cols[x] = sum;
    }
    __syncthreads();
  }
  // Table entry t collects the key rows at offset t - kh from the query's row (clipped offsets
  // pile onto the end entries); likewise for columns.
  const int yi = i / a.W, xi = i % a.W;
  const std::size_t q = static_cast<std::size_t>(h) * a.B * a.N + static_cast<std::size_t>(b) * a.N + i;
  for (int t = threadIdx.x; t < a.Th + a.Tw; t += blockDim.x) {
    const bool is_h = t < a.Th;
    const int e = is_h ? t : t - a.Th, k = is_h ? a.kh : a.kw, n = is_h ? a.H : a.W, at = is_h ? yi : xi;
    const float* sums = is_h ? rows : cols;
    // offsets o = pos - at with clamp(o, -k, k) == e - k
    int lo = e - k + at, hi = lo;
    if (e == 0) lo = 0;
    if (e == 2 * k) hi = n - 1;
    float acc = 0.0f;
    for (int pos = max(lo, 0); pos <= min(hi, n - 1); ++pos) acc += sums[pos];
    if (is_h) dqh[q * a.Th + e] = alpha * acc;
    else dqw[q * a.Tw + e] = alpha * acc;
  }
}

// K' = s K + a P for absolute positions: kp (B, heads, N, d).
__global__ void kprime_kernel(const float* qkv, const float* pos, float* kp, int B, int heads, int N, int d, int Ct,
                              bool per_head, float s, float a) {
  const std::int64_t total = static_cast<std::int64_t>(B) * heads * N * d;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(t % d), j = static_cast<int>((t / d) % N), h = static_cast<int>((t / d / N) % heads);
    const std::int64_t b = t / d / N / heads;
    const float k = qkv[(b * N + j) * Ct + heads * d + h * d + c];
    kp[t] = s * k + a * pos[(per_head ? static_cast<std::int64_t>(h) * N * d : 0) + static_cast<std::int64_t>(j) * d + c];
  }
}

// dK = s dK', d pos += a sum over images (and heads, if shared) of dK'.
__global__ void absolute_back_kernel(const float* dkp, float* dqkv, float* dpos, int B, int heads, int N, int d, int Ct,
                                     bool per_head, float s, float a) {
  const std::int64_t total = static_cast<std::int64_t>(B) * heads * N * d;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(t % d), j = static_cast<int>((t / d) % N), h = static_cast<int>((t / d / N) % heads);
    const std::int64_t b = t / d / N / heads;
    dqkv[(b * N + j) * Ct + heads * d + h * d + c] = s * dkp[t];
  }
  // second half: one thread per table entry sums over images (and heads) in a fixed order
  const int entries = (per_head ? heads : 1) * N * d;
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < entries; e += gridDim.x * blockDim.x) {
    const int c = e % d, j = (e / d) % N, h0 = per_head ? e / (N * d) : 0;
    float sum = 0.0f;
    for (int b = 0; b < B; ++b)
      for (int h = per_head ? h0 : 0; h < (per_head ? h0 + 1 : heads); ++h)
        sum += dkp[((static_cast<std::int64_t>(b) * heads + h) * N + j) * d + c];
    dpos[e] = a * sum;
  }
}

int row_threads(std::int64_t n) { return n >= 1024 ? 256 : n >= 256 ? 128 : 64; }

// The dynamic shared-memory limit of a kernel is one setting for the whole process: it is raised
// once, to a fixed cap, and never lowered (setting it per launch to the launch's own size races
// with other threads' launches: seen as "invalid argument" with 8 threads on an H100).
constexpr std::size_t kSharedCap = 128 * 1024;

void launch_expand_softmax(float* L, const float* qh, const float* qw, const RowArgs& ra, unsigned images_heads) {
  static const cudaError_t raised = cudaFuncSetAttribute(
      expand_softmax_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSharedCap));
  RELPOS_CUDA_CHECK(raised);
  const std::size_t tables = static_cast<std::size_t>(ra.rel ? ra.Th + ra.Tw : 0) + 32;
  const bool in_shared = ra.N <= kMaxSharedRow && (tables + ra.N) * sizeof(float) <= kSharedCap;
  const std::size_t shm = (tables + (in_shared ? ra.N : 0)) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(ra.N), images_heads);
  if (in_shared) {
    expand_softmax_kernel<true><<<grid, row_threads(ra.N), shm, stream()>>>(L, qh, qw, ra);
  } else {
    expand_softmax_kernel<false><<<grid, row_threads(ra.N), shm, stream()>>>(L, qh, qw, ra);
  }
  RELPOS_CUDA_LAUNCHED();
}

}  // namespace

Tensor bot_attention(const Tensor& qkv_in, const Tensor& pos_h, const Tensor& pos_w, const BotAttnSpec& spec, Tensor* probs) {
  require_cuda(qkv_in, "attention");
  const Tensor qkv = qkv_in.channels_last();
  const BotGeometry g = bot_geometry(qkv, pos_h, pos_w, spec);
  const std::int64_t N = g.N, d = spec.dqk, H = spec.heads;
  Tensor out({g.B, g.Co, g.H, g.W}, Device::CUDA, Layout::ChannelsLast);
  Tensor L({g.B, H, N, N}, Device::CUDA);
  if (probs) *probs = L;
  const bool rel = spec.pos == PosEncoding::Relative, absolute = spec.pos == PosEncoding::Absolute;
  Tensor qh, qw, kp;
  if (rel) {
    qh = Tensor({H, g.B * N, g.Th}, Device::CUDA);
    qw = Tensor({H, g.B * N, g.Tw}, Device::CUDA);
  }
  if (absolute) {
    kp = Tensor({g.B, H, N, d}, Device::CUDA);
    kprime_kernel<<<std::min<unsigned>(blocks_for(kp.numel()), 8192), 256, 0, stream()>>>(
        qkv.data(), pos_h.data(), kp.data(), static_cast<int>(g.B), static_cast<int>(H), static_cast<int>(N),
        static_cast<int>(d), static_cast<int>(g.Ct), spec.per_head, g.s, g.alpha_pos);
    RELPOS_CUDA_LAUNCHED();
  }
  for (int h = 0; h < spec.heads; ++h) {
    float* Lh = L.data() + h * N * N;
    const float* Q = g.q_ptr(qkv.data(), 0, h);
    if (absolute)
      gemm_batched(false, true, N, N, d, 1.0f, Q, g.Ct, N * g.Ct, kp.data() + h * N * d, d, H * N * d, 0.0f, Lh, N,
                   H * N * N, g.B);
    else
      gemm_batched(false, true, N, N, d, g.s, Q, g.Ct, N * g.Ct, g.k_ptr(qkv.data(), 0, h), g.Ct, N * g.Ct, 0.0f, Lh, N,
                   H * N * N, g.B);
    if (rel) {
      gemm(false, true, g.B * N, g.Th, d, g.alpha_pos, Q, g.Ct, g.table_h(pos_h.data(), h), d, 0.0f,
           qh.data() + h * g.B * N * g.Th, g.Th);
      gemm(false, true, g.B * N, g.Tw, d, g.alpha_pos, Q, g.Ct, g.table_w(pos_w.data(), h), d, 0.0f,
           qw.data() + h * g.B * N * g.Tw, g.Tw);
    }
  }
  const RowArgs ra{static_cast<int>(N), static_cast<int>(g.H), static_cast<int>(g.W), static_cast<int>(H),
                   static_cast<int>(g.B), static_cast<int>(g.Th), static_cast<int>(g.Tw), g.kh, g.kw, rel, true};
  launch_expand_softmax(L.data(), rel ? qh.data() : nullptr, rel ? qw.data() : nullptr, ra, static_cast<unsigned>(g.B * H));
  for (int h = 0; h < spec.heads; ++h)
    gemm_batched(false, false, N, spec.dv, N, 1.0f, L.data() + h * N * N, N, H * N * N, g.v_ptr(qkv.data(), 0, h), g.Ct,
                 N * g.Ct, 0.0f, out.data() + h * spec.dv, g.Co, N * g.Co, g.B);
  return out;
}

ops::BotAttnGrads bot_attention_backward(const Tensor& qkv_in, const Tensor& pos_h, const Tensor& pos_w,
                                         const BotAttnSpec& spec, const Tensor& probs, const Tensor& dout_in) {
  require_cuda(qkv_in, "attention backward");
  const Tensor qkv = qkv_in.channels_last();
  const Tensor dout = dout_in.channels_last();
  const BotGeometry g = bot_geometry(qkv, pos_h, pos_w, spec);
  const std::int64_t N = g.N, d = spec.dqk, H = spec.heads;
  RELPOS_CHECK(probs.shape() == Shape({g.B, H, N, N}) && probs.is_cuda(), "attention backward: saved probabilities do not fit");
  RELPOS_CHECK(dout.shape() == Shape({g.B, g.Co, g.H, g.W}), "attention backward: gradient " << dout.describe());
  const bool rel = spec.pos == PosEncoding::Relative, absolute = spec.pos == PosEncoding::Absolute;
  ops::BotAttnGrads grads;
  grads.dqkv = Tensor(qkv.shape(), Device::CUDA, Layout::ChannelsLast);
  if (rel || absolute) grads.dpos_h = Tensor(pos_h.shape(), Device::CUDA);
  if (rel) grads.dpos_w = Tensor(pos_w.shape(), Device::CUDA);
  Tensor dL({g.B, H, N, N}, Device::CUDA);
  for (int h = 0; h < spec.heads; ++h) {
    const float* dO = dout.data() + h * spec.dv;
    gemm_batched(true, false, N, spec.dv, N, 1.0f, probs.data() + h * N * N, N, H * N * N, dO, g.Co, N * g.Co, 0.0f,
                 g.v_ptr(grads.dqkv.data(), 0, h), g.Ct, N * g.Ct, g.B);
    gemm_batched(false, true, N, N, spec.dv, 1.0f, dO, g.Co, N * g.Co, g.v_ptr(qkv.data(), 0, h), g.Ct, N * g.Ct, 0.0f,
                 dL.data() + h * N * N, N, H * N * N, g.B);
  }
  Tensor dqh, dqw;
  if (rel) {
    dqh = Tensor({H, g.B * N, g.Th}, Device::CUDA);
    dqw = Tensor({H, g.B * N, g.Tw}, Device::CUDA);
  }
  const RowArgs ra{static_cast<int>(N), static_cast<int>(g.H), static_cast<int>(g.W), static_cast<int>(H),
                   static_cast<int>(g.B), static_cast<int>(g.Th), static_cast<int>(g.Tw), g.kh, g.kw, rel, true};
  {
    static const cudaError_t raised = cudaFuncSetAttribute(
        softmax_back_reduce_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSharedCap));
    RELPOS_CUDA_CHECK(raised);
    const std::size_t sums = static_cast<std::size_t>(rel ? g.H + g.W : 0) + 32;
    const bool in_shared = rel && N <= kMaxSharedRow && (sums + static_cast<std::size_t>(N)) * sizeof(float) <= kSharedCap;
    const std::size_t shm = (sums + (in_shared ? static_cast<std::size_t>(N) : 0)) * sizeof(float);
    const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(g.B * H));
    if (in_shared) {
      softmax_back_reduce_kernel<true><<<grid, row_threads(N), shm, stream()>>>(
          probs.data(), dL.data(), dqh.data(), dqw.data(), ra, g.alpha_pos);
    } else {
      softmax_back_reduce_kernel<false><<<grid, row_threads(N), shm, stream()>>>(
          probs.data(), dL.data(), rel ? dqh.data() : nullptr, rel ? dqw.data() : nullptr, ra, g.alpha_pos);
    }
    RELPOS_CUDA_LAUNCHED();
  }
  if (absolute) {
    Tensor kp({g.B, H, N, d}, Device::CUDA), dkp({g.B, H, N, d}, Device::CUDA);
    kprime_kernel<<<std::min<unsigned>(blocks_for(kp.numel()), 8192), 256, 0, stream()>>>(
        qkv.data(), pos_h.data(), kp.data(), static_cast<int>(g.B), static_cast<int>(H), static_cast<int>(N),
        static_cast<int>(d), static_cast<int>(g.Ct), spec.per_head, g.s, g.alpha_pos);
    RELPOS_CUDA_LAUNCHED();
    for (int h = 0; h < spec.heads; ++h) {
      const float* dLh = dL.data() + h * N * N;
      gemm_batched(false, false, N, d, N, 1.0f, dLh, N, H * N * N, kp.data() + h * N * d, d, H * N * d, 0.0f,
                   g.q_ptr(grads.dqkv.data(), 0, h), g.Ct, N * g.Ct, g.B);
      gemm_batched(true, false, N, d, N, 1.0f, dLh, N, H * N * N, g.q_ptr(qkv.data(), 0, h), g.Ct, N * g.Ct, 0.0f,
                   dkp.data() + h * N * d, d, H * N * d, g.B);
    }
    absolute_back_kernel<<<std::min<unsigned>(blocks_for(dkp.numel()), 8192), 256, 0, stream()>>>(
        dkp.data(), grads.dqkv.data(), grads.dpos_h.data(), static_cast<int>(g.B), static_cast<int>(H),
        static_cast<int>(N), static_cast<int>(d), static_cast<int>(g.Ct), spec.per_head, g.s, g.alpha_pos);
    RELPOS_CUDA_LAUNCHED();
    return grads;
  }
  for (int h = 0; h < spec.heads; ++h) {
    const float* dLh = dL.data() + h * N * N;
    float* dQ = g.q_ptr(grads.dqkv.data(), 0, h);
    const float* Q = g.q_ptr(qkv.data(), 0, h);
    gemm_batched(false, false, N, d, N, g.s, dLh, N, H * N * N, g.k_ptr(qkv.data(), 0, h), g.Ct, N * g.Ct, 0.0f, dQ, g.Ct,
                 N * g.Ct, g.B);
    gemm_batched(true, false, N, d, N, g.s, dLh, N, H * N * N, Q, g.Ct, N * g.Ct, 0.0f, g.k_ptr(grads.dqkv.data(), 0, h),
                 g.Ct, N * g.Ct, g.B);
    if (!rel) continue;
    const float* dqh_h = dqh.data() + h * g.B * N * g.Th;
    const float* dqw_h = dqw.data() + h * g.B * N * g.Tw;
    gemm(false, false, g.B * N, d, g.Th, 1.0f, dqh_h, g.Th, g.table_h(pos_h.data(), h), d, 1.0f, dQ, g.Ct);
    gemm(false, false, g.B * N, d, g.Tw, 1.0f, dqw_h, g.Tw, g.table_w(pos_w.data(), h), d, 1.0f, dQ, g.Ct);
    const float beta = (spec.per_head || h == 0) ? 0.0f : 1.0f;  // shared tables sum over heads
    gemm(true, false, g.Th, d, g.B * N, 1.0f, dqh_h, g.Th, Q, g.Ct, beta, g.table_h(grads.dpos_h.data(), h), d);
    gemm(true, false, g.Tw, d, g.B * N, 1.0f, dqw_h, g.Tw, Q, g.Ct, beta, g.table_w(grads.dpos_w.data(), h), d);
  }
  return grads;
}

Tensor rel_pos_logits(const Tensor& q_in, const Tensor& table_h, const Tensor& table_w, int height, int width, int clip) {
  require_cuda(q_in, "rel_pos_logits");
  const Tensor q = q_in.contiguous();
  RELPOS_CHECK(q.ndim() == 3 && q.dim(1) == static_cast<std::int64_t>(height) * width, "rel_pos_logits: q " << q.describe());
  const std::int64_t bh = q.dim(0), N = q.dim(1), d = q.dim(2);
  const int kh = clip > 0 ? clip : height - 1, kw = clip > 0 ? clip : width - 1;
  const std::int64_t th = 2 * kh + 1, tw = 2 * kw + 1;
  RELPOS_CHECK(table_h.shape() == Shape({th, d}) && table_w.shape() == Shape({tw, d}), "rel_pos_logits: tables do not fit");
  Tensor qh({bh * N, th}, Device::CUDA), qw({bh * N, tw}, Device::CUDA);
  gemm(false, true, bh * N, th, d, 1.0f, q.data(), d, table_h.data(), d, 0.0f, qh.data(), th);
  gemm(false, true, bh * N, tw, d, 1.0f, q.data(), d, table_w.data(), d, 0.0f, qw.data(), tw);
  Tensor out = Tensor::zeros({bh, N, N}, Device::CUDA);
  // heads = 1 and B = bh: the kernel's (head, image) indexing of qh reduces to image-major rows
  const RowArgs ra{static_cast<int>(N), height, width, 1, static_cast<int>(bh), static_cast<int>(th), static_cast<int>(tw),
                   kh, kw, true, false};
  launch_expand_softmax(out.data(), qh.data(), qw.data(), ra, static_cast<unsigned>(bh));
  return out;
}

}  // namespace relpos::cuda
