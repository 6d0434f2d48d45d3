// Max and average pooling (own loops; the average pool's gradient and the int8 max pool by oneDNN)
// and global average pooling on the CPU, channels-last.
#include <omp.h>

#include <algorithm>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu/cpu_features.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/dnnl_util.hpp"
#include "relpos/error.hpp"

namespace relpos::cpu {

namespace {
struct PoolGeometry {
  std::int64_t n, c, h, w, oh, ow;
};

PoolGeometry pool_geometry(const Shape& x, const ops::PoolSpec& s) {
  RELPOS_CHECK(x.size() == 4, "pool2d: input must be (N, C, H, W), got " << to_string(x));
  RELPOS_CHECK(s.kernel >= 1 && s.stride >= 1 && s.pad >= 0 && 2 * s.pad <= s.kernel,
               "pool2d: bad kernel " << s.kernel << " stride " << s.stride << " pad " << s.pad);
  PoolGeometry g{x[0], x[1], x[2], x[3], 0, 0};
  g.oh = (g.h + 2 * s.pad - s.kernel) / s.stride + 1;
  g.ow = (g.w + 2 * s.pad - s.kernel) / s.stride + 1;
  RELPOS_CHECK(g.oh > 0 && g.ow > 0, "pool2d: input " << to_string(x) << " is smaller than the "
                                                      << s.kernel << "x" << s.kernel << " window");
  return g;
}

dnnl::pooling_forward::desc pool_desc(const PoolGeometry& g, const ops::PoolSpec& s, dnnl::prop_kind prop,
                                      dnnl::memory::data_type type = dnnl::memory::data_type::f32) {
  const auto algo = s.kind == ops::PoolKind::Max ? dnnl::algorithm::pooling_max
                                                 : dnnl::algorithm::pooling_avg_exclude_padding;
  const dims pad_r = {(g.oh - 1) * s.stride + s.kernel - g.h - s.pad,
                      (g.ow - 1) * s.stride + s.kernel - g.w - s.pad};
  using tag = dnnl::memory::format_tag;
  return dnnl::pooling_forward::desc(prop, algo, dnnl::memory::desc({g.n, g.c, g.h, g.w}, type, tag::nhwc),
                                     dnnl::memory::desc({g.n, g.c, g.oh, g.ow}, type, tag::nhwc),
                                     {s.stride, s.stride}, {s.kernel, s.kernel}, {s.pad, s.pad}, pad_r);
}
}  // namespace

namespace {
// Max pooling, channels-last: each output pixel's channels are the largest of its window's
// in-bounds pixels (a NaN wins, as in PyTorch, so a NaN input is not hidden). Output rows are the
// unit of parallel work. Per output pixel, a block of channels (32, then 4 at a time, then single
// ones) takes its window's first pixel and the maximum with the others in registers and is stored
// once. For the BoTNet stem's 3x3/2 pool (64 channels, 128x128, 2 threads of a 2-vCPU EPYC),
// oneDNN's own took 0.76 ms, a loop that kept the maximum in memory 0.24 ms, these blocks 0.17 ms
// (at batch 8: 2.04 and 1.52 ms). On AVX-512 the same loop in 16-float registers
// (max_pool_rows_avx512; tools/bench/README.md has its times).
typedef float v4 __attribute__((vector_size(16)));
typedef float v4_mem __attribute__((vector_size(16), aligned(4), may_alias));

inline v4 max_nan(v4 m, v4 v) { return ((v > m) | (v != v)) ? v : m; }
inline v4 load4(const float* p) { return *reinterpret_cast<const v4_mem*>(p); }

struct Window {
  const float* x;  // the window's first pixel, channel 0
  std::int64_t rows, cols, row_stride, c;
};

// Channels ch .. ch + 4 V of one output pixel.
template <int V>
inline void max_block(const Window& win, std::int64_t ch, float* out) {
  v4 m[V];
  for (int k = 0; k < V; ++k) m[k] = load4(win.x + ch + 4 * k);
  for (std::int64_t iy = 0; iy < win.rows; ++iy)
    for (std::int64_t ix = iy == 0 ? 1 : 0; ix < win.cols; ++ix) {
      const float* in = win.x + iy * win.row_stride + ix * win.c + ch;
      for (int k = 0; k < V; ++k) m[k] = max_nan(m[k], load4(in + 4 * k));
    }
  for (int k = 0; k < V; ++k) *reinterpret_cast<v4_mem*>(out + ch + 4 * k) = m[k];
}

// The in-bounds window of output pixel ox of output row r (image * oh + output row).
inline Window window_at(const float* x, const PoolGeometry& g, const ops::PoolSpec& s, std::int64_t r,
                        std::int64_t ox) {
  const std::int64_t b = r / g.oh, oy = r % g.oh;
  const std::int64_t y0 = std::max<std::int64_t>(0, oy * s.stride - s.pad);
  const std::int64_t y1 = std::min<std::int64_t>(g.h, oy * s.stride - s.pad + s.kernel);
  const std::int64_t x0 = std::max<std::int64_t>(0, ox * s.stride - s.pad);
  const std::int64_t x1 = std::min<std::int64_t>(g.w, ox * s.stride - s.pad + s.kernel);
  return {x + ((b * g.h + y0) * g.w + x0) * g.c, y1 - y0, x1 - x0, g.w * g.c, g.c};
}

// f(window, out) for each output pixel of the output rows [r0, r1): its in-bounds window and where
// its channels go.
template <class F>
inline void for_each_window(const float* x, const PoolGeometry& g, const ops::PoolSpec& s, std::int64_t r0,
                            std::int64_t r1, float* y, F&& f) {
  for (std::int64_t r = r0; r < r1; ++r)
    for (std::int64_t ox = 0; ox < g.ow; ++ox) f(window_at(x, g, s, r, ox), y + (r * g.ow + ox) * g.c);
}

// rows(r0, r1) over the batch's output rows, split evenly between the threads (on one thread below
// `serial_below` output values).
template <class Rows>
inline void split_rows(const PoolGeometry& g, std::int64_t serial_below, const Rows& rows) {
  const std::int64_t all = g.n * g.oh;
#pragma omp parallel if (all * g.ow * g.c >= serial_below)
  {
    const std::int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
    rows(all * t / T, all * (t + 1) / T);
  }
}

// The output rows [r0, r1) in 4-float vectors.
void max_pool_rows(const float* x, const PoolGeometry& g, const ops::PoolSpec& s, std::int64_t r0, std::int64_t r1,
                   float* y) {
  const std::int64_t c = g.c;
  for_each_window(x, g, s, r0, r1, y, [c](const Window& win, float* out) {
    std::int64_t ch = 0;
    for (; ch + 32 <= c; ch += 32) max_block<8>(win, ch, out);
    for (; ch + 4 <= c; ch += 4) max_block<1>(win, ch, out);
    for (; ch < c; ++ch) {
      float m = win.x[ch];
      for (std::int64_t iy = 0; iy < win.rows; ++iy)
        for (std::int64_t ix = iy == 0 ? 1 : 0; ix < win.cols; ++ix) {
          const float v = win.x[iy * win.row_stride + ix * c + ch];
          if (v > m || v != v) m = v;
        }
      out[ch] = m;
    }
  });
}

#if defined(__x86_64__)
// The same with AVX-512 (intrinsics: GCC turns a vector select of 16 floats into scalar code in a
// function whose target alone has AVX-512): blocks of four 16-float vectors, the last ones masked.
// A lane takes the window pixel where it is larger or NaN, as in max_block.
__attribute__((target("avx512f"))) void max_pool_rows_avx512(const float* x, const PoolGeometry& g,
                                                              const ops::PoolSpec& s, std::int64_t r0,
                                                              std::int64_t r1, float* y) {
  const std::int64_t c = g.c;
  for (std::int64_t r = r0; r < r1; ++r)
    for (std::int64_t ox = 0; ox < g.ow; ++ox) {
      const Window win = window_at(x, g, s, r, ox);
      const float* first = win.x;
      float* out = y + (r * g.ow + ox) * c;
      for (std::int64_t ch = 0; ch < c; ch += 64) {
        __mmask16 lanes[4];
        __m512 m[4];
        for (int k = 0; k < 4; ++k) {
          const std::int64_t left = c - ch - 16 * k;
          lanes[k] = left >= 16 ? __mmask16(0xffff) : left > 0 ? __mmask16((1u << left) - 1) : __mmask16(0);
          m[k] = _mm512_maskz_loadu_ps(lanes[k], first + ch + 16 * k);
        }
        for (std::int64_t iy = 0; iy < win.rows; ++iy)
          for (std::int64_t ix = iy == 0 ? 1 : 0; ix < win.cols; ++ix) {
            const float* in = first + iy * win.row_stride + ix * c + ch;
            for (int k = 0; k < 4; ++k) {
              const __m512 v = _mm512_maskz_loadu_ps(lanes[k], in + 16 * k);
              const __mmask16 take = _mm512_cmp_ps_mask(v, m[k], _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
              m[k] = _mm512_mask_mov_ps(m[k], take, v);
            }
          }
        for (int k = 0; k < 4; ++k) _mm512_mask_storeu_ps(out + ch + 16 * k, lanes[k], m[k]);
      }
    }
}
#endif

void max_pool(const float* x, const PoolGeometry& g, const ops::PoolSpec& s, float* y) {
  auto rows_of = max_pool_rows;
#if defined(__x86_64__)
  if (avx512_kernels()) rows_of = max_pool_rows_avx512;
#endif
  split_rows(g, 0, [&](std::int64_t r0, std::int64_t r1) { rows_of(x, g, s, r0, r1, y); });
}

// Average pooling, channels-last: each output pixel's channels are the mean of its window's
// in-bounds pixels (padding excluded from the count, as PyTorch's count_include_pad=False and
// oneDNN's pooling_avg_exclude_padding), summed in window order. Output rows are the unit of
// parallel work. A loop of our own: oneDNN's pooling made its primitive descriptor on every call,
// about 80 us for BoTNet's 2x2 pool of 512 x 16 x 16 values, a few microseconds of work.
void avg_pool_rows(const float* x, const PoolGeometry& g, const ops::PoolSpec& s, std::int64_t r0, std::int64_t r1,
                   float* y) {
  const std::int64_t c = g.c;
  for_each_window(x, g, s, r0, r1, y, [c](const Window& win, float* out) {
    for (std::int64_t ch = 0; ch < c; ++ch) out[ch] = win.x[ch];
    for (std::int64_t iy = 0; iy < win.rows; ++iy)
      for (std::int64_t ix = iy == 0 ? 1 : 0; ix < win.cols; ++ix) {
        const float* in = win.x + iy * win.row_stride + ix * c;
#pragma omp simd
        for (std::int64_t ch = 0; ch < c; ++ch) out[ch] += in[ch];
      }
    const float count = static_cast<float>(win.rows * win.cols);
#pragma omp simd
    for (std::int64_t ch = 0; ch < c; ++ch) out[ch] /= count;
  });
}

void avg_pool(const float* x, const PoolGeometry& g, const ops::PoolSpec& s, float* y) {
  split_rows(g, 1 << 13, [&](std::int64_t r0, std::int64_t r1) { avg_pool_rows(x, g, s, r0, r1, y); });
}
}  // namespace

Tensor pool2d(const Tensor& x_in, const ops::PoolSpec& spec) {
  const Tensor x = as_channels_last(x_in);
  const PoolGeometry g = pool_geometry(x.shape(), spec);
  if (spec.kind == ops::PoolKind::Max) {
    Tensor y({g.n, g.c, g.oh, g.ow}, Device::CPU, Layout::ChannelsLast);
    max_pool(x.data(), g, spec, y.data());
    return y;
  }
  Tensor y({g.n, g.c, g.oh, g.ow}, Device::CPU, Layout::ChannelsLast);
  avg_pool(x.data(), g, spec, y.data());
  return y;
}

Tensor pool2d_backward(const Tensor& x_in, const Tensor& dy_in, const ops::PoolSpec& spec) {
  const Tensor x = as_channels_last(x_in);
  const Tensor dy = as_channels_last(dy_in);
  const PoolGeometry g = pool_geometry(x.shape(), spec);
  RELPOS_CHECK(dy.shape() == Shape({g.n, g.c, g.oh, g.ow}),
               "pool2d backward: gradient " << dy.describe() << " does not match the output shape");
  Tensor dx = Tensor::zeros(x.shape(), Device::CPU, Layout::ChannelsLast);
  if (spec.kind == ops::PoolKind::Avg) {
    auto fd = pool_desc(g, spec, dnnl::prop_kind::forward_training);
    dnnl::pooling_forward::primitive_desc fpd(fd, scratch_attr(), engine());
    dnnl::pooling_backward::desc d(dnnl::algorithm::pooling_avg_exclude_padding, md_nhwc(x.shape()),
                                   md_nhwc(dy.shape()), {spec.stride, spec.stride},
                                   {spec.kernel, spec.kernel}, {spec.pad, spec.pad},
                                   {(g.oh - 1) * spec.stride + spec.kernel - g.h - spec.pad,
                                    (g.ow - 1) * spec.stride + spec.kernel - g.w - spec.pad});
    dnnl::pooling_backward::primitive_desc pd(d, scratch_attr(), engine(), fpd);
    execute(dnnl::pooling_backward(pd), pd.scratchpad_desc(),
            {{DNNL_ARG_DIFF_DST, mem(pd.diff_dst_desc(), dy)}, {DNNL_ARG_DIFF_SRC, mem(pd.diff_src_desc(), dx)}});
    return dx;
  }
  // Max: the gradient goes to the first maximum of each window (PyTorch's rule). The windows
  // of one image overlap, so images are the unit of parallel work.
  const float* xp = x.data();
  const float* dyp = dy.data();
  float* dxp = dx.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < g.n; ++b) {
    for (std::int64_t oy = 0; oy < g.oh; ++oy)
      for (std::int64_t ox = 0; ox < g.ow; ++ox)
        for (std::int64_t ch = 0; ch < g.c; ++ch) {
          float best = -std::numeric_limits<float>::infinity();
          std::int64_t best_at = -1;
          for (int ky = 0; ky < spec.kernel; ++ky) {
            const std::int64_t iy = oy * spec.stride - spec.pad + ky;
            if (iy < 0 || iy >= g.h) continue;
            for (int kx = 0; kx < spec.kernel; ++kx) {
              const std::int64_t ix = ox * spec.stride - spec.pad + kx;
              if (ix < 0 || ix >= g.w) continue;
              const std::int64_t at = ((b * g.h + iy) * g.w + ix) * g.c + ch;
              if (best_at < 0 || xp[at] > best || xp[at] != xp[at]) {
                best = xp[at];
                best_at = at;
              }
            }
          }
          dxp[best_at] += dyp[((b * g.oh + oy) * g.ow + ox) * g.c + ch];
        }
  }
  return dx;
}

Tensor global_avg_pool(const Tensor& x_in) {
  const Tensor x = as_channels_last(x_in);
  const std::int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3);
  RELPOS_CHECK(hw > 0, "global average pool of an empty map " << to_string(x.shape()));
  Tensor y = Tensor::zeros({n, c});
  const float* xp = x.data();
  float* yp = y.data();
  const float inv = 1.0f / static_cast<float>(hw);
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < n; ++b) {
    float* out = yp + b * c;
    for (std::int64_t p = 0; p < hw; ++p) {
      const float* row = xp + (b * hw + p) * c;
#pragma omp simd
      for (std::int64_t ch = 0; ch < c; ++ch) out[ch] += row[ch];
    }
    for (std::int64_t ch = 0; ch < c; ++ch) out[ch] *= inv;
  }
  return y;
}

Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape) {
  RELPOS_CHECK(x_shape.size() == 4 && dy.shape() == Shape({x_shape[0], x_shape[1]}),
               "global average pool backward: gradient " << dy.describe() << " for input "
                                                         << to_string(x_shape));
  const std::int64_t n = x_shape[0], c = x_shape[1], hw = x_shape[2] * x_shape[3];
  Tensor dx(x_shape, Device::CPU, Layout::ChannelsLast);
  const float* g = dy.data();
  float* d = dx.data();
  const float inv = 1.0f / static_cast<float>(hw);
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t p = 0; p < hw; ++p) {
      float* row = d + (b * hw + p) * c;
#pragma omp simd
      for (std::int64_t ch = 0; ch < c; ++ch) row[ch] = g[b * c + ch] * inv;
    }
  return dx;
}

ops::QuantizedTensor max_pool2d_quantized(const ops::QuantizedTensor& x, const ops::PoolSpec& spec) {
  RELPOS_CHECK(x.defined(), "max_pool2d_quantized: no input");
  RELPOS_CHECK(spec.kind == ops::PoolKind::Max, "max_pool2d_quantized: max pooling only (it commutes with quantization)");
  const PoolGeometry g = pool_geometry(x.shape, spec);
  const auto type = x.is_signed ? dnnl::memory::data_type::s8 : dnnl::memory::data_type::u8;
  dnnl::pooling_forward::primitive_desc pd(pool_desc(g, spec, dnnl::prop_kind::forward_inference, type),
                                           scratch_attr(), engine());
  ops::QuantizedTensor y = ops::QuantizedTensor::empty({g.n, g.c, g.oh, g.ow}, x.scale, x.is_signed);
  execute(dnnl::pooling_forward(pd), pd.scratchpad_desc(),
          {{DNNL_ARG_SRC, dnnl::memory(pd.src_desc(), engine(), const_cast<void*>(x.data()))},
           {DNNL_ARG_DST, dnnl::memory(pd.dst_desc(), engine(), y.data())}});
  return y;
}

}  // namespace relpos::cpu
