// Internal: shape checks and index arithmetic shared by the CPU and CUDA attention kernels.
#pragma once

#include <cstdint>

#include "relpos/attention_ops.hpp"

namespace relpos {

struct BotGeometry {
  std::int64_t B = 0, H = 0, W = 0, N = 0;
  std::int64_t Ct = 0;  // qkv channels (row stride of Q, K, V in channels-last memory)
  std::int64_t Co = 0;  // output channels
  int heads = 0, dqk = 0, dv = 0;
  int kh = 0, kw = 0;            // largest |offset| the relative tables hold
  std::int64_t Th = 0, Tw = 0;   // rows per head of pos_h (Relative: 2kh+1; Absolute: N) and pos_w
  bool per_head = false;
  float s = 1.0f;          // dqk^-0.5 on q.k
  float alpha_pos = 1.0f;  // factor on the position term (s with scale_pos_embed, else 1)

  // Pointers for image b, head h into a channels-last qkv (or d qkv) buffer.
  template <typename T>
  T* q_ptr(T* base, std::int64_t b, int h) const { return base + b * N * Ct + h * dqk; }
  template <typename T>
  T* k_ptr(T* base, std::int64_t b, int h) const { return base + b * N * Ct + heads * dqk + h * dqk; }
  template <typename T>
  T* v_ptr(T* base, std::int64_t b, int h) const { return base + b * N * Ct + 2 * heads * dqk + h * dv; }
  // Head h's slice of the (shared or per-head) pos_h and pos_w tensors.
  template <typename T>
  T* table_h(T* base, int h) const { return per_head ? base + h * Th * dqk : base; }
  template <typename T>
  T* table_w(T* base, int h) const { return per_head ? base + h * Tw * dqk : base; }
};

// Validates qkv and the position tensors against spec; error messages name the mismatch.
BotGeometry bot_geometry(const Tensor& qkv, const Tensor& pos_h, const Tensor& pos_w, const BotAttnSpec& spec);

struct SasaGeometry {
  std::int64_t B = 0, H = 0, W = 0, N = 0, Ct = 0, Co = 0;
  int heads = 0, dqk = 0, dv = 0, k = 0, r = 0, half = 0;
  float s = 1.0f;
};
SasaGeometry sasa_geometry(const Tensor& qkv, const Tensor& r_row, const Tensor& r_col, const SasaSpec& spec);
// The same for a qkv of this shape on `device` (one a fused projection makes).
SasaGeometry sasa_geometry(const Shape& qkv, Device device, const Tensor& r_row, const Tensor& r_col,
                           const SasaSpec& spec);

}  // namespace relpos
