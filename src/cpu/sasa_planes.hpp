// Internal: the planar form of SASA local attention on the CPU (src/cpu/sasa_attention.cpp).
//
// The op's input is channels-last, where a pixel's channels are contiguous and a window's dot
// products are short (dqk = 8 in sasa_resnet26's first stage). The kernels instead vectorise over
// `lanes` (8 or 16) neighbouring query pixels of a row: each channel is a plane of Hp x Wp floats,
// zero-padded by r = k/2 on every side, so the key of window offset (a, b) for the queries at
// (y, x0..x0+lanes-1) is the `lanes` contiguous floats at padded (y + a, x0 + b) of every key
// plane. A window's logits for those queries are then k*k vector multiply-adds per channel, with
// no horizontal sums, and the borders are masked lane by lane. The kernels are compiled three
// times (sasa_simd_generic.cpp with 16 lanes on x86-64 and 8 elsewhere, sasa_simd_avx2.cpp with
// AVX2 and FMA and 8 lanes, sasa_simd_avx512.cpp with AVX-512 and 16 lanes); kernels() picks the
// set for this CPU and map.
#pragma once

#include <cstdint>

namespace relpos::cpu::sasa {

// The most vector lanes (query pixels of a row handled together) of any kernel set.
constexpr int kMaxLanes = 16;

// How far the AVX-512 kernels' loads of a window row reach past what the window covers, before its
// first column and after its last lane (sasa_simd_kernels.inc: window_columns): every plane buffer
// has at least this many floats of guard before its first plane and after its last.
constexpr int kColumnReach = 16;

struct Planes {
  int H = 0, W = 0;    // the feature map
  int r = 0, k = 0;    // window radius and size (k = 2r + 1)
  int Wv = 0;          // W rounded up to a multiple of the kernels' lanes
  int Hp = 0, Wp = 0;  // padded plane: Hp = H + 2r, Wp = Wv + 2r
  int heads = 0, dqk = 0, dv = 0, half = 0;
  float s = 1.0f;                  // logit scale
  bool relu = false;               // the output goes through ReLU as it is written
  bool pool2 = false;              // the output is 2x2 average pooled (then ReLU) as it is written:
                                   // H and W even, rows taken in pairs; out is (H/2, W/2) pixels
  const float* r_row = nullptr;    // (k, half): acts on q[:half]
  const float* r_col = nullptr;    // (k, half): acts on q[half:]
  const float* v_bias = nullptr;   // (heads * dv) or null: added to each output channel as it is written
  std::int64_t stride = 0;         // floats from one plane to the next (at least Hp * Wp)
  std::int64_t plane() const { return stride; }
  std::int64_t plane_floats() const { return static_cast<std::int64_t>(Hp) * Wp; }
  int channels() const { return 2 * heads * dqk + heads * dv; }  // q, k, v planes of one image
  // The first q, k and v channel of head h among them (the qkv projection's layout: all heads' q,
  // then their k, then their v).
  std::int64_t q_channel(int h) const { return static_cast<std::int64_t>(h) * dqk; }
  std::int64_t k_channel(int h) const { return static_cast<std::int64_t>(heads + h) * dqk; }
  std::int64_t v_channel(int h) const {
    return 2 * static_cast<std::int64_t>(heads) * dqk + static_cast<std::int64_t>(h) * dv;
  }
  // Padded plane index of pixel (y, x) of the map.
  std::int64_t at(int y, int x) const { return static_cast<std::int64_t>(y + r) * Wp + x + r; }
};

// Scratch floats one thread needs for either kernel.
std::int64_t scratch_floats(const Planes& p);

struct Kernels {
  // Padded row py (0 <= py < Hp) of the planes of channels c0..c0+nc of an image's channels-last
  // pixels `img` (H * W * C floats), channel c0 + i into plane i; with zero_pads, rows and columns
  // outside the map become 0 (else they are left as they are).
  void (*spread_row)(const Planes& p, const float* img, std::int64_t C, std::int64_t c0, std::int64_t nc,
                     float* planes, int py, bool zero_pads);
  // Row y of the map from C planes back into channels-last pixels `img`.
  void (*gather_row)(const Planes& p, const float* planes, std::int64_t C, float* img, int y);
  // Rows y .. y + n - 1 (n = 1 or 2, y + n <= H) of one head h of one image: Q, K and V point at
  // the head's first q, k and v plane (dqk, dqk and dv planes, each set contiguous); writes the
  // output of the rows into `out` (the image's channels-last output, heads*dv channels per pixel)
  // and, when `probs` is given, the probabilities into it (the image's (H, W, heads, k*k) block,
  // zero where masked). Two rows share their keys' and values' loads.
  void (*forward_rows)(const Planes& p, const float* Q, const float* K, const float* V, int h, int y, int n,
                       float* out, float* probs, float* scratch);
  // The gradients of one head h of one image. `qkv`: the image's planes; `dout`: the output
  // gradient as heads*dv planes; `probs`: the saved (H, W, heads, k*k) block. Adds d q, d k and
  // d v into `dqkv` (channels() planes, zero on entry for this head; padding collects what falls
  // outside the map) and writes this head's embedding gradients, d r_row then d r_col
  // (2 * k * half floats), into `dr`.
  void (*backward_head)(const Planes& p, const float* qkv, const float* dout, const float* probs, int h, float* dqkv,
                        float* dr, float* scratch);
  int lanes;  // query pixels per vector: the planes' Wv is W rounded up to a multiple of it
  const char* name;
};

// The kernels for this CPU and a map W pixels wide: AVX-512 (16 lanes) when the CPU has it and the
// map is at least 16 wide, else AVX2 + FMA (8 lanes) when it has those, else the generic build.
// RELPOS_SIMD (cpu_features.hpp) caps the choice.
const Kernels& kernels(int W);

namespace generic {
extern const Kernels kKernels;
}
namespace avx2 {
extern const Kernels kKernels;
}
namespace avx512 {
extern const Kernels kKernels;
}

}  // namespace relpos::cpu::sasa
