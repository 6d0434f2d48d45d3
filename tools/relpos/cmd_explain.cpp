// relpos explain: pictures of what a model's attention layers do with an image (docs/explain.md):
// one query's attention per head, its content and position terms, the learned position tables'
// similarities and each head's mean attention distance, and explain.json with the numbers.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>
#include <optional>
#include <sstream>

#include "cli_common.hpp"
#include "explain_pictures.hpp"
#include "relpos/attention_maps.hpp"

namespace relpos::cli {

namespace {

namespace fs = std::filesystem;

struct ExplainArgs {
  ModelOptions model;
  PreprocessOptions pre;
  std::string image;
  std::vector<std::string> layers;
  std::string query;  // "Y,X"
  int head = -1;
  std::string out;
};

// "Y,X" with non-negative integers.
std::pair<int, int> parse_query(const std::string& text) {
  int y = -1, x = -1;
  char comma = 0, extra = 0;
  std::istringstream in(text);
  const bool ok = static_cast<bool>(in >> y >> comma >> x) && comma == ',' && !(in >> extra) && y >= 0 && x >= 0;
  RELPOS_USAGE_CHECK(ok, "--query takes Y,X: the row and column of a cell of the attention's map, counted from 0 "
                         "(e.g. --query 3,3), got '" << text << "'");
  return {y, x};
}

// The image as the network saw it (resized and cropped), as 8-bit BGR for drawing.
cv::Mat network_view(const cv::Mat& image, const Preprocess& p) {
  cv::Mat seen = resize_and_crop(image, p), bgr;
  if (seen.depth() != CV_8U) seen.convertTo(seen, CV_8U);
  if (seen.channels() == 1) cv::cvtColor(seen, bgr, cv::COLOR_GRAY2BGR);
  else if (p.channels == ChannelOrder::RGB) cv::cvtColor(seen, bgr, cv::COLOR_RGB2BGR);
  else bgr = seen;
  return bgr;
}

// A query's values of one head as the rows of its key grid (map or window); keys outside the map
// are null.
nlohmann::json grid_json(const AttentionMaps& m, const QueryTerms& t, const Tensor& values, int head) {
  const int cols = m.kind == AttentionKind::Global ? m.width : m.sasa.kernel;
  nlohmann::json rows = nlohmann::json::array();
  for (int j = 0; j < m.keys(); ++j) {
    if (j % cols == 0) rows.push_back(nlohmann::json::array());
    if (t.inside[static_cast<std::size_t>(j)]) rows.back().push_back(values.data()[head * m.keys() + j]);
    else rows.back().push_back(nullptr);
  }
  return rows;
}

nlohmann::json matrix_json(const Tensor& t, int stack) {
  const std::int64_t r = t.dim(-2), c = t.dim(-1);
  nlohmann::json rows = nlohmann::json::array();
  for (std::int64_t i = 0; i < r; ++i)
    rows.push_back(std::vector<float>(t.data() + (stack * r + i) * c, t.data() + (stack * r + i + 1) * c));
  return rows;
}

nlohmann::json tables_json(const AttentionMaps& m) {
  nlohmann::json j;
  if (m.kind == AttentionKind::Global && m.bot.pos == PosEncoding::None) return {{"kind", "none"}};
  const bool absolute = m.kind == AttentionKind::Global && m.bot.pos == PosEncoding::Absolute;
  const Tensor sim_h = cosine_similarity(m.pos_h);
  const int stacks = sim_h.ndim() == 3 ? static_cast<int>(sim_h.dim(0)) : 1;
  j["kind"] = absolute ? "absolute" : "relative";
  j["per_head"] = stacks > 1;
  if (absolute) {
    nlohmann::json sims = nlohmann::json::array();
    for (int s = 0; s < stacks; ++s) sims.push_back(matrix_json(sim_h, s));
    j["position_similarity"] = stacks > 1 ? sims : sims[0];
    return j;
  }
  const Tensor sim_w = cosine_similarity(m.pos_w);
  const auto offsets = [](int rows) {
    std::vector<int> o;
    for (int r = 0; r < rows; ++r) o.push_back(table_offset(r, rows));
    return o;
  };
  j["row_offsets"] = offsets(static_cast<int>(sim_h.dim(-1)));
  j["column_offsets"] = offsets(static_cast<int>(sim_w.dim(-1)));
  j["clipped"] = m.kind == AttentionKind::Global && m.bot.clip > 0;
  nlohmann::json rs = nlohmann::json::array(), cs = nlohmann::json::array();
  for (int s = 0; s < stacks; ++s) rs.push_back(matrix_json(sim_h, s)), cs.push_back(matrix_json(sim_w, s));
  j["row_similarity"] = stacks > 1 ? rs : rs[0];
  j["column_similarity"] = stacks > 1 ? cs : cs[0];
  return j;
}

nlohmann::json query_json(const AttentionMaps& m, const QueryTerms& t, const std::vector<int>& heads) {
  nlohmann::json q = {{"y", t.y},
                      {"x", t.x},
                      {"input_box", {t.y * m.input_scale_y, t.x * m.input_scale_x, (t.y + 1) * m.input_scale_y,
                                     (t.x + 1) * m.input_scale_x}},
                      {"keys", m.kind == AttentionKind::Global ? "map" : "window"}};
  if (m.kind == AttentionKind::Local) q["window_offset"] = -(m.sasa.kernel / 2);
  nlohmann::json hs = nlohmann::json::array();
  for (int h : heads) {
    nlohmann::json e = {{"head", h},
                        {"probs", grid_json(m, t, t.probs, h)},
                        {"content", grid_json(m, t, t.content, h)},
                        {"position", grid_json(m, t, t.position, h)}};
    if (t.row_term.defined()) {
      const auto row = [&](const Tensor& x) {
        const std::int64_t n = x.dim(1);
        return std::vector<float>(x.data() + h * n, x.data() + (h + 1) * n);
      };
      e["row_term"] = row(t.row_term);
      e["column_term"] = row(t.col_term);
    }
    hs.push_back(e);
  }
  q["heads"] = hs;
  return q;
}

std::string file_stem(const AttentionMaps& m) {
  const std::size_t dot = m.layer.rfind('.');
  return dot == std::string::npos ? m.layer : m.layer.substr(0, dot);  // "stages.2.1"
}

std::string layer_names(const std::vector<AttentionMaps>& maps) {
  std::string s;
  for (const auto& m : maps) s += (s.empty() ? "" : ", ") + m.layer;
  return s;
}

void run(const ExplainArgs& a) {
  RELPOS_USAGE_CHECK(!a.out.empty(), "--out needs a folder name");
  Model model = a.model.load();
  a.pre.apply(model);
  const cv::Mat image = read_image(a.image);
  std::vector<AttentionMaps> maps = model.attention(image);
  RELPOS_CHECK(!maps.empty(), model.network().config().name
                                  << " has no attention layers (no self_attn or sasa blocks): nothing to explain");
  // the layers to explain: those named (by the layer's or its block's name), else all of them
  std::vector<std::size_t> chosen;
  for (const std::string& name : a.layers) {
    std::size_t found = maps.size();
    for (std::size_t i = 0; i < maps.size(); ++i)
      if (maps[i].layer == name || file_stem(maps[i]) == name) found = i;
    RELPOS_USAGE_CHECK(found < maps.size(),
                       "--layer " << name << ": not an attention layer of this model (they are: " << layer_names(maps) << ")");
    if (std::find(chosen.begin(), chosen.end(), found) == chosen.end()) chosen.push_back(found);
  }
  const bool all = chosen.empty();
  if (all)
    for (std::size_t i = 0; i < maps.size(); ++i) chosen.push_back(i);
  // the query pictures: the layers named, else the last attention layer
  const std::vector<std::size_t> query_layers = all ? std::vector<std::size_t>{maps.size() - 1} : chosen;
  std::optional<std::pair<int, int>> query;
  if (!a.query.empty()) query = parse_query(a.query);
  for (std::size_t i : query_layers) {
    const AttentionMaps& m = maps[i];
    if (query)
      RELPOS_USAGE_CHECK(query->first < m.height && query->second < m.width,
                         "--query " << a.query << " is outside the " << m.height << "x" << m.width << " map of " << m.layer
                                    << " (rows 0.." << m.height - 1 << ", columns 0.." << m.width - 1 << ")");
    RELPOS_USAGE_CHECK(a.head < m.heads(), "--head " << a.head << ": " << m.layer << " has " << m.heads() << " heads (0.."
                                                     << m.heads() - 1 << ")");
  }

  std::error_code made, ec;  // why making it failed (a later test would overwrite the reason)
  fs::create_directories(a.out, made);
  RELPOS_CHECK(fs::is_directory(a.out, ec),
               a.out << ": cannot make the output folder ("
                     << (fs::exists(a.out, ec) ? "a file of that name is there" : made ? made.message() : "not a folder")
                     << ")");
  const cv::Mat view = network_view(image, model.preprocess());
  const std::string image_name = fs::path(a.image).filename().string();
  const Prediction top = model.classify(image, 1).front();
  const std::string title = model.network().config().name + " on " + image_name + " (predicted " + top.label + ", " +
                            short_number(100.0 * top.probability, 3) + "%)";
  nlohmann::json layers = nlohmann::json::array();
  std::vector<AttentionMaps> shown;
  std::vector<AttentionDistance> dists;
  std::vector<std::string> written;
  const auto out_file = [&](const std::string& name) {
    written.push_back(name);
    return (fs::path(a.out) / name).string();
  };
  for (std::size_t i : chosen) {
    const AttentionMaps& m = maps[i];
    const AttentionDistance dist = mean_attention_distance(m);
    nlohmann::json j = {{"name", m.layer},
                        {"kind", to_string(m.kind)},
                        {"map", {m.height, m.width}},
                        {"input_scale", {m.input_scale_y, m.input_scale_x}},
                        {"heads", m.heads()},
                        {"dqk", m.dqk()},
                        {"dv", m.dv()},
                        {"position_encoding", position_text(m)},
                        {"mean_distance",
                         {{"map_pixels", dist.map_pixels},
                          {"input_pixels", dist.input_pixels},
                          {"uniform_map_pixels", dist.uniform_map_pixels},
                          {"uniform_input_pixels", dist.uniform_input_pixels}}},
                        {"tables", tables_json(m)}};
    if (m.kind == AttentionKind::Local) j["kernel"] = m.sasa.kernel;
    else j["clip"] = m.bot.clip;
    nlohmann::json pictures = {{"tables", file_stem(m) + "_tables.png"}};
    draw_tables_picture(m, title, out_file(file_stem(m) + "_tables.png"));
    if (std::find(query_layers.begin(), query_layers.end(), i) != query_layers.end()) {
      const int y = query ? query->first : m.height / 2, x = query ? query->second : m.width / 2;
      const QueryTerms t = query_terms(m, y, x);
      std::vector<int> heads;
      for (int h = 0; h < m.heads(); ++h)
        if (a.head < 0 || a.head == h) heads.push_back(h);
      j["query"] = query_json(m, t, heads);
      pictures["attention"] = file_stem(m) + "_attention.png";
      pictures["terms"] = file_stem(m) + "_terms.png";
      draw_attention_picture(m, t, dist, view, heads, title, out_file(file_stem(m) + "_attention.png"));
      draw_terms_picture(m, t, heads, title, out_file(file_stem(m) + "_terms.png"));
    }
    j["pictures"] = pictures;
    layers.push_back(j);
    shown.push_back(m);
    dists.push_back(dist);
  }
  draw_distance_chart(shown, dists, title, out_file("distances.png"));

  // the distance table: on stdout and in distances.txt
  std::ostringstream table;
  table << "mean attention distance per head (map cells / input pixels; uniform: attention spread evenly)\n";
  table << std::left << std::setw(26) << "layer" << std::setw(8) << "map" << std::setw(6) << "head" << std::right
        << std::setw(10) << "cells" << std::setw(12) << "input px" << "\n";
  for (std::size_t i = 0; i < shown.size(); ++i) {
    const std::string map = std::to_string(shown[i].height) + "x" + std::to_string(shown[i].width);
    for (std::size_t h = 0; h <= dists[i].map_pixels.size(); ++h) {
      const bool uniform = h == dists[i].map_pixels.size();
      table << std::left << std::setw(26) << (h == 0 ? shown[i].layer : "") << std::setw(8) << (h == 0 ? map : "")
            << std::setw(6) << (uniform ? "unif." : std::to_string(h)) << std::right << std::fixed << std::setprecision(2)
            << std::setw(10) << (uniform ? dists[i].uniform_map_pixels : dists[i].map_pixels[h]) << std::setw(12)
            << (uniform ? dists[i].uniform_input_pixels : dists[i].input_pixels[h]) << "\n";
    }
  }
  std::ofstream(out_file("distances.txt")) << table.str();
  std::string image_hex;  // (a name that is not UTF-8: its bytes, as classify --json gives them)
  nlohmann::json summary = {{"model", model.network().config().name},
                            {"image", json_safe_name(a.image, &image_hex)},
                            {"input_size", {model.preprocess().height, model.preprocess().width}},
                            {"prediction", {{"label", top.label}, {"probability", top.probability}}},
                            {"layers", layers}};
  if (!image_hex.empty()) summary["image_bytes"] = image_hex;
  std::ofstream(out_file("explain.json")) << json_text(summary, 1) << "\n";
  RELPOS_CHECK(fs::exists(fs::path(a.out) / "explain.json"), "cannot write " << (fs::path(a.out) / "explain.json").string());
  std::cout << table.str() << "wrote";
  for (const auto& w : written) std::cout << " " << w;
  std::cout << " in " << a.out << "\n";
}

}  // namespace

void register_explain(CLI::App& app) {
  auto args = std::make_shared<ExplainArgs>();
  CLI::App* sub = app.add_subcommand(
      "explain", "Draw what the attention layers do with an image: attention maps, position terms, tables, distances");
  args->model.add(sub);
  sub->add_option("image", args->image, "The image to explain")->required();
  sub->add_option("--layer", args->layers,
                  "Attention layer(s) to explain, as relpos info names them (stages.2.1.self_attn, or stages.2.1); "
                  "default: every one for the tables and distances, the last one for the query pictures");
  sub->add_option("--query", args->query,
                  "The query cell Y,X of the layer's attention map (row, column from 0); default: the map's centre "
                  "(height/2, width/2)")
      ->type_name("Y,X");
  sub->add_option("--head", args->head, "Only this head in the query pictures (default: every head)")
      ->check(kNonNegative);
  sub->add_option("-o,--out", args->out, "Folder for the PNGs, distances.txt and explain.json (created)")->required();
  args->pre.add(sub);
  sub->callback([args] { run(*args); });
}

}  // namespace relpos::cli
