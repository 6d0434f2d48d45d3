// What an attention layer computed, and the numbers that explain it (relpos/attention_maps.hpp,
// docs/explain.md). The maps themselves are recorded by the layers (layers/attention_layers.cpp)
// on the network's inference path (Network::infer_attention); this file only reads them.
#include "relpos/attention_maps.hpp"

#include <algorithm>
#include <cmath>

#include "relpos/error.hpp"

namespace relpos {

std::string to_string(AttentionKind k) { return k == AttentionKind::Global ? "global" : "local"; }

int table_offset(int row, int rows) { return row - (rows - 1) / 2; }

bool AttentionMaps::key_cell(int y, int x, int key, int& key_y, int& key_x) const {
  if (kind == AttentionKind::Global) {
    key_y = key / width;
    key_x = key % width;
    return true;
  }
  const int k = sasa.kernel, r = k / 2;
  key_y = y + key / k - r;
  key_x = x + key % k - r;
  return key_y >= 0 && key_y < height && key_x >= 0 && key_x < width;
}

namespace {

// Reads q and k of one head from the contiguous (B, C, h, w) qkv tensor.
struct QkvView {
  const float* base;
  std::int64_t n, channels;
  int heads, dqk;
  float q(int head, std::int64_t cell, int c) const { return base[(static_cast<std::int64_t>(head) * dqk + c) * n + cell]; }
  float k(int head, std::int64_t cell, int c) const {
    return base[(static_cast<std::int64_t>(heads + head) * dqk + c) * n + cell];
  }
};

// q[from, from + len) of one head and query, dotted with row `row` of a (rows, len) table.
double dot_row(const QkvView& v, int head, std::int64_t cell, int from, const float* table, int row, int len) {
  double s = 0.0;
  for (int c = 0; c < len; ++c) s += static_cast<double>(v.q(head, cell, from + c)) * table[static_cast<std::int64_t>(row) * len + c];
  return s;
}

}  // namespace

QueryTerms query_terms(const AttentionMaps& m, int y, int x, int image) {
  RELPOS_CHECK(m.qkv.defined() && m.probs.defined(), "query_terms: the attention maps are empty");
  RELPOS_CHECK(y >= 0 && y < m.height && x >= 0 && x < m.width,
               m.layer << ": query (" << y << ", " << x << ") is outside the " << m.height << "x" << m.width << " map");
  RELPOS_CHECK(image >= 0 && image < m.batch(), m.layer << ": image " << image << " of a batch of " << m.batch());
  const int heads = m.heads(), keys = m.keys(), d = m.dqk();
  const std::int64_t n = m.queries(), cell = static_cast<std::int64_t>(y) * m.width + x;
  const QkvView v{m.qkv.data() + image * m.qkv.dim(1) * n, n, m.qkv.dim(1), heads, d};
  const bool global = m.kind == AttentionKind::Global;
  const float s = global ? m.bot.scale() : m.sasa.scale();
  const float alpha = global && m.bot.scale_pos_embed ? s : 1.0f;
  const bool relative = m.has_relative_tables();

  QueryTerms t;
  t.y = y, t.x = x, t.image = image;
  t.content = Tensor::zeros({heads, keys});
  t.position = Tensor::zeros({heads, keys});
  t.probs = Tensor::zeros({heads, keys});
  t.inside.assign(static_cast<std::size_t>(keys), 0);
  std::vector<int> ky(static_cast<std::size_t>(keys)), kx(static_cast<std::size_t>(keys));
  for (int j = 0; j < keys; ++j) t.inside[static_cast<std::size_t>(j)] = m.key_cell(y, x, j, ky[j], kx[j]) ? 1 : 0;

  // the position tables' rows and row width (Global per_head: a slice per head)
  int rows_h = 0, rows_w = 0, width = d;
  if (relative) {
    rows_h = static_cast<int>(m.pos_h.dim(-2));
    rows_w = static_cast<int>(m.pos_w.dim(-2));
    if (!global) width = d / 2;
    t.row_term = Tensor::zeros({heads, rows_h});
    t.col_term = Tensor::zeros({heads, rows_w});
  }
  const bool per_head = global && m.bot.per_head;
  const auto table_of = [&](const Tensor& tab, int head, int rows) {
    return tab.data() + (per_head ? static_cast<std::int64_t>(head) * rows * width : 0);
  };

  for (int h = 0; h < heads; ++h) {
    float* content = t.content.data() + static_cast<std::int64_t>(h) * keys;
    float* position = t.position.data() + static_cast<std::int64_t>(h) * keys;
    const float* p = m.probs.data() + ((static_cast<std::int64_t>(image) * heads + h) * n + cell) * keys;
    std::copy(p, p + keys, t.probs.data() + static_cast<std::int64_t>(h) * keys);
    float* rt = relative ? t.row_term.data() + static_cast<std::int64_t>(h) * rows_h : nullptr;
    float* ct = relative ? t.col_term.data() + static_cast<std::int64_t>(h) * rows_w : nullptr;
    if (relative) {
      const float* th = table_of(m.pos_h, h, rows_h);
      const float* tw = table_of(m.pos_w, h, rows_w);
      for (int r = 0; r < rows_h; ++r) rt[r] = alpha * static_cast<float>(dot_row(v, h, cell, 0, th, r, width));
      for (int r = 0; r < rows_w; ++r) ct[r] = alpha * static_cast<float>(dot_row(v, h, cell, global ? 0 : width, tw, r, width));
    }
    const int kh = (rows_h - 1) / 2, kw = (rows_w - 1) / 2;
    for (int j = 0; j < keys; ++j) {
      if (!t.inside[static_cast<std::size_t>(j)]) continue;
      const std::int64_t kc = static_cast<std::int64_t>(ky[j]) * m.width + kx[j];
      double qk = 0.0;
      for (int c = 0; c < d; ++c) qk += static_cast<double>(v.q(h, cell, c)) * v.k(h, kc, c);
      content[j] = s * static_cast<float>(qk);
      if (relative) {
        // key minus query, clamped to the table (Global with clip; otherwise always inside it)
        const int dy = std::clamp(ky[j] - y, -kh, kh), dx = std::clamp(kx[j] - x, -kw, kw);
        position[j] = rt[dy + kh] + ct[dx + kw];
      } else if (m.bot.pos == PosEncoding::Absolute) {
        position[j] = alpha * static_cast<float>(dot_row(v, h, cell, 0, table_of(m.pos_h, h, static_cast<int>(n)),
                                                         static_cast<int>(kc), d));
      }
    }
  }
  return t;
}

AttentionDistance mean_attention_distance(const AttentionMaps& m) {
  RELPOS_CHECK(m.probs.defined(), "mean_attention_distance: the attention maps are empty");
  const int heads = m.heads(), keys = m.keys(), batch = m.batch();
  const std::int64_t n = m.queries();
  AttentionDistance r;
  r.map_pixels.assign(static_cast<std::size_t>(heads), 0.0);
  r.input_pixels.assign(static_cast<std::size_t>(heads), 0.0);
  std::vector<double> dist_map(static_cast<std::size_t>(keys)), dist_in(static_cast<std::size_t>(keys));
  std::vector<std::uint8_t> inside(static_cast<std::size_t>(keys));
  for (std::int64_t i = 0; i < n; ++i) {
    const int y = static_cast<int>(i / m.width), x = static_cast<int>(i % m.width);
    int count = 0;
    double sum_map = 0.0, sum_in = 0.0;
    for (int j = 0; j < keys; ++j) {
      int ky = 0, kx = 0;
      inside[static_cast<std::size_t>(j)] = m.key_cell(y, x, j, ky, kx) ? 1 : 0;
      const double dy = ky - y, dx = kx - x;
      dist_map[static_cast<std::size_t>(j)] = std::sqrt(dy * dy + dx * dx);
      dist_in[static_cast<std::size_t>(j)] =
          std::hypot(dy * m.input_scale_y, dx * m.input_scale_x);
      if (inside[static_cast<std::size_t>(j)]) {
        ++count;
        sum_map += dist_map[static_cast<std::size_t>(j)];
        sum_in += dist_in[static_cast<std::size_t>(j)];
      }
    }
    r.uniform_map_pixels += sum_map / count;
    r.uniform_input_pixels += sum_in / count;
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < heads; ++h) {
        const float* p = m.probs.data() + ((static_cast<std::int64_t>(b) * heads + h) * n + i) * keys;
        double e_map = 0.0, e_in = 0.0;
        for (int j = 0; j < keys; ++j)
          if (inside[static_cast<std::size_t>(j)]) {
            e_map += p[j] * dist_map[static_cast<std::size_t>(j)];
            e_in += p[j] * dist_in[static_cast<std::size_t>(j)];
          }
        r.map_pixels[static_cast<std::size_t>(h)] += e_map;
        r.input_pixels[static_cast<std::size_t>(h)] += e_in;
      }
  }
  const double queries = static_cast<double>(n) * batch;
  for (int h = 0; h < heads; ++h) {
    r.map_pixels[static_cast<std::size_t>(h)] /= queries;
    r.input_pixels[static_cast<std::size_t>(h)] /= queries;
  }
  r.uniform_map_pixels /= static_cast<double>(n);
  r.uniform_input_pixels /= static_cast<double>(n);
  return r;
}

Tensor cosine_similarity(const Tensor& table_in) {
  RELPOS_CHECK(table_in.ndim() == 2 || table_in.ndim() == 3,
               "cosine_similarity: needs a (rows, d) or (heads, rows, d) table, got " << table_in.describe());
  const Tensor t = table_in.to(Device::CPU).contiguous();
  const std::int64_t stacks = t.ndim() == 3 ? t.dim(0) : 1, rows = t.dim(-2), d = t.dim(-1);
  Tensor out(t.ndim() == 3 ? Shape{stacks, rows, rows} : Shape{rows, rows});
  std::vector<double> norm(static_cast<std::size_t>(rows));
  for (std::int64_t s = 0; s < stacks; ++s) {
    const float* a = t.data() + s * rows * d;
    float* o = out.data() + s * rows * rows;
    for (std::int64_t i = 0; i < rows; ++i) {
      double q = 0.0;
      for (std::int64_t c = 0; c < d; ++c) q += static_cast<double>(a[i * d + c]) * a[i * d + c];
      norm[static_cast<std::size_t>(i)] = std::sqrt(q);
    }
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < rows; ++j) {
        double dot = 0.0;
        for (std::int64_t c = 0; c < d; ++c) dot += static_cast<double>(a[i * d + c]) * a[j * d + c];
        const double nn = norm[static_cast<std::size_t>(i)] * norm[static_cast<std::size_t>(j)];
        o[i * rows + j] = nn > 0 ? static_cast<float>(dot / nn) : 0.0f;
      }
  }
  return out;
}

}  // namespace relpos
