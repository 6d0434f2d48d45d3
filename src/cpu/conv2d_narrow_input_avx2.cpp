// The kernels of the 3x3 convolutions of inputs with few channels (conv2d_narrow_input.hpp), built
// with AVX2 and FMA (CMakeLists.txt sets -mavx2 -mfma for this file only); suits() keeps them to
// CPUs that have both. No standard-library templates here (and no std::vector: the packed kernels
// come as pointers), so no out-of-line copy built for AVX2 can be picked by the linker for code that
// runs on another CPU.
#include <immintrin.h>
#include <omp.h>

#include "cpu/conv2d_narrow_input.hpp"

namespace relpos::cpu::narrow_input {

namespace {

// An input row (w values, sx floats apart) into dst with a zero on its left and zeros after it up to
// len floats
void padded_row(const float* src, std::int64_t w, std::int64_t sx, std::int64_t len, float* dst) {
  dst[0] = 0.0f;
  if (sx == 1)
    __builtin_memcpy(dst + 1, src, static_cast<std::size_t>(w) * sizeof(float));
  else
    for (std::int64_t ix = 0; ix < w; ++ix) dst[ix + 1] = src[ix * sx];
  for (std::int64_t i = w + 1; i < len; ++i) dst[i] = 0.0f;
}

// V vectors of 8 output channels for P = 12 / V pixels at a time: 12 sums in registers, V kernel
// vectors and a broadcast input value beside them. For each output row, the input rows under it are
// first copied planar with a zero on either side (and zero rows above and below the map), so the
// products read each input value straight from that copy.
template <int V>
void conv_lanes(const InputView& x, int stride, const PackedKernels& wt, Act act, float* y) {
  constexpr int P = 12 / V;
  const std::int64_t oh = (x.h - 1) / stride + 1, ow = (x.w - 1) / stride + 1;
  const int in = static_cast<int>(wt.in);
  const std::int64_t out = wt.out;
  // a row of the copy: the map's width, a zero on the left, zeros on the right up to the last
  // block's last pixel (its padding column and the columns of the pixels past the row's end)
  const std::int64_t blocks = (ow + P - 1) / P;
  const std::int64_t row_len = blocks * P * stride + 3;
  const float* wp = wt.w;
  const float* bp = wt.bias;
  const bool relu = act == Act::ReLU;
  // each thread's copy of the rows, allocated before the team starts (a failed allocation throws
  // here, not inside it)
  const int threads = omp_get_max_threads();
  const std::int64_t per_thread = (in * 3 * row_len + 15) / 16 * 16;
  float* const scratch = new float[static_cast<std::size_t>(per_thread * threads)];
#pragma omp parallel num_threads(threads)
  {
    float* rows = scratch + per_thread * omp_get_thread_num();
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < x.n * oh; ++r) {
      const std::int64_t b = r / oh, oy = r % oh;
      const float* img = x.data + b * x.sb;
      for (int c = 0; c < in; ++c)
        for (int ky = 0; ky < 3; ++ky) {
          float* dst = rows + (c * 3 + ky) * row_len;
          const std::int64_t iy = oy * stride - 1 + ky;
          if (iy < 0 || iy >= x.h) {
            for (std::int64_t i = 0; i < row_len; ++i) dst[i] = 0.0f;
            continue;
          }
          padded_row(img + c * x.sc + iy * x.sy, x.w, x.sx, row_len, dst);
        }
      for (std::int64_t blk = 0; blk < blocks; ++blk) {
        const std::int64_t ox0 = blk * P;
        __m256 acc[P][V];
        for (int v = 0; v < V; ++v) {
          const __m256 bias = _mm256_loadu_ps(bp + 8 * v);
          for (int p = 0; p < P; ++p) acc[p][v] = bias;
        }
        for (int row = 0; row < in * 3; ++row) {  // input channel c = row / 3, kernel row ky = row % 3
          const float* tap = rows + row * row_len + ox0 * stride;
          const float* k_row = wp + row * 3 * out;
#pragma GCC unroll 3
          for (int kx = 0; kx < 3; ++kx) {
            __m256 k[V];
#pragma GCC unroll 4
            for (int v = 0; v < V; ++v) k[v] = _mm256_loadu_ps(k_row + kx * out + 8 * v);
#pragma GCC unroll 12
            for (int p = 0; p < P; ++p) {
              const __m256 a = _mm256_broadcast_ss(tap + p * stride + kx);
#pragma GCC unroll 4
              for (int v = 0; v < V; ++v) acc[p][v] = _mm256_fmadd_ps(a, k[v], acc[p][v]);
            }
          }
        }
        float* dst = y + (r * ow + ox0) * out;
        // max(floor, sum) returns the sum where it is NaN (vmaxps returns its second operand then)
        const __m256 floor = relu ? _mm256_setzero_ps() : _mm256_set1_ps(-__builtin_inff());
        if (ox0 + P <= ow) {
#pragma GCC unroll 12
          for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
            for (int v = 0; v < V; ++v) _mm256_storeu_ps(dst + p * out + 8 * v, _mm256_max_ps(floor, acc[p][v]));
        } else {  // the row's last pixels: through a copy, so the sums above stay in registers
          __m256 last[P][V];
          for (int p = 0; p < P; ++p)
            for (int v = 0; v < V; ++v) last[p][v] = _mm256_max_ps(floor, acc[p][v]);
          for (int p = 0; p < ow - ox0; ++p)
            for (int v = 0; v < V; ++v) _mm256_storeu_ps(dst + p * out + 8 * v, last[p][v]);
        }
      }
    }
  }
  delete[] scratch;
}

// The weight gradient's sums for the rows [r0, r1) of the output (image b = r / oh, output row r %
// oh): s[(c * 3 + ky) * 3 + kx][o] += sum over the row's pixels of dy[pixel][o] * x at the tap. For
// each (c, ky) the row's three taps x V vectors of output channels stay in registers across the
// row's pixels (12 sums, 3 broadcasts and a gradient vector at V = 4); the input row under the
// output row is copied with a zero on either side first, as in conv_lanes.
template <int V>
void weight_grad_lanes(const InputView& x, int stride, const float* dy, std::int64_t in, std::int64_t out,
                       std::int64_t r0, std::int64_t r1, float* rows, float* s) {
  const std::int64_t oh = (x.h - 1) / stride + 1, ow = (x.w - 1) / stride + 1;
  const std::int64_t row_len = ow * stride + 2;
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t b = r / oh, oy = r % oh;
    const float* g = dy + r * ow * out;
    for (std::int64_t c = 0; c < in; ++c)
      for (int ky = 0; ky < 3; ++ky) {
        const std::int64_t iy = oy * stride - 1 + ky;
        if (iy < 0 || iy >= x.h) continue;  // a zero row adds nothing
        padded_row(x.data + b * x.sb + c * x.sc + iy * x.sy, x.w, x.sx, row_len, rows);
        float* sk = s + (c * 3 + ky) * 3 * out;
        __m256 acc[3][V];
#pragma GCC unroll 3
        for (int kx = 0; kx < 3; ++kx)
#pragma GCC unroll 4
          for (int v = 0; v < V; ++v) acc[kx][v] = _mm256_loadu_ps(sk + kx * out + 8 * v);
        for (std::int64_t ox = 0; ox < ow; ++ox) {
          const float* tap = rows + ox * stride;
          const __m256 a0 = _mm256_broadcast_ss(tap), a1 = _mm256_broadcast_ss(tap + 1),
                       a2 = _mm256_broadcast_ss(tap + 2);
#pragma GCC unroll 4
          for (int v = 0; v < V; ++v) {
            const __m256 d = _mm256_loadu_ps(g + ox * out + 8 * v);
            acc[0][v] = _mm256_fmadd_ps(a0, d, acc[0][v]);
            acc[1][v] = _mm256_fmadd_ps(a1, d, acc[1][v]);
            acc[2][v] = _mm256_fmadd_ps(a2, d, acc[2][v]);
          }
        }
#pragma GCC unroll 3
        for (int kx = 0; kx < 3; ++kx)
#pragma GCC unroll 4
          for (int v = 0; v < V; ++v) _mm256_storeu_ps(sk + kx * out + 8 * v, acc[kx][v]);
      }
  }
}

}  // namespace

void weight_grad_rows_avx2(const InputView& x, int stride, const float* dy, std::int64_t in, std::int64_t out,
                           std::int64_t r0, std::int64_t r1, float* rows, float* sums) {
  switch (out / 8) {
    case 1: return weight_grad_lanes<1>(x, stride, dy, in, out, r0, r1, rows, sums);
    case 2: return weight_grad_lanes<2>(x, stride, dy, in, out, r0, r1, rows, sums);
    case 3: return weight_grad_lanes<3>(x, stride, dy, in, out, r0, r1, rows, sums);
    default: return weight_grad_lanes<4>(x, stride, dy, in, out, r0, r1, rows, sums);
  }
}

void conv3x3_avx2(const InputView& x, int stride, const PackedKernels& wt, Act act, float* y) {
  switch (wt.out / 8) {
    case 1: return conv_lanes<1>(x, stride, wt, act, y);
    case 2: return conv_lanes<2>(x, stride, wt, act, y);
    case 3: return conv_lanes<3>(x, stride, wt, act, y);
    default: return conv_lanes<4>(x, stride, wt, act, y);
  }
}

}  // namespace relpos::cpu::narrow_input
