// The pictures of relpos explain (docs/explain.md).
#include "explain_pictures.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <opencv2/imgproc.hpp>

#include "relpos/preprocess.hpp"

namespace relpos::cli {

namespace {

const cv::Scalar kWhite(255, 255, 255), kInk(40, 40, 40), kQuery(255, 255, 0), kMark(0, 140, 255);
constexpr double kTitle = 0.55;

// A white picture at least height x width, wide enough for its two title lines, with them drawn.
cv::Mat titled_canvas(int height, int width, const std::string& title, const std::string& second) {
  width = std::max({width, text_width(title, kTitle) + 24, text_width(second, 0.45) + 24});
  cv::Mat img(height, width, CV_8UC3, kWhite);
  draw_text(img, title, {12, 24}, kTitle, kInk, 1);
  if (!second.empty()) draw_text(img, second, {12, 46}, 0.45);
  return img;
}

std::vector<std::string> offset_labels(int first, int count) {
  std::vector<std::string> s;
  for (int i = 0; i < count; ++i) s.push_back(std::to_string(first + i));
  return s;
}

// The labels of a relative table's rows: offsets, with the end rows of a clipped table written
// "<=-k" and ">=k".
std::vector<std::string> table_labels(int rows, bool clipped) {
  std::vector<std::string> s;
  for (int r = 0; r < rows; ++r) s.push_back(std::to_string(table_offset(r, rows)));
  if (clipped && rows > 1) {
    s.front() = "<=" + s.front();
    s.back() = ">=" + s.back();
  }
  return s;
}

// A cell of a map drawn `size` pixels wide and high over `cols` x `rows` cells, offset by `at`.
cv::Rect cell_rect(cv::Point at, cv::Size size, int rows, int cols, int r, int c) {
  const double cw = static_cast<double>(size.width) / cols, ch = static_cast<double>(size.height) / rows;
  const int x0 = static_cast<int>(std::lround(c * cw)), x1 = static_cast<int>(std::lround((c + 1) * cw));
  const int y0 = static_cast<int>(std::lround(r * ch)), y1 = static_cast<int>(std::lround((r + 1) * ch));
  return {at.x + x0, at.y + y0, x1 - x0, y1 - y0};
}

void outline(cv::Mat& img, cv::Rect r, cv::Scalar colour, int thickness = 2) {
  cv::rectangle(img, r, {0, 0, 0}, thickness + 2);
  cv::rectangle(img, r, colour, thickness);
}

// The key grid of a query: the map for Global, the k x k window for Local.
int grid_rows(const AttentionMaps& m) { return m.kind == AttentionKind::Global ? m.height : m.sasa.kernel; }
int grid_cols(const AttentionMaps& m) { return m.kind == AttentionKind::Global ? m.width : m.sasa.kernel; }
// The query's own cell in its key grid.
cv::Point query_cell(const AttentionMaps& m, const QueryTerms& t) {
  return m.kind == AttentionKind::Global ? cv::Point(t.x, t.y) : cv::Point(m.sasa.kernel / 2, m.sasa.kernel / 2);
}
// Offsets (key minus query) of the key grid's first row and column.
cv::Point first_offset(const AttentionMaps& m, const QueryTerms& t) {
  return m.kind == AttentionKind::Global ? cv::Point(-t.x, -t.y) : cv::Point(-(m.sasa.kernel / 2), -(m.sasa.kernel / 2));
}

// A head's probabilities laid over the whole map (Local: the window's cells; the rest invalid).
Grid map_grid(const AttentionMaps& m, const QueryTerms& t, int head) {
  Grid g;
  g.rows = m.height, g.cols = m.width;
  g.values.assign(static_cast<std::size_t>(m.queries()), 0.0f);
  g.valid.assign(static_cast<std::size_t>(m.queries()), m.kind == AttentionKind::Global ? 1 : 0);
  const float* p = t.probs.data() + static_cast<std::int64_t>(head) * m.keys();
  for (int j = 0; j < m.keys(); ++j) {
    int ky = 0, kx = 0;
    if (!m.key_cell(t.y, t.x, j, ky, kx)) continue;
    const std::size_t i = static_cast<std::size_t>(ky * m.width + kx);
    g.values[i] = p[j];
    g.valid[i] = 1;
  }
  return g;
}

std::string cells_text(double v) { return short_number(v, 2); }

}  // namespace

std::string position_text(const AttentionMaps& m) {
  if (m.kind == AttentionKind::Local)
    return "relative (" + std::to_string(m.sasa.kernel) + "x" + std::to_string(m.sasa.kernel) + " window)";
  std::string s = to_string(m.bot.pos);
  if (m.bot.pos == PosEncoding::Relative && m.bot.clip > 0) s += ", clip " + std::to_string(m.bot.clip);
  if (m.bot.pos != PosEncoding::None && m.bot.per_head) s += ", per-head tables";
  if (m.bot.pos != PosEncoding::None && m.bot.scale_pos_embed) s += ", scaled";
  return s;
}

Grid key_grid(const AttentionMaps& m, const QueryTerms& t, const Tensor& values, int head) {
  Grid g;
  g.rows = grid_rows(m), g.cols = grid_cols(m);
  const float* v = values.data() + static_cast<std::int64_t>(head) * m.keys();
  g.values.assign(v, v + m.keys());
  if (m.kind == AttentionKind::Local) g.valid = t.inside;
  return g;
}

void draw_attention_picture(const AttentionMaps& m, const QueryTerms& t, const AttentionDistance& dist,
                            const cv::Mat& image_bgr, const std::vector<int>& heads, const std::string& title,
                            const std::string& path) {
  const int pw = 224, ph = std::max(32, static_cast<int>(std::lround(224.0 * image_bgr.rows / image_bgr.cols)));
  cv::Mat big;
  cv::resize(image_bgr, big, {pw, ph}, 0, 0, image_bgr.cols * 2 <= pw ? cv::INTER_NEAREST : cv::INTER_AREA);
  std::vector<float> shown;
  for (int h : heads) {
    const Grid g = map_grid(m, t, h);
    for (std::size_t i = 0; i < g.values.size(); ++i)
      if (g.valid[i]) shown.push_back(g.values[i]);
  }
  const ColourScale scale = ColourScale::fit(ColourScale::Sequential, shown);
  const int ncols = std::min<int>(4, static_cast<int>(heads.size()));
  const int nrows = (static_cast<int>(heads.size()) + ncols - 1) / ncols;
  const int top = 66, header = 42, left = 44, gap = 22;
  const int heads_x = left + pw + 36;
  const int bar_x = heads_x + ncols * (pw + gap) + 4;
  cv::Mat img = titled_canvas(top + nrows * (header + ph + 12) + 10, bar_x + 90, title,
              m.layer + ": attention of query (" + std::to_string(t.y) + ", " + std::to_string(t.x) + ") of the " +
                  std::to_string(m.height) + "x" + std::to_string(m.width) + " map, " +
                  (m.kind == AttentionKind::Global ? "all keys" : "its " + std::to_string(m.sasa.kernel) + "x" +
                                                                      std::to_string(m.sasa.kernel) + " window") +
                  "; one colour scale for all heads; mean distance: over all queries");

  // the map's cells and their offsets from the query
  {
    const cv::Point at(left, top + header);
    big.copyTo(img(cv::Rect(at, big.size())));
    for (int r = 0; r < m.height; ++r)
      for (int c = 0; c < m.width; ++c)
        cv::rectangle(img, cell_rect(at, big.size(), m.height, m.width, r, c), {170, 170, 170}, 1);
    if (m.kind == AttentionKind::Local) {
      const int k = m.sasa.kernel / 2;
      const cv::Rect a = cell_rect(at, big.size(), m.height, m.width, std::max(0, t.y - k), std::max(0, t.x - k));
      const cv::Rect b = cell_rect(at, big.size(), m.height, m.width, std::min(m.height - 1, t.y + k),
                                   std::min(m.width - 1, t.x + k));
      outline(img, a | b, kMark, 2);
    }
    outline(img, cell_rect(at, big.size(), m.height, m.width, t.y, t.x), kQuery);
    draw_axis_labels(img, cv::Rect(at, big.size()), offset_labels(-t.y, m.height), offset_labels(-t.x, m.width), 0.36);
    draw_text(img, "query (" + std::to_string(t.y) + ", " + std::to_string(t.x) + "): key offsets", {left - 30, top + 4},
              0.45);
    draw_text(img, "dy (rows, left), dx (columns, top)", {left - 30, top + 20}, 0.38);
    draw_text(img, "cell = " + cells_text(m.input_scale_y) + "x" + cells_text(m.input_scale_x) + " input px",
              {left, top + header + ph + 16}, 0.38);
  }

  for (std::size_t n = 0; n < heads.size(); ++n) {
    const int h = heads[n];
    const int col = static_cast<int>(n) % ncols, row = static_cast<int>(n) / ncols;
    const cv::Point at(heads_x + col * (pw + gap), top + row * (header + ph + 12) + header);
    const Grid g = map_grid(m, t, h);
    const cv::Mat over = overlay_grid(big, g, scale, 0.65);
    over.copyTo(img(cv::Rect(at, over.size())));
    outline(img, cell_rect(at, over.size(), m.height, m.width, t.y, t.x), kQuery);
    float best = 0.0f;
    for (std::size_t i = 0; i < g.values.size(); ++i)
      if (g.valid[i]) best = std::max(best, g.values[i]);
    draw_text(img, "head " + std::to_string(h), {at.x, at.y - 24}, 0.5, kInk, 1);
    draw_text(img,
              "max p " + cells_text(best) + ", mean distance " +
                  cells_text(dist.map_pixels[static_cast<std::size_t>(h)]) + " cells",
              {at.x, at.y - 7}, 0.38);
  }
  draw_colour_bar(img, {bar_x, top + header, 18, ph}, scale, "p");
  write_image(path, img);
}

void draw_terms_picture(const AttentionMaps& m, const QueryTerms& t, const std::vector<int>& heads,
                        const std::string& title, const std::string& path) {
  const int rows = grid_rows(m), cols = grid_cols(m);
  const int cell = std::clamp(300 / std::max(rows, cols), 6, 44);
  const cv::Size gs(cell * cols, cell * rows);
  const bool relative = t.row_term.defined();
  const bool global = m.kind == AttentionKind::Global;
  const int strip = relative ? 14 : 0;  // the row and column terms beside the position panel
  std::string pos_title;
  if (global && m.bot.pos == PosEncoding::None) pos_title = "no position term (pos: none)";
  else if (global && m.bot.pos == PosEncoding::Absolute) pos_title = "position q.P[key] (absolute)";
  else if (global) pos_title = "position q.Rh[dy] + q.Rw[dx]";
  else pos_title = "position q1.r_row[dy] + q2.r_col[dx]";
  if (global && m.bot.scale_pos_embed && m.bot.pos != PosEncoding::None) pos_title = "s * (" + pos_title + ")";
  const std::string headers[3] = {"content s q.k", pos_title, "logit = content + position"};
  // room for the column headings above small grids
  const int gap = std::max(56 + strip, text_width(pos_title, 0.45) - gs.width + 40);
  const int left = 60, top = 130, header = 40;
  const int row_h = header + gs.height + 26;
  const int bar_x = left + 3 * gs.width + 2 * gap + 14;
  const cv::Point q = query_cell(m, t), first = first_offset(m, t);
  cv::Mat img = titled_canvas(top + static_cast<int>(heads.size()) * row_h, bar_x + 110, title,
              m.layer + ": the logits of query (" + std::to_string(t.y) + ", " + std::to_string(t.x) +
                  ") split into their two terms; position encoding: " + position_text(m));
  for (int c = 0; c < 3; ++c) draw_text(img, headers[c], {left + c * (gs.width + gap) - 20, top - 22}, 0.45, kInk, 1);
  std::string note = global ? "keys: the whole map; " : "keys: the window (hatched: outside the image); ";
  note += "dy, dx: key minus query; same colour scale across a row";
  if (relative) note += "; strips: q.R[dy] (left) and q.R[dx] (top)";
  draw_text(img, note, {12, 66}, 0.38);
  if (global && m.bot.pos == PosEncoding::Relative && m.bot.clip > 0)
    draw_text(img, "orange box: |dy|, |dx| <= clip " + std::to_string(m.bot.clip) +
                       "; beyond it the end rows of the tables repeat",
              {12, 84}, 0.38, {0, 100, 200});

  for (std::size_t n = 0; n < heads.size(); ++n) {
    const int h = heads[n];
    const int y0 = top + static_cast<int>(n) * row_h + header;
    const Grid content = key_grid(m, t, t.content, h), position = key_grid(m, t, t.position, h);
    Grid logit = content;
    for (std::size_t i = 0; i < logit.values.size(); ++i) logit.values[i] += position.values[i];
    std::vector<float> all;
    const Grid* grids[3] = {&content, &position, &logit};
    for (const Grid* g : grids)
      for (std::size_t i = 0; i < g->values.size(); ++i)
        if (g->valid.empty() || g->valid[i]) all.push_back(g->values[i]);
    const ColourScale scale = ColourScale::fit(ColourScale::Diverging, all);
    // the key the head weights most
    int best = 0;
    for (int j = 0; j < m.keys(); ++j)
      if (t.probs.data()[h * m.keys() + j] > t.probs.data()[h * m.keys() + best]) best = j;
    draw_text(img,
              "head " + std::to_string(h) + ": most weight (p " + cells_text(t.probs.data()[h * m.keys() + best]) +
                  ") on the key at dy " + std::to_string(best / cols + first.y) + ", dx " +
                  std::to_string(best % cols + first.x),
              {left - 40, y0 - header + 12}, 0.45, kInk, 1);
    for (int c = 0; c < 3; ++c) {
      const cv::Rect box(left + c * (gs.width + gap), y0 + strip, gs.width, gs.height);
      draw_grid(img, box, *grids[c], scale, true);
      outline(img, cell_rect(box.tl(), gs, rows, cols, q.y, q.x), kInk, 1);
      draw_axis_labels(img, {box.x - (c == 1 ? strip + 2 : 0), box.y, box.width, box.height},
                       offset_labels(first.y, rows), {}, 0.34);
      draw_axis_labels(img, {box.x, box.y - (c == 1 ? strip + 2 : 0), box.width, box.height}, {},
                       offset_labels(first.x, cols), 0.34);
      if (c == 1 && relative) {
        // the two tables' entries each key row / column picks
        const int rh = static_cast<int>(t.row_term.dim(1)), rw = static_cast<int>(t.col_term.dim(1));
        const int kh = (rh - 1) / 2, kw = (rw - 1) / 2;
        Grid rg{rows, 1, {}, {}}, cg{1, cols, {}, {}};
        for (int r = 0; r < rows; ++r)
          rg.values.push_back(t.row_term.data()[h * rh + std::clamp(first.y + r, -kh, kh) + kh]);
        for (int cc = 0; cc < cols; ++cc)
          cg.values.push_back(t.col_term.data()[h * rw + std::clamp(first.x + cc, -kw, kw) + kw]);
        draw_grid(img, {box.x - strip - 2, box.y, strip, box.height}, rg, scale, false);
        draw_grid(img, {box.x, box.y - strip - 2, box.width, strip}, cg, scale, false);
        if (global && m.bot.clip > 0) {
          const int k = m.bot.clip;
          const cv::Rect a = cell_rect(box.tl(), gs, rows, cols, std::max(0, t.y - k), std::max(0, t.x - k));
          const cv::Rect b =
              cell_rect(box.tl(), gs, rows, cols, std::min(rows - 1, t.y + k), std::min(cols - 1, t.x + k));
          outline(img, a | b, kMark, 2);
        }
      }
    }
    draw_colour_bar(img, {bar_x, y0 + strip, 16, gs.height}, scale, "logit");
  }
  write_image(path, img);
}

void draw_tables_picture(const AttentionMaps& m, const std::string& title, const std::string& path) {
  const bool global = m.kind == AttentionKind::Global;
  if (global && m.bot.pos == PosEncoding::None) {
    cv::Mat img = titled_canvas(110, 760, title, m.layer + " has no position tables (pos: none):");
    draw_text(img, "its logits are the content term s q.k alone, so its attention does not depend on where a key is.",
              {12, 80}, 0.45);
    write_image(path, img);
    return;
  }
  const ColourScale scale{ColourScale::Diverging, -1.0, 1.0};
  if (global && m.bot.pos == PosEncoding::Absolute) {
    // the position-wise similarity picture: for each position, its similarity with every position
    const Tensor sim = cosine_similarity(m.pos_h);
    const int stacks = sim.ndim() == 3 ? static_cast<int>(sim.dim(0)) : 1, n = m.queries();
    const int mini = std::max(2, 56 / std::max(m.height, m.width));
    const cv::Size ms(mini * m.width, mini * m.height);
    const int pad = 4, left = 40, top = 90;
    const int panel_w = m.width * (ms.width + pad), panel_h = m.height * (ms.height + pad);
    cv::Mat img = titled_canvas(top + panel_h + 30, left + stacks * (panel_w + 40) + 80, title,
                m.layer + ": absolute position embeddings P (" + std::to_string(n) + " x " + std::to_string(m.dqk()) +
                    "): tile (y, x) shows cos(P[y, x], P[key]) over the " + std::to_string(m.height) + "x" +
                    std::to_string(m.width) + " map");
    for (int s = 0; s < stacks; ++s) {
      const int x0 = left + s * (panel_w + 40);
      if (stacks > 1) draw_text(img, "head " + std::to_string(s), {x0, top - 14}, 0.45);
      for (int y = 0; y < m.height; ++y)
        for (int x = 0; x < m.width; ++x) {
          Grid g{m.height, m.width, {}, {}};
          const float* row = sim.data() + (static_cast<std::int64_t>(s) * n + y * m.width + x) * n;
          g.values.assign(row, row + n);
          draw_grid(img, {x0 + x * (ms.width + pad), top + y * (ms.height + pad), ms.width, ms.height}, g, scale, false);
        }
    }
    draw_colour_bar(img, {left + stacks * (panel_w + 40), top, 16, std::min(panel_h, 240)}, scale, "cos");
    write_image(path, img);
    return;
  }
  // relative tables: rows (dy) and columns (dx)
  const Tensor sim_h = cosine_similarity(m.pos_h), sim_w = cosine_similarity(m.pos_w);
  const int stacks = sim_h.ndim() == 3 ? static_cast<int>(sim_h.dim(0)) : 1;
  const int rows_h = static_cast<int>(sim_h.dim(-1)), rows_w = static_cast<int>(sim_w.dim(-1));
  const bool clipped = global && m.bot.clip > 0;
  const int cell = std::clamp(300 / std::max(rows_h, rows_w), 5, 40);
  const int left = 56, top = 110, header = 40;
  const std::string who0 = stacks > 1 ? "head 0: " : "";
  const std::string captions[2] = {"row offsets dy: cos(R[dy], R[dy'])", "column offsets dx: cos(R[dx], R[dx'])"};
  const int second_x = left + std::max(cell * rows_h + 90, text_width(who0 + captions[0], 0.42) + 30);
  const int panel_h = cell * std::max(rows_h, rows_w) + header + 30;
  const int bar_x = second_x + std::max(cell * rows_w, text_width(who0 + captions[1], 0.42) - 30) + 30;
  const std::string what = global ? "Rh (pos_embed.height_rel) and Rw (pos_embed.width_rel)"
                                  : "r_row (acts on q[:d/2]) and r_col (acts on q[d/2:])";
  cv::Mat img = titled_canvas(top + stacks * panel_h + 20, bar_x + 90, title,
                              m.layer + ": cosine similarity between the learned offset embeddings " + what);
  std::string note = "offsets are key minus query";
  if (global && !clipped)
    note += "; the tables cover every offset of the " + std::to_string(m.height) + "x" + std::to_string(m.width) + " map";
  if (!global) note += "; the " + std::to_string(m.sasa.kernel) + "x" + std::to_string(m.sasa.kernel) + " window";
  draw_text(img, note, {12, 68}, 0.4);
  if (clipped)
    draw_text(img, "clip " + std::to_string(m.bot.clip) + ": the end rows (orange lines) also stand for every offset beyond +-" +
                       std::to_string(m.bot.clip),
              {12, 86}, 0.4, {0, 100, 200});
  for (int s = 0; s < stacks; ++s) {
    const int y0 = top + s * panel_h + header;
    const std::string who = stacks > 1 ? "head " + std::to_string(s) + ": " : "";
    for (int which = 0; which < 2; ++which) {
      const Tensor& sim = which == 0 ? sim_h : sim_w;
      const int rows = which == 0 ? rows_h : rows_w;
      const int x0 = which == 0 ? left : second_x;
      Grid g{rows, rows, {}, {}};
      const float* v = sim.data() + static_cast<std::int64_t>(s) * rows * rows;
      g.values.assign(v, v + rows * rows);
      const cv::Rect box(x0, y0, cell * rows, cell * rows);
      draw_grid(img, box, g, scale, cell >= 30);
      const auto labels = table_labels(rows, clipped);
      draw_axis_labels(img, box, labels, labels, 0.34);
      draw_text(img, who + captions[which], {x0 - 30, y0 - header + 6}, 0.42, kInk, 1);
      if (clipped) {
        for (int e : {1, rows - 1}) {
          cv::line(img, {box.x + e * cell, box.y}, {box.x + e * cell, box.y + box.height}, kMark, 2);
          cv::line(img, {box.x, box.y + e * cell}, {box.x + box.width, box.y + e * cell}, kMark, 2);
        }
      }
    }
  }
  draw_colour_bar(img, {bar_x, top + header, 16, std::min(200, cell * std::max(rows_h, rows_w))}, scale, "cos");
  write_image(path, img);
}

void draw_distance_chart(const std::vector<AttentionMaps>& layers, const std::vector<AttentionDistance>& dists,
                         const std::string& title, const std::string& path) {
  std::vector<BarGroup> groups;
  std::size_t bars = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    std::string name = layers[i].layer;
    const std::size_t dot = name.rfind('.');
    if (dot != std::string::npos) name = name.substr(0, dot);  // "stages.2.1"
    groups.push_back({name + " (" + std::to_string(layers[i].height) + "x" + std::to_string(layers[i].width) + ")",
                      dists[i].input_pixels, dists[i].uniform_input_pixels});
    bars += dists[i].input_pixels.size();
  }
  const int width = std::max(640, 120 + static_cast<int>(bars + groups.size()) * 34);
  cv::Mat img = titled_canvas(430, width, title,
              "mean attention distance of each head (input pixels): sum_j p_ij |i - j|, averaged over the queries;"
              " dashed: uniform attention");
  draw_bar_chart(img, {0, 60, width, 370}, groups, "input pixels");
  write_image(path, img);
}

}  // namespace relpos::cli
