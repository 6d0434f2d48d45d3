// Winograd F(4x4, 3x3) convolution kernels, AVX2 + FMA (this file alone is built with -mavx2
// -mfma; conv2d.cpp checks the CPU before calling in). See conv2d_winograd.hpp.
//
// With d a 6x6 input tile, g a 3x3 kernel and Y the 4x4 output tile of their correlation:
//   Y = A^T [ (G g G^T) (.) (B^T d B) ] A
// where (.) multiplies elementwise, and, for the interpolation points 0, 1, -1, 2, -2 and infinity,
//   B^T = [4  0 -5  0 1 0;  0 -4 -4  1 1 0;  0  4 -4 -1 1 0;  0 -2 -1 2 1 0;  0 2 -1 -2 1 0;  0 4 0 -5 0 1]
//   G   = [1/4 0 0;  -1/6 -1/6 -1/6;  -1/6 1/6 -1/6;  1/24 1/12 1/6;  1/24 -1/12 1/6;  0 0 1]
//   A^T = [1 1 1 1 1 0;  0 1 -1 2 -2 0;  0 1 1 4 4 0;  0 1 -1 8 -8 1]
// Summed over input channels, the elementwise products become 36 matrix products
// M[p] (tiles x out) = V[p] (tiles x in) * U[p] (in x out), one per position p of the 6x6 tile.
//
// The work is split into chunks of tiles, each thread taking whole chunks: it transforms the
// chunk's input tiles into V, runs the 36 products into M with a 6x16 register-blocked kernel, and
// transforms M back into the output. A chunk's V and M stay within the core's L2 cache.
#include "cpu/conv2d_winograd.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <new>

namespace relpos::cpu::winograd {

namespace {

constexpr int kTile = 4;       // output tile
constexpr int kIn = 6;         // input tile
constexpr int kPos = 36;       // positions in the transformed tile
constexpr int kRows = 6;       // tiles per register block of the matrix product
constexpr int kCols = 16;      // output channels per register block

// B^T applied to six vectors (a column or a row of the input tile).
inline void input_1d(const __m256 d[6], __m256 r[6]) {
  const __m256 four = _mm256_set1_ps(4.0f), five = _mm256_set1_ps(5.0f), two = _mm256_set1_ps(2.0f);
  r[0] = _mm256_fmadd_ps(four, d[0], _mm256_fnmadd_ps(five, d[2], d[4]));
  r[1] = _mm256_fnmadd_ps(four, _mm256_add_ps(d[1], d[2]), _mm256_add_ps(d[3], d[4]));
  r[2] = _mm256_fmadd_ps(four, _mm256_sub_ps(d[1], d[2]), _mm256_sub_ps(d[4], d[3]));
  r[3] = _mm256_fmadd_ps(two, _mm256_sub_ps(d[3], d[1]), _mm256_sub_ps(d[4], d[2]));
  r[4] = _mm256_fmadd_ps(two, _mm256_sub_ps(d[1], d[3]), _mm256_sub_ps(d[4], d[2]));
  r[5] = _mm256_fmadd_ps(four, d[1], _mm256_fnmadd_ps(five, d[3], d[5]));
}

// A^T applied to six vectors.
inline void output_1d(const __m256 m[6], __m256 o[4]) {
  const __m256 s12 = _mm256_add_ps(m[1], m[2]), d12 = _mm256_sub_ps(m[1], m[2]);
  const __m256 s34 = _mm256_add_ps(m[3], m[4]), d34 = _mm256_sub_ps(m[3], m[4]);
  o[0] = _mm256_add_ps(_mm256_add_ps(m[0], s12), s34);
  o[1] = _mm256_fmadd_ps(_mm256_set1_ps(2.0f), d34, d12);
  o[2] = _mm256_fmadd_ps(_mm256_set1_ps(4.0f), s34, s12);
  o[3] = _mm256_add_ps(_mm256_fmadd_ps(_mm256_set1_ps(8.0f), d34, d12), m[5]);
}

struct Geometry {
  std::int64_t n, h, w, in, out, out_pad, tiles_y, tiles_x;
};

// The input tiles first..first+count of the batch, transformed into v: [36][count][in].
void transform_input(const float* x, const Geometry& g, std::int64_t first, std::int64_t count, float* v) {
  const std::int64_t per_image = g.tiles_y * g.tiles_x;
  const std::int64_t pos_stride = count * g.in;
  for (std::int64_t t = 0; t < count; ++t) {
    const std::int64_t tile = first + t;
    const std::int64_t img = tile / per_image, ty = (tile % per_image) / g.tiles_x, tx = tile % g.tiles_x;
    const std::int64_t y0 = ty * kTile - 1, x0 = tx * kTile - 1;
    const bool inside = y0 >= 0 && x0 >= 0 && y0 + kIn <= g.h && x0 + kIn <= g.w;
    float* out = v + t * g.in;
    for (std::int64_t c = 0; c < g.in; c += 8) {
      __m256 d[kIn][kIn];
      for (int i = 0; i < kIn; ++i)
        for (int j = 0; j < kIn; ++j) {
          const std::int64_t yy = y0 + i, xx = x0 + j;  // the tile's pixel, -1 or past the edge in the padding
          const bool in_bounds = inside || (yy >= 0 && yy < g.h && xx >= 0 && xx < g.w);
          d[i][j] = in_bounds ? _mm256_loadu_ps(x + ((img * g.h + yy) * g.w + xx) * g.in + c) : _mm256_setzero_ps();
        }
      // columns, then rows
      __m256 t1[kIn][kIn];
      for (int j = 0; j < kIn; ++j) {
        __m256 col[kIn], r[kIn];
        for (int i = 0; i < kIn; ++i) col[i] = d[i][j];
        input_1d(col, r);
        for (int i = 0; i < kIn; ++i) t1[i][j] = r[i];
      }
      for (int i = 0; i < kIn; ++i) {
        __m256 r[kIn];
        input_1d(t1[i], r);
        for (int j = 0; j < kIn; ++j) _mm256_storeu_ps(out + (i * kIn + j) * pos_stride + c, r[j]);
      }
    }
  }
}

// m[rows x 16] = v[rows x in] * u[in x 16], for R < 6 rows (the last block of a chunk); v's rows
// are `in` apart, m's `ldm`.
template <int R>
void product_block(const float* v, const float* u, std::int64_t in, float* m, std::int64_t ldm) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (std::int64_t k = 0; k < in; ++k) {
    const __m256 b0 = _mm256_loadu_ps(u + k * kCols), b1 = _mm256_loadu_ps(u + k * kCols + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(v + r * in + k);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(m + r * ldm, acc[r][0]);
    _mm256_storeu_ps(m + r * ldm + 8, acc[r][1]);
  }
}

// The same for 6 rows, with the twelve accumulators as named variables: GCC 12 keeps an array of
// them in registers but also stores it to the stack on every iteration.
void product_block6(const float* v, const float* u, std::int64_t in, float* m, std::int64_t ldm) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
  __m256 a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
  const float *v0 = v, *v1 = v + in, *v2 = v + 2 * in, *v3 = v + 3 * in, *v4 = v + 4 * in, *v5 = v + 5 * in;
  for (std::int64_t k = 0; k < in; ++k) {
    const __m256 b0 = _mm256_loadu_ps(u + k * kCols), b1 = _mm256_loadu_ps(u + k * kCols + 8);
    __m256 a = _mm256_broadcast_ss(v0 + k);
    a00 = _mm256_fmadd_ps(a, b0, a00);
    a01 = _mm256_fmadd_ps(a, b1, a01);
    a = _mm256_broadcast_ss(v1 + k);
    a10 = _mm256_fmadd_ps(a, b0, a10);
    a11 = _mm256_fmadd_ps(a, b1, a11);
    a = _mm256_broadcast_ss(v2 + k);
    a20 = _mm256_fmadd_ps(a, b0, a20);
    a21 = _mm256_fmadd_ps(a, b1, a21);
    a = _mm256_broadcast_ss(v3 + k);
    a30 = _mm256_fmadd_ps(a, b0, a30);
    a31 = _mm256_fmadd_ps(a, b1, a31);
    a = _mm256_broadcast_ss(v4 + k);
    a40 = _mm256_fmadd_ps(a, b0, a40);
    a41 = _mm256_fmadd_ps(a, b1, a41);
    a = _mm256_broadcast_ss(v5 + k);
    a50 = _mm256_fmadd_ps(a, b0, a50);
    a51 = _mm256_fmadd_ps(a, b1, a51);
  }
  _mm256_storeu_ps(m, a00);
  _mm256_storeu_ps(m + 8, a01);
  _mm256_storeu_ps(m + ldm, a10);
  _mm256_storeu_ps(m + ldm + 8, a11);
  _mm256_storeu_ps(m + 2 * ldm, a20);
  _mm256_storeu_ps(m + 2 * ldm + 8, a21);
  _mm256_storeu_ps(m + 3 * ldm, a30);
  _mm256_storeu_ps(m + 3 * ldm + 8, a31);
  _mm256_storeu_ps(m + 4 * ldm, a40);
  _mm256_storeu_ps(m + 4 * ldm + 8, a41);
  _mm256_storeu_ps(m + 5 * ldm, a50);
  _mm256_storeu_ps(m + 5 * ldm + 8, a51);
}

// M[p] = V[p] * U[p] for the 36 positions; v: [36][count][in], m: [36][count][out_pad].
void products(const float* v, const Weights& wt, std::int64_t count, float* m) {
  const std::int64_t blocks = wt.out_pad / kCols;
  for (int p = 0; p < kPos; ++p) {
    const float* vp = v + p * count * wt.in;
    float* mp = m + p * count * wt.out_pad;
    for (std::int64_t b = 0; b < blocks; ++b) {
      const float* u = wt.u.data() + (p * blocks + b) * wt.in * kCols;
      std::int64_t r = 0;
      for (; r + kRows <= count; r += kRows)
        product_block6(vp + r * wt.in, u, wt.in, mp + r * wt.out_pad + b * kCols, wt.out_pad);
      const float* vr = vp + r * wt.in;
      float* mr = mp + r * wt.out_pad + b * kCols;
      switch (count - r) {
        case 5: product_block<5>(vr, u, wt.in, mr, wt.out_pad); break;
        case 4: product_block<4>(vr, u, wt.in, mr, wt.out_pad); break;
        case 3: product_block<3>(vr, u, wt.in, mr, wt.out_pad); break;
        case 2: product_block<2>(vr, u, wt.in, mr, wt.out_pad); break;
        case 1: product_block<1>(vr, u, wt.in, mr, wt.out_pad); break;
        default: break;
      }
    }
  }
}

// The products of tiles first..first+count back into the output, with bias and activation.
void transform_output(const float* m, const Geometry& g, const Weights& wt, Act act, std::int64_t first,
                      std::int64_t count, float* y) {
  const std::int64_t per_image = g.tiles_y * g.tiles_x;
  const std::int64_t pos_stride = count * g.out_pad;
  const __m256 zero = _mm256_setzero_ps();
  for (std::int64_t t = 0; t < count; ++t) {
    const std::int64_t tile = first + t;
    const std::int64_t img = tile / per_image, ty = (tile % per_image) / g.tiles_x, tx = tile % g.tiles_x;
    const std::int64_t y0 = ty * kTile, x0 = tx * kTile;
    const int rows = static_cast<int>(std::min<std::int64_t>(kTile, g.h - y0));
    const int cols = static_cast<int>(std::min<std::int64_t>(kTile, g.w - x0));
    const float* in = m + t * g.out_pad;
    float* base = y + ((img * g.h + y0) * g.w + x0) * g.out;
    for (std::int64_t c = 0; c < g.out; c += 8) {
      const __m256 bias = _mm256_loadu_ps(wt.bias.data() + c);
      __m256 t1[kTile][kIn];
      for (int j = 0; j < kIn; ++j) {
        __m256 col[kIn], o[kTile];
        for (int i = 0; i < kIn; ++i) col[i] = _mm256_loadu_ps(in + (i * kIn + j) * pos_stride + c);
        output_1d(col, o);
        for (int i = 0; i < kTile; ++i) t1[i][j] = o[i];
      }
      for (int i = 0; i < rows; ++i) {
        __m256 o[kTile];
        output_1d(t1[i], o);
        for (int j = 0; j < cols; ++j) {
          __m256 r = _mm256_add_ps(o[j], bias);
          if (act == Act::ReLU) r = _mm256_max_ps(r, zero);
          _mm256_storeu_ps(base + (i * g.w + j) * g.out + c, r);
        }
      }
    }
  }
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};

}  // namespace

std::shared_ptr<Weights> transform_weights(const float* w, std::int64_t out, std::int64_t in, const float* bias,
                                           bool turned) {
  static const double G[kIn][3] = {{1.0 / 4, 0, 0},
                                    {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                    {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                    {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                    {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                    {0, 0, 1}};
  auto wt = std::make_shared<Weights>();
  wt->in = in;
  wt->out = out;
  wt->out_pad = (out + kCols - 1) / kCols * kCols;
  const std::int64_t blocks = wt->out_pad / kCols;
  wt->u.assign(static_cast<std::size_t>(kPos * wt->out_pad * in), 0.0f);
  wt->bias.assign(static_cast<std::size_t>(out), 0.0f);
  if (bias) std::copy(bias, bias + out, wt->bias.begin());
  float* u_out = wt->u.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t c = 0; c < in; ++c) {
      double k[3][3];
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j)
          k[i][j] = turned ? w[((c * out + o) * 3 + 2 - i) * 3 + 2 - j] : w[((o * in + c) * 3 + i) * 3 + j];
      double gk[kIn][3];  // G g
      for (int i = 0; i < kIn; ++i)
        for (int j = 0; j < 3; ++j) gk[i][j] = G[i][0] * k[0][j] + G[i][1] * k[1][j] + G[i][2] * k[2][j];
      for (int i = 0; i < kIn; ++i)
        for (int j = 0; j < kIn; ++j) {
          const double u = gk[i][0] * G[j][0] + gk[i][1] * G[j][1] + gk[i][2] * G[j][2];  // (G g) G^T
          const std::int64_t p = i * kIn + j;
          u_out[((p * blocks + o / kCols) * in + c) * kCols + o % kCols] = static_cast<float>(u);
        }
    }
  return wt;
}

void conv3x3(const float* x, std::int64_t n, std::int64_t h, std::int64_t w, const Weights& wt, Act act, float* y) {
  Geometry g{n, h, w, wt.in, wt.out, wt.out_pad, (h + kTile - 1) / kTile, (w + kTile - 1) / kTile};
  const std::int64_t tiles = n * g.tiles_y * g.tiles_x;
  // Tiles per chunk: V and M of a chunk within about 384 KiB (most of a core's L2), at least one
  // register block, and as many chunks per thread as the work allows.
  const std::int64_t per_tile = kPos * (g.in + g.out_pad) * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t most = std::max<std::int64_t>(kRows, (384 << 10) / per_tile);
  const int threads = std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>((tiles + kRows - 1) / kRows)));
  std::int64_t chunks = (tiles + most - 1) / most;
  chunks = (chunks + threads - 1) / threads * threads;
  const std::int64_t per_chunk = (tiles + chunks - 1) / chunks;
  chunks = (tiles + per_chunk - 1) / per_chunk;
  const std::size_t v_size = static_cast<std::size_t>(kPos * per_chunk * g.in);
  const std::size_t m_size = static_cast<std::size_t>(kPos * per_chunk * g.out_pad);
  const std::size_t per_thread = ((v_size + m_size) * sizeof(float) + 63) / 64 * 64;  // bytes
  std::unique_ptr<float, AlignedFree> buf(static_cast<float*>(std::aligned_alloc(64, per_thread * threads)));
  if (!buf) throw std::bad_alloc();
#pragma omp parallel num_threads(threads)
  {
    float* v = buf.get() + per_thread / sizeof(float) * static_cast<std::size_t>(omp_get_thread_num());
    float* m = v + v_size;
#pragma omp for schedule(static)
    for (std::int64_t ch = 0; ch < chunks; ++ch) {
      const std::int64_t first = ch * per_chunk;
      const std::int64_t count = std::min(per_chunk, tiles - first);
      transform_input(x, g, first, count, v);
      products(v, wt, count, m);
      transform_output(m, g, wt, act, first, count, y);
    }
  }
}

}  // namespace relpos::cpu::winograd
