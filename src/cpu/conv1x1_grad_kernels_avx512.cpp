// The 1x1 convolution's gradient products (conv1x1_grad_kernels.hpp), AVX-512: register tiles of
// up to 24 accumulators, 16 input channels per vector. Built with AVX-512 flags (CMakeLists.txt).
#include <immintrin.h>

#include <type_traits>

#include "cpu/conv1x1_grad_kernels.hpp"

namespace relpos::cpu::conv1x1 {

namespace {

// The register tile of both products: c[t][v] (T rows of c x NV vectors of input channels) =
// c[t][v] (with kAdd, else 0) + sum over k < n of a(k, t) b[k * ldb + 16 v], in the order k = 0, 1,
// ... The broadcast a(k, t) is a[k * lda + t] with kAcross (the weight gradient: k a row of g,
// t an output channel), else a[t * lda + k] (the input gradient: t a row of g, k an output
// channel).
template <int T, int NV, bool kAdd, bool kAcross>
void product_tile(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t n, float* c,
                  std::int64_t ldc) {
  __m512 acc[T][NV];
#pragma GCC unroll 24
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[t][v] = kAdd ? _mm512_loadu_ps(c + t * ldc + 16 * v) : _mm512_setzero_ps();
  for (std::int64_t k = 0; k < n; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + k * ldb + 16 * v);
#pragma GCC unroll 24
    for (int t = 0; t < T; ++t) {
      const __m512 ab = _mm512_set1_ps(kAcross ? a[k * lda + t] : a[t * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[t][v] = _mm512_fmadd_ps(ab, bv[v], acc[t][v]);
    }
  }
#pragma GCC unroll 24
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + t * ldc + 16 * v, acc[t][v]);
}

// dw[o][i] (TO output channels x NV vectors of input channels) += sum_r g[r][o] x[r][i]
template <int TO, int NV>
void weight_tile(const float* g, std::int64_t ldg, const float* x, std::int64_t ldx, std::int64_t rows, float* dw,
                 std::int64_t ldw) {
  product_tile<TO, NV, true, true>(g, ldg, x, ldx, rows, dw, ldw);
}

// dx[r][i] (TR rows x NV vectors of input channels) = sum_o g[r][o] w[o][i]
template <int TR, int NV>
void input_tile(const float* g, std::int64_t ldg, std::int64_t oc, const float* w, std::int64_t ldw, float* dx,
                std::int64_t ldx) {
  product_tile<TR, NV, false, false>(g, ldg, w, ldw, oc, dx, ldx);
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
