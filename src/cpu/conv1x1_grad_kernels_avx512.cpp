// The 1x1 convolution's gradient products (conv1x1_grad_kernels.hpp), AVX-512: register tiles of
// up to 24 accumulators, 16 input channels per vector. Built with AVX-512 flags (CMakeLists.txt).
#include <immintrin.h>

#include <type_traits>

#include "cpu/conv1x1_grad_kernels.hpp"

namespace relpos::cpu::conv1x1 {

namespace {

// dw[o][i] (TO output channels x NV vectors of input channels) += sum_r g[r][o] x[r][i]
template <int TO, int NV>
void weight_tile(const float* g, std::int64_t ldg, const float* x, std::int64_t ldx, std::int64_t rows, float* dw,
                 std::int64_t ldw) {
  __m512 acc[TO][NV];
#pragma GCC unroll 16
  for (int o = 0; o < TO; ++o)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[o][v] = _mm512_loadu_ps(dw + o * ldw + 16 * v);
  for (std::int64_t r = 0; r < rows; ++r) {
    __m512 xv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) xv[v] = _mm512_loadu_ps(x + r * ldx + 16 * v);
#pragma GCC unroll 16
    for (int o = 0; o < TO; ++o) {
      const __m512 gb = _mm512_set1_ps(g[r * ldg + o]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[o][v] = _mm512_fmadd_ps(gb, xv[v], acc[o][v]);
    }
  }
#pragma GCC unroll 16
  for (int o = 0; o < TO; ++o)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(dw + o * ldw + 16 * v, acc[o][v]);
}

// dx[r][i] (TR rows x NV vectors of input channels) = sum_o g[r][o] w[o][i]
template <int TR, int NV>
void input_tile(const float* g, std::int64_t ldg, std::int64_t oc, const float* w, std::int64_t ldw, float* dx,
                std::int64_t ldx) {
  __m512 acc[TR][NV];
#pragma GCC unroll 24
  for (int r = 0; r < TR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (std::int64_t o = 0; o < oc; ++o) {
    __m512 wv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_ps(w + o * ldw + 16 * v);
#pragma GCC unroll 24
    for (int r = 0; r < TR; ++r) {
      const __m512 gb = _mm512_set1_ps(g[r * ldg + o]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(gb, wv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 24
  for (int r = 0; r < TR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(dx + r * ldx + 16 * v, acc[r][v]);
}

// Output channels in tiles of TO (a multiple of 16 is a multiple of every TO used).
template <int NV>
void weight_columns(const float* g, std::int64_t oc, const float* x, std::int64_t ic, std::int64_t ldx,
                    std::int64_t rows, float* dw) {
  constexpr int TO = NV == 4 ? 4 : NV == 1 ? 16 : 8;
  for (std::int64_t o = 0; o < oc; o += TO) weight_tile<TO, NV>(g + o, oc, x, ldx, rows, dw + o * ic, ic);
}

// Rows in tiles of TR, the rest one at a time.
template <int NV>
void input_columns(const float* g, std::int64_t oc, const float* w, std::int64_t ic, std::int64_t rows, float* dx,
                   std::int64_t ldx) {
  constexpr int TR = NV == 4 ? 6 : NV == 3 ? 8 : NV == 2 ? 12 : 24;
  std::int64_t r = 0;
  for (; r + TR <= rows; r += TR) input_tile<TR, NV>(g + r * oc, oc, oc, w, ic, dx + r * ldx, ldx);
  for (; r < rows; ++r) input_tile<1, NV>(g + r * oc, oc, oc, w, ic, dx + r * ldx, ldx);
}

// f<NV>(column offset) over the input channels, in groups of 4 vectors, then 3, 2 or 1.
template <class F>
void by_columns(std::int64_t ic, F&& f) {
  std::int64_t i = 0;
  for (; i + 64 <= ic; i += 64) f(std::integral_constant<int, 4>(), i);
  switch ((ic - i) / 16) {
    case 3: f(std::integral_constant<int, 3>(), i); break;
    case 2: f(std::integral_constant<int, 2>(), i); break;
    case 1: f(std::integral_constant<int, 1>(), i); break;
    default: break;
  }
}

}  // namespace

void add_weight_grad(const float* g, std::int64_t oc, const float* x, std::int64_t ic, std::int64_t ldx,
                     std::int64_t rows, float* dw) {
  by_columns(ic, [&](auto nv, std::int64_t i) {
    weight_columns<decltype(nv)::value>(g, oc, x + i, ic, ldx, rows, dw + i);
  });
}

void input_grad(const float* g, std::int64_t oc, const float* w, std::int64_t ic, std::int64_t rows, float* dx,
                std::int64_t ldx) {
  by_columns(ic, [&](auto nv, std::int64_t i) {
    input_columns<decltype(nv)::value>(g, oc, w + i, ic, rows, dx + i, ldx);
  });
}

}  // namespace relpos::cpu::conv1x1
