// relpos: what an attention layer computed for an image, and the numbers that explain it
// (docs/explain.md): the attention probabilities of every query, one query's logits split into
// the content term s q.k and the position term, the mean attention distance of each head, and
// the cosine similarity of the learned position tables.
//
//   relpos::Model model = relpos::Model::load("models/botnet-fmnist.json");
//   std::vector<relpos::AttentionMaps> layers = model.attention(relpos::read_image("bag.png"));
//   const relpos::AttentionMaps& last = layers.back();              // "stages.2.1.self_attn"
//   relpos::QueryTerms t = relpos::query_terms(last, 3, 3);         // the centre of the 7x7 map
//   std::vector<double> d = relpos::mean_attention_distance(last).map_pixels;   // per head
//
// The maps come from the network's own inference path (Network::infer_attention), so the
// probabilities are exactly those the model computes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "relpos/attention_ops.hpp"
#include "relpos/tensor.hpp"

namespace relpos {

// Global: BoTNet attention over the whole map (keys: the h x w grid). Local: SASA attention over
// the k x k window around each query (keys: the window).
enum class AttentionKind : std::uint8_t { Global, Local };
std::string to_string(AttentionKind k);  // "global" | "local"

// One attention layer's inputs, probabilities and output for a batch of B images. All tensors are
// contiguous on the CPU.
struct AttentionMaps {
  std::string layer;  // the layer's name in `relpos info` ("stages.2.1.self_attn")
  AttentionKind kind = AttentionKind::Global;
  BotAttnSpec bot;    // kind Global
  SasaSpec sasa;      // kind Local
  int height = 0, width = 0;  // the map the attention runs on (before a stride-2 pool)
  // Input pixels per map cell, down and across (28x28 input, 7x7 map: 4 and 4).
  double input_scale_y = 1.0, input_scale_x = 1.0;
  Tensor qkv;    // (B, channels_qkv, h, w): the qkv projection, q | k | v, head-major (docs/attention.md)
  // Global: (B, heads, N, N), probs[b][h][i][j] for query i = y*w + x and key j (row-major).
  // Local: (B, heads, N, k*k), the window entry (dy + k/2)*k + (dx + k/2) for key offset (dy, dx);
  // 0 for window entries outside the image. Each query's probabilities sum to 1.
  Tensor probs;
  Tensor out;  // (B, heads*dv, h, w): the attention op's output (before a stride-2 pool)
  // Position parameters as the layer holds them (copies). Global relative: pos_h = Rh, pos_w = Rw
  // ((rows, dqk), or (heads, rows, dqk) with per_head); absolute: pos_h = P (N, dqk) or
  // (heads, N, dqk), pos_w undefined; none: both undefined. Local: pos_h = r_row, pos_w = r_col,
  // each (k, dqk/2).
  Tensor pos_h, pos_w;

  int heads() const { return kind == AttentionKind::Global ? bot.heads : sasa.heads; }
  int dqk() const { return kind == AttentionKind::Global ? bot.dqk : sasa.dqk; }
  int dv() const { return kind == AttentionKind::Global ? bot.dv : sasa.dv; }
  int batch() const { return qkv.defined() ? static_cast<int>(qkv.dim(0)) : 0; }
  int queries() const { return height * width; }
  // Keys per query: N for Global, k*k window entries for Local.
  int keys() const { return kind == AttentionKind::Global ? queries() : sasa.kernel * sasa.kernel; }
  // Whether the layer has relative position tables (Global relative, or Local).
  bool has_relative_tables() const { return kind == AttentionKind::Local || bot.pos == PosEncoding::Relative; }
  // Where key slot `key` of query (y, x) lies on the map, and whether it is inside it (Global:
  // always; Local: the window may reach past the border).
  bool key_cell(int y, int x, int key, int& key_y, int& key_x) const;
};

// One query's logits over its keys, per head, split into its two terms:
//   logit = content + position,  probs = softmax(logit) over the keys inside the map.
// content = s q.k (s = dqk^-0.5). position: Global relative q.Rh[dy] + q.Rw[dx] (the op's
// rel_pos_logits), absolute q.P[key], none 0; Local q[:d/2].r_row[dy] + q[d/2:].r_col[dx]. With
// scale_pos_embed both terms carry s: s q.k and s pos. Each tensor is (heads, keys), keys as in
// AttentionMaps::probs; entries of keys outside the map are 0 and `inside` says which are in.
struct QueryTerms {
  int y = 0, x = 0, image = 0;
  Tensor content, position, probs;
  std::vector<std::uint8_t> inside;  // keys(): 1 for keys on the map
  // Relative layers: the two tables behind the position term, (heads, rows_h) and (heads, rows_w):
  // row_term[h][r] = q.Rh[r] (Global) or q[:d/2].r_row[r] (Local), col_term likewise with Rw,
  // r_col; both times s with scale_pos_embed. Undefined for absolute and no positions.
  Tensor row_term, col_term;
};
QueryTerms query_terms(const AttentionMaps& maps, int y, int x, int image = 0);

// The mean attention distance of each head (as in the ViT papers): the expected distance between a
// query and its keys under the attention probabilities, sum_j p_ij |cell_i - cell_j| (Euclidean),
// averaged over all queries and images. map_pixels in cells of the attention's map; input_pixels
// with the offsets scaled by input_scale_y / input_scale_x. `uniform_*` is the same for attention
// spread evenly over every key a query has (a reference: a head below it prefers near keys).
struct AttentionDistance {
  std::vector<double> map_pixels, input_pixels;  // per head
  double uniform_map_pixels = 0, uniform_input_pixels = 0;
};
AttentionDistance mean_attention_distance(const AttentionMaps& maps);

// Cosine similarity between every pair of rows of a table: (rows, d) gives (rows, rows), and a
// stack (heads, rows, d) gives (heads, rows, rows). A zero row has similarity 0 with every row.
Tensor cosine_similarity(const Tensor& table);

// The offset a row of a relative table stands for, key minus query: Global tables hold
// -(rows-1)/2 .. (rows-1)/2 (with clip k, the end rows also stand for every offset beyond ±k);
// Local tables -(k/2) .. k/2.
int table_offset(int row, int rows);

}  // namespace relpos
