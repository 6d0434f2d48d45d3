// relpos: the two attention operations (docs/attention.md), without their qkv projection
// or pooling. Both take the qkv projection as one (B, 2*heads*dqk + heads*dv, H, W) tensor,
// split q | k | v with head-major channels inside each part, and return (B, heads*dv, H, W)
// with channel head*dv + c. Inputs of either layout; outputs ChannelsLast.
#pragma once

#include <string>

#include "relpos/ops.hpp"
#include "relpos/tensor.hpp"

namespace relpos {

enum class PosEncoding : std::uint8_t { Relative, Absolute, None };
PosEncoding parse_pos_encoding(const std::string& s);  // "relative" | "absolute" | "none"
std::string to_string(PosEncoding p);

// BoTNet global attention over the whole h x w map.
struct BotAttnSpec {
  int heads = 4;
  int dqk = 0;
  int dv = 0;
  PosEncoding pos = PosEncoding::Relative;
  // Relative offsets clamped to [-clip, clip] (Shaw et al.); 0 means no clipping, so the tables
  // have 2H-1 and 2W-1 rows and the map must be exactly H x W.
  int clip = 0;
  bool per_head = false;         // tables (heads, rows, dqk) instead of (rows, dqk)
  bool scale_pos_embed = false;  // (q.k + pos) * s instead of q.k * s + pos

  int channels_qkv() const { return 2 * heads * dqk + heads * dv; }
  int channels_out() const { return heads * dv; }
  float scale() const;
};

namespace ops {

// Position parameters: for Relative, pos_h = height table (rows_h, dqk) and pos_w = width table
// (rows_w, dqk) (with a leading heads dimension if per_head); row r holds offset r - (rows-1)/2
// (key minus query). For Absolute, pos_h = (H*W, dqk) (or (heads, H*W, dqk)) and pos_w is
// unused. For None both are unused.
// When probs is given it receives the softmax probabilities (B, heads, N, N) for the backward.
Tensor bot_attention(const Tensor& qkv, const Tensor& pos_h, const Tensor& pos_w,
                     const BotAttnSpec& spec, Tensor* probs = nullptr);
struct BotAttnGrads {
  Tensor dqkv, dpos_h, dpos_w;
};
BotAttnGrads bot_attention_backward(const Tensor& qkv, const Tensor& pos_h, const Tensor& pos_w,
                                    const BotAttnSpec& spec, const Tensor& probs, const Tensor& dout);

// The (N, rows_h) and (N, rows_w) tables q.Rh and q.Rw expanded over the key grid: the
// position part of the logits, (B*heads, N, N). This is the reference-shaped output of timm's
// PosEmbedRel, used by tests and the benchmark; the attention itself never materialises it.
Tensor rel_pos_logits(const Tensor& q, const Tensor& table_h, const Tensor& table_w, int height,
                      int width, int clip = 0);

}  // namespace ops

// Stand-alone self-attention over a k x k window around each pixel; keys outside the image are
// masked out of the softmax.
struct SasaSpec {
  int heads = 8;
  int dqk = 0;  // even: r_row acts on q[:dqk/2], r_col on q[dqk/2:]
  int dv = 0;
  int kernel = 7;  // odd

  int channels_qkv() const { return 2 * heads * dqk + heads * dv; }
  int channels_out() const { return heads * dv; }
  float scale() const;
};

namespace ops {

// r_row, r_col: (kernel, dqk/2). probs (B, H, W, heads, kernel*kernel) when given. act: applied to
// the output as it is written (a block's batch norm folded into the values leaves only its activation).
Tensor sasa_attention(const Tensor& qkv, const Tensor& r_row, const Tensor& r_col,
                      const SasaSpec& spec, Tensor* probs = nullptr, Act act = Act::None);
struct SasaGrads {
  Tensor dqkv, dr_row, dr_col;
};
SasaGrads sasa_attention_backward(const Tensor& qkv, const Tensor& r_row, const Tensor& r_col,
                                  const SasaSpec& spec, const Tensor& probs, const Tensor& dout);

}  // namespace ops
}  // namespace relpos
