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

// G, in double: the kernels' transforms (forward and weight gradient) are made with it.
constexpr double G[kIn][3] = {{1.0 / 4, 0, 0},         {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                              {1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6},  {0, 0, 1}};

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

// A applied to four vectors (a column or a row of an output-gradient tile): the transpose of
// output_1d, as the weight gradient needs.
inline void grad_1d(const __m256 d[4], __m256 r[6]) {
  const __m256 s02 = _mm256_add_ps(d[0], d[2]), s13 = _mm256_add_ps(d[1], d[3]);
  const __m256 two = _mm256_set1_ps(2.0f), four = _mm256_set1_ps(4.0f), eight = _mm256_set1_ps(8.0f);
  const __m256 e = _mm256_fmadd_ps(four, d[2], d[0]), o = _mm256_fmadd_ps(eight, d[3], _mm256_mul_ps(two, d[1]));
  r[0] = d[0];
  r[1] = _mm256_add_ps(s02, s13);
  r[2] = _mm256_sub_ps(s02, s13);
  r[3] = _mm256_add_ps(e, o);
  r[4] = _mm256_sub_ps(e, o);
  r[5] = d[3];
}

struct Geometry {
  std::int64_t n, h, w, in, out, out_pad, tiles_y, tiles_x;
  // tile number -> image and the tile's first output row and column
  void locate(std::int64_t tile, std::int64_t& img, std::int64_t& y0, std::int64_t& x0) const {
    const std::int64_t per_image = tiles_y * tiles_x;
    img = tile / per_image;
    y0 = (tile % per_image) / tiles_x * kTile;
    x0 = tile % tiles_x * kTile;
  }
};

// M d M^T for an N x N tile d, M being K x N: `map` (N vectors to K) on the columns, then on the rows.
template <int N, int K, typename Map>
void transform_2d(const __m256 (&d)[N][N], const Map& map, __m256 (&out)[K][K]) {
  __m256 t1[K][N];
  for (int j = 0; j < N; ++j) {
    __m256 col[N], r[K];
    for (int i = 0; i < N; ++i) col[i] = d[i][j];
    map(col, r);
    for (int i = 0; i < K; ++i) t1[i][j] = r[i];
  }
  for (int i = 0; i < K; ++i) map(t1[i], out[i]);
}

// Where transform_input writes channel c of tile t at position p:
//   p * pos + t * tile + (c / 16) * block + c % 16
// ([36][count][in] for the forward; [36][in_pad / 16][count][16] for the weight gradient's products).
struct TileLayout {
  std::int64_t pos, tile, block;
  std::int64_t at(int p, std::int64_t t, std::int64_t c) const { return p * pos + t * tile + (c / 16) * block + c % 16; }
};

// The input tiles first..first+count of the batch, transformed (B^T d B) into v.
void transform_input(const float* x, const Geometry& g, std::int64_t first, std::int64_t count, const TileLayout& l,
                     float* v) {
  for (std::int64_t t = 0; t < count; ++t) {
    std::int64_t img, y0, x0;
    g.locate(first + t, img, y0, x0);
    --y0;  // the input tile starts one pixel up and left, in the padding at the edges
    --x0;
    const bool inside = y0 >= 0 && x0 >= 0 && y0 + kIn <= g.h && x0 + kIn <= g.w;
    for (std::int64_t c = 0; c < g.in; c += 8) {
      __m256 d[kIn][kIn], r[kIn][kIn];
      for (int i = 0; i < kIn; ++i)
        for (int j = 0; j < kIn; ++j) {
          const std::int64_t yy = y0 + i, xx = x0 + j;
          const bool in_bounds = inside || (yy >= 0 && yy < g.h && xx >= 0 && xx < g.w);
          d[i][j] = in_bounds ? _mm256_loadu_ps(x + ((img * g.h + yy) * g.w + xx) * g.in + c) : _mm256_setzero_ps();
        }
      transform_2d(d, input_1d, r);
      for (int i = 0; i < kIn; ++i)
        for (int j = 0; j < kIn; ++j) _mm256_storeu_ps(v + l.at(i * kIn + j, t, c), r[i][j]);
    }
  }
}

// m[rows x 16] = v[rows x in] * u[in x 16] (or m += with `add`), for R < 6 rows (the last block of
// a chunk); v's rows are `in` apart, m's `ldm`.
template <int R>
void product_block(const float* v, const float* u, std::int64_t in, float* m, std::int64_t ldm, bool add) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) {
    acc[r][0] = add ? _mm256_loadu_ps(m + r * ldm) : _mm256_setzero_ps();
    acc[r][1] = add ? _mm256_loadu_ps(m + r * ldm + 8) : _mm256_setzero_ps();
  }
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
void product_block6(const float* v, const float* u, std::int64_t in, float* m, std::int64_t ldm, bool add) {
  const auto start = [&](std::int64_t offset) { return add ? _mm256_loadu_ps(m + offset) : _mm256_setzero_ps(); };
  __m256 a00 = start(0), a01 = start(8), a10 = start(ldm), a11 = start(ldm + 8);
  __m256 a20 = start(2 * ldm), a21 = start(2 * ldm + 8), a30 = start(3 * ldm), a31 = start(3 * ldm + 8);
  __m256 a40 = start(4 * ldm), a41 = start(4 * ldm + 8), a50 = start(5 * ldm), a51 = start(5 * ldm + 8);
  const float *v0 = v, *v1 = v + in, *v2 = v + 2 * in, *v3 = v + 3 * in, *v4 = v + 4 * in, *v5 = v + 5 * in;
  for (std::int64_t k = 0; k < in; ++k) {
    const __m256 b0 = _mm256_loadu_ps(u + k * kCols), b1 = _mm256_loadu_ps(u + k * kCols + 8);
    const auto row = [&](const float* vr, __m256& lo, __m256& hi) {
      const __m256 a = _mm256_broadcast_ss(vr + k);
      lo = _mm256_fmadd_ps(a, b0, lo);
      hi = _mm256_fmadd_ps(a, b1, hi);
    };
    row(v0, a00, a01);
    row(v1, a10, a11);
    row(v2, a20, a21);
    row(v3, a30, a31);
    row(v4, a40, a41);
    row(v5, a50, a51);
  }
  const auto put = [&](std::int64_t r, __m256 lo, __m256 hi) {
    _mm256_storeu_ps(m + r * ldm, lo);
    _mm256_storeu_ps(m + r * ldm + 8, hi);
  };
  put(0, a00, a01);
  put(1, a10, a11);
  put(2, a20, a21);
  put(3, a30, a31);
  put(4, a40, a41);
  put(5, a50, a51);
}

// m (rows x 16 blocks, rows `ldm` apart) = v (rows x k, rows k apart) times u, packed as
// [blocks][k][16] with blocks `u_block` apart; or m += with `add`.
void product(const float* v, std::int64_t rows, std::int64_t k, const float* u, std::int64_t blocks,
             std::int64_t u_block, float* m, std::int64_t ldm, bool add) {
  for (std::int64_t b = 0; b < blocks; ++b) {
    const float* ub = u + b * u_block;
    std::int64_t r = 0;
    for (; r + kRows <= rows; r += kRows) product_block6(v + r * k, ub, k, m + r * ldm + b * kCols, ldm, add);
    const float* vr = v + r * k;
    float* mr = m + r * ldm + b * kCols;
    switch (rows - r) {
      case 5: product_block<5>(vr, ub, k, mr, ldm, add); break;
      case 4: product_block<4>(vr, ub, k, mr, ldm, add); break;
      case 3: product_block<3>(vr, ub, k, mr, ldm, add); break;
      case 2: product_block<2>(vr, ub, k, mr, ldm, add); break;
      case 1: product_block<1>(vr, ub, k, mr, ldm, add); break;
      default: break;
    }
  }
}

// M[p] = V[p] * U[p] for the 36 positions; v: [36][count][in], m: [36][count][out_pad].
void products(const float* v, const Weights& wt, std::int64_t count, float* m) {
  const std::int64_t blocks = wt.out_pad / kCols;
  for (int p = 0; p < kPos; ++p)
    product(v + p * count * wt.in, count, wt.in, wt.u.data() + p * blocks * wt.in * kCols, blocks, wt.in * kCols,
            m + p * count * wt.out_pad, wt.out_pad, false);
}

// The products of tiles first..first+count back into the output, with bias and activation.
void transform_output(const float* m, const Geometry& g, const Weights& wt, Act act, std::int64_t first,
                      std::int64_t count, float* y) {
  const std::int64_t pos_stride = count * g.out_pad;
  const __m256 zero = _mm256_setzero_ps();
  for (std::int64_t t = 0; t < count; ++t) {
    std::int64_t img, y0, x0;
    g.locate(first + t, img, y0, x0);
    const int rows = static_cast<int>(std::min<std::int64_t>(kTile, g.h - y0));
    const int cols = static_cast<int>(std::min<std::int64_t>(kTile, g.w - x0));
    const float* in = m + t * g.out_pad;
    float* base = y + ((img * g.h + y0) * g.w + x0) * g.out;
    for (std::int64_t c = 0; c < g.out; c += 8) {
      const __m256 bias = _mm256_loadu_ps(wt.bias.data() + c);
      __m256 d[kIn][kIn], o[kTile][kTile];
      for (int i = 0; i < kIn; ++i)
        for (int j = 0; j < kIn; ++j) d[i][j] = _mm256_loadu_ps(in + (i * kIn + j) * pos_stride + c);
      transform_2d(d, output_1d, o);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) {
          __m256 r = _mm256_add_ps(o[i][j], bias);
          if (act == Act::ReLU) r = _mm256_max_ps(r, zero);
          _mm256_storeu_ps(base + (i * g.w + j) * g.out + c, r);
        }
    }
  }
}

// `threads` scratch areas of `floats` floats each, 64-byte aligned.
class ThreadScratch {
 public:
  ThreadScratch(std::size_t floats, int threads) : stride_((floats + 15) / 16 * 16) {
    data_.reset(static_cast<float*>(std::aligned_alloc(64, stride_ * sizeof(float) * static_cast<std::size_t>(threads))));
    if (!data_) throw std::bad_alloc();
  }
  float* of(int thread) const { return data_.get() + stride_ * static_cast<std::size_t>(thread); }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::size_t stride_;
  std::unique_ptr<float, Free> data_;
};

}  // namespace

std::shared_ptr<Weights> transform_weights(const float* w, std::int64_t out, std::int64_t in, const float* bias,
                                           bool turned) {
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
  if (tiles == 0) return;
  // Tiles per chunk: V and M of a chunk within about 384 KiB (most of a core's L2), at least one
  // register block, and as many chunks per thread as the work allows.
  const std::int64_t per_tile = kPos * (g.in + g.out_pad) * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t most = std::max<std::int64_t>(kRows, (384 << 10) / per_tile);
  const int threads = static_cast<int>(
      std::max<std::int64_t>(1, std::min<std::int64_t>(omp_get_max_threads(), (tiles + kRows - 1) / kRows)));
  std::int64_t chunks = (tiles + most - 1) / most;
  chunks = (chunks + threads - 1) / threads * threads;
  const std::int64_t per_chunk = (tiles + chunks - 1) / chunks;
  chunks = (tiles + per_chunk - 1) / per_chunk;
  const std::size_t v_size = static_cast<std::size_t>(kPos * per_chunk * g.in);
  const std::size_t m_size = static_cast<std::size_t>(kPos * per_chunk * g.out_pad);
  const ThreadScratch scratch(v_size + m_size, threads);
#pragma omp parallel num_threads(threads)
  {
    float* v = scratch.of(omp_get_thread_num());
    float* m = v + v_size;
#pragma omp for schedule(static)
    for (std::int64_t ch = 0; ch < chunks; ++ch) {
      const std::int64_t first = ch * per_chunk;
      const std::int64_t count = std::min(per_chunk, tiles - first);
      transform_input(x, g, first, count, TileLayout{count * g.in, g.in, kCols}, v);
      products(v, wt, count, m);
      transform_output(m, g, wt, act, first, count, y);
    }
  }
}

namespace {

// The output-gradient tiles first..first+count (4x4, zeros past the map's edge), transformed
// (A dy A^T) into d: [36][out][count], each channel's tiles contiguous (the products' rows).
void transform_grad(const float* dy, const Geometry& g, std::int64_t first, std::int64_t count, float* d) {
  alignas(32) float lanes[8];
  for (std::int64_t t = 0; t < count; ++t) {
    std::int64_t img, y0, x0;
    g.locate(first + t, img, y0, x0);
    for (std::int64_t o = 0; o < g.out; o += 8) {
      __m256 v[kTile][kTile], r[kIn][kIn];
      for (int i = 0; i < kTile; ++i)
        for (int j = 0; j < kTile; ++j) {
          const std::int64_t yy = y0 + i, xx = x0 + j;
          v[i][j] = yy < g.h && xx < g.w ? _mm256_loadu_ps(dy + ((img * g.h + yy) * g.w + xx) * g.out + o)
                                         : _mm256_setzero_ps();
        }
      transform_2d(v, grad_1d, r);
      for (int p = 0; p < kPos; ++p) {
        _mm256_store_ps(lanes, r[p / kIn][p % kIn]);
        float* at = d + (p * g.out + o) * count + t;
        for (int k = 0; k < 8; ++k) at[k * count] = lanes[k];
      }
    }
  }
}

}  // namespace

void conv3x3_weight_grad(const float* x, const float* dy, std::int64_t n, std::int64_t h, std::int64_t w,
                         std::int64_t in, std::int64_t out, float* dw) {
  const std::int64_t in_pad = (in + kCols - 1) / kCols * kCols;
  // Geometry's out_pad is unused here; the products' columns are the input channels
  Geometry g{n, h, w, in, out, 0, (h + kTile - 1) / kTile, (w + kTile - 1) / kTile};
  const std::int64_t tiles = n * g.tiles_y * g.tiles_x;
  const std::int64_t per_tile = kPos * (in_pad + out) * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t per_chunk = std::clamp<std::int64_t>((384 << 10) / per_tile, 8, 256);
  const std::int64_t chunks = (tiles + per_chunk - 1) / per_chunk;
  // Each thread sums into its own S[36][out][in_pad]: at most 256 MiB of them together.
  const std::size_t sums = static_cast<std::size_t>(kPos * out * in_pad);
  const std::int64_t most_threads = std::max<std::int64_t>(1, (std::int64_t{256} << 20) / static_cast<std::int64_t>(sums * sizeof(float)));
  const int threads = static_cast<int>(
      std::max<std::int64_t>(1, std::min<std::int64_t>({std::int64_t{omp_get_max_threads()}, chunks, most_threads})));
  const std::size_t work = static_cast<std::size_t>(kPos * per_chunk * (in_pad + out));
  const ThreadScratch scratch(sums + work, threads);
  // zeroed before the team starts: a smaller team than asked for (inside another parallel region)
  // leaves some areas unused, and all are added up below
  for (int th = 0; th < threads; ++th) std::fill_n(scratch.of(th), sums, 0.0f);
#pragma omp parallel num_threads(threads)
  {
    float* s = scratch.of(omp_get_thread_num());
    float* xt = s + sums;
    float* dt = xt + kPos * per_chunk * in_pad;
#pragma omp for schedule(static)
    for (std::int64_t ch = 0; ch < chunks; ++ch) {
      const std::int64_t first = ch * per_chunk;
      const std::int64_t count = std::min(per_chunk, tiles - first);
      const TileLayout packed{in_pad * count, kCols, count * kCols};
      if (in_pad != in)  // the last block's padding channels
        for (int p = 0; p < kPos; ++p)
          for (std::int64_t t = 0; t < count; ++t) std::fill_n(xt + packed.at(p, t, in), in_pad - in, 0.0f);
      transform_input(x, g, first, count, packed, xt);
      transform_grad(dy, g, first, count, dt);
      // S[p] (out x in_pad) += D[p] (out x count) * X[p] (count x in_pad)
      for (int p = 0; p < kPos; ++p)
        product(dt + p * out * count, out, count, xt + p * in_pad * count, in_pad / kCols, count * kCols,
                s + p * out * in_pad, in_pad, true);
    }
  }
  // dw[o][c] = G^T (S summed over the threads, in their order) G
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t c = 0; c < in; ++c) {
      double sp[kIn][kIn];
      for (int p = 0; p < kPos; ++p) {
        double v = 0.0;
        for (int th = 0; th < threads; ++th) v += scratch.of(th)[(p * out + o) * in_pad + c];
        sp[p / kIn][p % kIn] = v;
      }
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
          double v = 0.0;
          for (int a = 0; a < kIn; ++a)
            for (int b = 0; b < kIn; ++b) v += G[a][i] * sp[a][b] * G[b][j];
          dw[((o * in + c) * 3 + i) * 3 + j] = static_cast<float>(v);
        }
    }
}

}  // namespace relpos::cpu::winograd
