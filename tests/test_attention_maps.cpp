// relpos/attention_maps.hpp: the probabilities Network::infer_attention records are the ones the
// network computes (same logits, rows summing to 1, the op's output recomputed from them and the
// values), a query's content and position terms give back those probabilities and the position
// term is the op's rel_pos_logits, and the mean attention distance and the table similarities
// have the values worked out by hand.
#include <opencv2/imgcodecs.hpp>

#include <cmath>
#include <random>

#include "relpos/attention_maps.hpp"
#include "relpos/error.hpp"
#include "relpos/model.hpp"
#include "test_util.hpp"

using namespace relpos;

namespace {

// A 12x12 RGB network with one attention block at 6x6, then one that attends at 6x6 and pools to 3x3.
ModelConfig config_with(const nlohmann::json& attn, const std::string& type) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "name": "attention-maps-test", "num_classes": 3, "in_chans": 3, "input_size": [12, 12], "act": "relu",
    "stem": {"type": "conv", "chs": 8, "kernel": 3, "stride": 1, "pool": "none"},
    "stages": [
      {"type": "bottle", "depth": 1, "chs": 16, "stride": 1, "br": 0.5},
      {"types": ["bottle", "TYPE"], "chs": 32, "stride": 2, "br": 0.5},
      {"type": "TYPE", "depth": 1, "chs": 32, "stride": 2, "br": 0.5}
    ]})");
  j["stages"][1]["types"][1] = type;
  j["stages"][2]["type"] = type;
  j[type] = attn;
  return ModelConfig::from_json(j);
}

struct Case {
  const char* what;
  nlohmann::json attn;
  const char* type;
};
std::vector<Case> cases() {
  return {{"relative", {{"heads", 2}, {"pos", "relative"}}, "self_attn"},
          {"relative, clip 2", {{"heads", 2}, {"pos", "relative"}, {"clip", 2}}, "self_attn"},
          {"relative, per-head tables, scale_pos_embed",
           {{"heads", 2}, {"pos", "relative"}, {"per_head", true}, {"scale_pos_embed", true}}, "self_attn"},
          {"absolute", {{"heads", 2}, {"pos", "absolute"}}, "self_attn"},
          {"no positions", {{"heads", 2}, {"pos", "none"}}, "self_attn"},
          {"SASA k=3", {{"heads", 2}, {"kernel", 3}}, "sasa"},
          {"SASA k=5", {{"heads", 4}, {"kernel", 5}}, "sasa"}};
}

// A network whose position tables and attention are far from uniform: random weights, with the
// position tables scaled up so that the position term matters.
Network make_network(const ModelConfig& c) {
  Network net(c, 5);
  std::mt19937 rng(9);
  for (const ParamRef& p : net.params())
    if (p.name.find("pos_embed") != std::string::npos || p.name.find("r_row") != std::string::npos ||
        p.name.find("r_col") != std::string::npos)
      p.value->copy_from(test::random_tensor(p.value->shape(), rng, 1.5f));
  net.prepare_inference();
  return net;
}

float at(const Tensor& t, std::int64_t i) { return t.data()[i]; }

}  // namespace

TEST_CASE("infer_attention records each attention layer on the inference path") {
  std::mt19937 rng(3);
  const Tensor x = test::random_tensor({2, 3, 12, 12}, rng).channels_last();
  for (const Case& cs : cases()) {
    INFO(cs.what);
    const Network net = make_network(config_with(cs.attn, cs.type));
    Tensor logits;
    const std::vector<AttentionMaps> maps = net.infer_attention(x, &logits);
    // the same logits as plain inference: the recording does not change the computation (SASA's
    // inference folds the post-attention batch norm into the values, which moves the last bits)
    if (std::string(cs.type) == "sasa") {
      const auto a = logits.to_vector(), b = net.infer(x).to_vector();
      REQUIRE(a.size() == b.size());
      for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5));
    } else {
      CHECK(logits.to_vector() == net.infer(x).to_vector());
    }
    REQUIRE(maps.size() == 2);
    CHECK(maps[0].layer == "stages.1.1.self_attn");
    CHECK(maps[1].layer == "stages.2.0.self_attn");
    std::vector<std::string> rows;  // the names relpos info prints for attention layers
    for (const LayerRow& r : net.summarize())
      if (r.kind.rfind("bot_attn", 0) == 0 || r.kind.rfind("sasa", 0) == 0) rows.push_back(r.name);
    CHECK(rows == std::vector<std::string>{maps[0].layer, maps[1].layer});

    for (const AttentionMaps& m : maps) {
      INFO(m.layer);
      CHECK(m.kind == (std::string(cs.type) == "sasa" ? AttentionKind::Local : AttentionKind::Global));
      CHECK(m.height == 6);  // the second attends at 6x6 before its pool
      CHECK(m.width == 6);
      CHECK(m.input_scale_y == 2.0);
      CHECK(m.input_scale_x == 2.0);
      const int heads = m.heads(), keys = m.keys(), n = m.queries(), dv = m.dv();
      CHECK(m.probs.shape() == Shape({2, heads, n, keys}));
      CHECK(m.qkv.shape() == Shape({2, 2 * heads * m.dqk() + heads * dv, 6, 6}));
      CHECK(m.out.shape() == Shape({2, heads * dv, 6, 6}));
      // each query's probabilities sum to 1, and are 0 exactly on keys outside the map
      float worst_sum = 0.0f;
      bool outside_zero = true;
      for (int b = 0; b < 2; ++b)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < n; ++i) {
            const float* p = m.probs.data() + ((static_cast<std::int64_t>(b) * heads + h) * n + i) * keys;
            float s = 0.0f;
            for (int j = 0; j < keys; ++j) {
              int ky = 0, kx = 0;
              if (m.key_cell(i / 6, i % 6, j, ky, kx)) s += p[j];
              else outside_zero = outside_zero && p[j] == 0.0f;
            }
            worst_sum = std::max(worst_sum, std::abs(s - 1.0f));
          }
      CHECK(worst_sum < 1e-5f);
      CHECK(outside_zero);
      // the op's output is sum_j p_ij v_j
      const std::int64_t vbase = 2LL * heads * m.dqk();
      float worst = 0.0f, largest = 0.0f;
      for (int b = 0; b < 2; ++b)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < n; ++i)
            for (int c = 0; c < dv; ++c) {
              double o = 0.0;
              for (int j = 0; j < keys; ++j) {
                int ky = 0, kx = 0;
                if (!m.key_cell(i / 6, i % 6, j, ky, kx)) continue;
                o += at(m.probs, ((static_cast<std::int64_t>(b) * heads + h) * n + i) * keys + j) *
                     at(m.qkv, ((b * m.qkv.dim(1) + vbase + h * dv + c) * n) + ky * 6 + kx);
              }
              const float got = at(m.out, (b * m.out.dim(1) + h * dv + c) * n + i);
              worst = std::max(worst, std::abs(got - static_cast<float>(o)));
              largest = std::max(largest, std::abs(got));
            }
      CHECK(worst <= 1e-5f * std::max(1.0f, largest));
    }
  }
}

TEST_CASE("query_terms: softmax(content + position) is the layer's probabilities; the position term is the op's") {
  std::mt19937 rng(4);
  const Tensor x = test::random_tensor({2, 3, 12, 12}, rng).channels_last();
  for (const Case& cs : cases()) {
    INFO(cs.what);
    const Network net = make_network(config_with(cs.attn, cs.type));
    const AttentionMaps m = net.infer_attention(x)[0];
    const int heads = m.heads(), keys = m.keys(), d = m.dqk(), n = m.queries();
    const bool global = m.kind == AttentionKind::Global;
    const float s = 1.0f / std::sqrt(static_cast<float>(d));
    const float alpha = global && m.bot.scale_pos_embed ? s : 1.0f;
    // the position term of every query from the op itself (Global relative), per head
    std::vector<Tensor> op_rel(static_cast<std::size_t>(heads));
    if (global && m.bot.pos == PosEncoding::Relative)
      for (int h = 0; h < heads; ++h) {
        Tensor q({1, n, d});
        for (int i = 0; i < n; ++i)
          for (int c = 0; c < d; ++c) q.data()[i * d + c] = at(m.qkv, (1 * m.qkv.dim(1) + h * d + c) * n + i);  // image 1
        const Tensor th = m.bot.per_head ? Tensor::from_vector({m.pos_h.dim(1), d}, std::vector<float>(
                                               m.pos_h.data() + h * m.pos_h.dim(1) * d, m.pos_h.data() + (h + 1) * m.pos_h.dim(1) * d))
                                         : m.pos_h;
        const Tensor tw = m.bot.per_head ? Tensor::from_vector({m.pos_w.dim(1), d}, std::vector<float>(
                                               m.pos_w.data() + h * m.pos_w.dim(1) * d, m.pos_w.data() + (h + 1) * m.pos_w.dim(1) * d))
                                         : m.pos_w;
        op_rel[static_cast<std::size_t>(h)] = ops::rel_pos_logits(q, th, tw, 6, 6, m.bot.clip);
      }
    for (const auto& query : std::vector<std::pair<int, int>>{{0, 0}, {2, 3}, {5, 1}, {5, 5}}) {
      const int y = query.first, xq = query.second;  // not a structured binding: INFO captures them
      INFO("query " << y << "," << xq);
      const QueryTerms t = query_terms(m, y, xq, 1);
      CHECK(t.content.shape() == Shape({heads, keys}));
      CHECK(t.position.shape() == Shape({heads, keys}));
      float worst_p = 0.0f, worst_rel = 0.0f;
      for (int h = 0; h < heads; ++h) {
        const float* c = t.content.data() + h * keys;
        const float* p = t.position.data() + h * keys;
        double mx = -1e30, sum = 0.0;
        for (int j = 0; j < keys; ++j)
          if (t.inside[static_cast<std::size_t>(j)]) mx = std::max(mx, static_cast<double>(c[j] + p[j]));
        for (int j = 0; j < keys; ++j)
          if (t.inside[static_cast<std::size_t>(j)]) sum += std::exp(c[j] + p[j] - mx);
        for (int j = 0; j < keys; ++j) {
          const double want = t.inside[static_cast<std::size_t>(j)] ? std::exp(c[j] + p[j] - mx) / sum : 0.0;
          worst_p = std::max(worst_p, std::abs(at(t.probs, h * keys + j) - static_cast<float>(want)));
        }
        if (op_rel[static_cast<std::size_t>(h)].defined())
          for (int j = 0; j < keys; ++j)
            worst_rel = std::max(worst_rel, std::abs(p[j] - alpha * at(op_rel[static_cast<std::size_t>(h)],
                                                                       (y * 6 + xq) * n + j)));
        // the probabilities are the recorded ones of image 1
        CHECK(at(t.probs, h * keys) == at(m.probs, ((1LL * heads + h) * n + y * 6 + xq) * keys));
        if (!global || m.bot.pos == PosEncoding::Relative) {
          // the position term is the sum of a row term and a column term
          REQUIRE(t.row_term.defined());
          const int rh = static_cast<int>(t.row_term.dim(1)), rw = static_cast<int>(t.col_term.dim(1));
          const int kh = (rh - 1) / 2, kw = (rw - 1) / 2;
          for (int j = 0; j < keys; ++j) {
            int ky = 0, kx = 0;
            if (!m.key_cell(y, xq, j, ky, kx)) continue;
            const float want = at(t.row_term, h * rh + std::clamp(ky - y, -kh, kh) + kh) +
                               at(t.col_term, h * rw + std::clamp(kx - xq, -kw, kw) + kw);
            CHECK(p[j] == want);
          }
        } else {
          CHECK(!t.row_term.defined());
          if (m.bot.pos == PosEncoding::None)
            for (int j = 0; j < keys; ++j) CHECK(p[j] == 0.0f);
        }
      }
      CHECK(worst_p < 2e-6f);
      CHECK(worst_rel < 1e-4f);
    }
  }
}

TEST_CASE("query_terms: a SASA position term is q[:d/2].r_row[dy] + q[d/2:].r_col[dx]") {
  std::mt19937 rng(6);
  const Tensor x = test::random_tensor({1, 3, 12, 12}, rng).channels_last();
  const Network net = make_network(config_with({{"heads", 2}, {"kernel", 3}}, "sasa"));
  const AttentionMaps m = net.infer_attention(x)[1];
  const int d = m.dqk(), half = d / 2, n = m.queries();
  const QueryTerms t = query_terms(m, 0, 4);
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 9; ++j) {
      const int dy = j / 3 - 1, dx = j % 3 - 1;
      if (dy < 0) {
        CHECK(t.inside[static_cast<std::size_t>(j)] == 0);  // the row above the map
        continue;
      }
      double want = 0.0;
      for (int c = 0; c < half; ++c) {
        const float q0 = at(m.qkv, (h * d + c) * n + 4), q1 = at(m.qkv, (h * d + half + c) * n + 4);
        want += q0 * at(m.pos_h, (dy + 1) * half + c) + q1 * at(m.pos_w, (dx + 1) * half + c);
      }
      CHECK(at(t.position, h * 9 + j) == doctest::Approx(want).epsilon(1e-5));
    }
  CHECK_THROWS_WITH_AS(query_terms(m, 6, 0), doctest::Contains("query (6, 0) is outside the 6x6 map"), relpos::Error);
}

TEST_CASE("mean_attention_distance has the values worked out by hand") {
  SUBCASE("global: every query attends to its right-hand neighbour (or its left one at the border)") {
    AttentionMaps m;
    m.kind = AttentionKind::Global;
    m.bot.heads = 2;
    m.height = 2, m.width = 3;
    m.input_scale_y = 4, m.input_scale_x = 2;
    m.qkv = Tensor::zeros({1, 1, 2, 3});
    m.probs = Tensor::zeros({1, 2, 6, 6});
    for (int i = 0; i < 6; ++i) {
      const int y = i / 3, x = i % 3;
      m.probs.data()[i * 6 + y * 3 + (x < 2 ? x + 1 : x - 1)] = 1.0f;  // head 0
      m.probs.data()[36 + i * 6 + i] = 1.0f;                           // head 1: itself
    }
    const AttentionDistance d = mean_attention_distance(m);
    CHECK(d.map_pixels == std::vector<double>{1.0, 0.0});
    CHECK(d.input_pixels == std::vector<double>{2.0, 0.0});
    // uniform over a 2x3 grid: from a corner (0+1+2+1+sqrt2+sqrt5)/6, from a middle cell (1+0+1+sqrt2+1+sqrt2)/6
    const double corner = (4.0 + std::sqrt(2.0) + std::sqrt(5.0)) / 6, middle = (3.0 + 2 * std::sqrt(2.0)) / 6;
    CHECK(d.uniform_map_pixels == doctest::Approx((4 * corner + 2 * middle) / 6));
  }
  SUBCASE("local: a 3x3 window on a 3x3 map, attention on the cell below (or above at the border)") {
    AttentionMaps m;
    m.kind = AttentionKind::Local;
    m.sasa.heads = 1;
    m.sasa.kernel = 3;
    m.height = 3, m.width = 3;
    m.input_scale_y = m.input_scale_x = 8;
    m.qkv = Tensor::zeros({1, 1, 3, 3});
    m.probs = Tensor::zeros({1, 1, 9, 9});
    for (int i = 0; i < 9; ++i) m.probs.data()[i * 9 + (i / 3 < 2 ? 7 : 1)] = 1.0f;  // window (dy, dx) = (+1, 0) or (-1, 0)
    const AttentionDistance d = mean_attention_distance(m);
    CHECK(d.map_pixels[0] == doctest::Approx(1.0));
    CHECK(d.input_pixels[0] == doctest::Approx(8.0));
    // uniform over the keys inside the window: corners 4 keys, edges 6, the centre 9
    const double corner = (2.0 + std::sqrt(2.0)) / 4, edge = (3.0 + 2 * std::sqrt(2.0)) / 6, centre = (4.0 + 4 * std::sqrt(2.0)) / 9;
    CHECK(d.uniform_map_pixels == doctest::Approx((4 * corner + 4 * edge + centre) / 9));
  }
}

TEST_CASE("cosine_similarity of table rows, and the offsets table rows stand for") {
  const Tensor t = Tensor::from_vector({4, 2}, {1, 0, 0, 2, 3, 3, 0, 0});
  const Tensor c = cosine_similarity(t);
  REQUIRE(c.shape() == Shape({4, 4}));
  const std::vector<float> want{1, 0, std::sqrt(0.5f), 0, 0, 1, std::sqrt(0.5f), 0, std::sqrt(0.5f), std::sqrt(0.5f), 1, 0,
                                0, 0, 0, 0};
  for (int i = 0; i < 16; ++i) CHECK(at(c, i) == doctest::Approx(want[static_cast<std::size_t>(i)]));
  const Tensor stacked = cosine_similarity(Tensor::from_vector({2, 2, 2}, {1, 0, 1, 1, 0, 1, 0, -1}));
  CHECK(stacked.shape() == Shape({2, 2, 2}));
  CHECK(at(stacked, 1) == doctest::Approx(std::sqrt(0.5f)));
  CHECK(at(stacked, 5) == doctest::Approx(-1.0f));
  CHECK(table_offset(0, 13) == -6);
  CHECK(table_offset(6, 13) == 0);
  CHECK(table_offset(4, 5) == 2);
}

TEST_CASE("Model::attention on the shipped model: its 7x7 BoTNet layer") {
  const Model model = Model::load(test::source_dir() + "/models/botnet-fmnist.json");
  const cv::Mat img = cv::imread(test::source_dir() + "/samples/bag_00018.png", cv::IMREAD_UNCHANGED);
  REQUIRE(!img.empty());
  const std::vector<AttentionMaps> maps = model.attention(img);
  REQUIRE(maps.size() == 1);
  const AttentionMaps& m = maps[0];
  CHECK(m.layer == "stages.2.1.self_attn");
  CHECK(m.kind == AttentionKind::Global);
  CHECK(m.height == 7);
  CHECK(m.width == 7);
  CHECK(m.input_scale_y == 4.0);
  CHECK(m.heads() == 4);
  CHECK(m.pos_h.shape() == Shape({13, m.dqk()}));
  CHECK(m.pos_w.shape() == Shape({13, m.dqk()}));
  // the network's logits with the recording equal plain inference of the same (single-view) batch
  Tensor logits;
  model.network().infer_attention(make_batch({img}, model.preprocess()), &logits);
  CHECK(logits.to_vector() == model.network().infer(make_batch({img}, model.preprocess())).to_vector());
  const AttentionDistance d = mean_attention_distance(m);
  for (double v : d.map_pixels) {
    CHECK(v >= 0.0);
    CHECK(v <= 6 * std::sqrt(2.0));
  }
  CHECK(model.attention(img)[0].probs.to_vector() == m.probs.to_vector());  // deterministic
  const Model conv = Model::create(test::source_dir() + "/models/fmnist_conv.json");
  CHECK(conv.attention(img).empty());
}

TEST_CASE("SASA inference folds the post-attention batch norm into the values, as the unfolded layers compute") {
  // infer() runs SASA blocks with post_attn's batch norm folded into the value projection and its
  // ReLU applied by the op (after the pool at stride 2); infer_attention() runs the layers as
  // trained. With batch norms far from identity (running statistics, scale and shift), both give
  // the same logits; a second prepare_inference() after the norm changes follows the change.
  std::mt19937 rng(21);
  Network net = make_network(config_with({{"heads", 2}, {"kernel", 3}}, "sasa"));
  const auto randomize_norms = [&](float shift) {
    int touched = 0;
    for (const ParamRef& p : net.params()) {
      if (p.name.find("post_attn") == std::string::npos) continue;
      const std::int64_t n = p.value->numel();
      std::vector<float> v(static_cast<std::size_t>(n));
      for (float& f : v) {
        const float u = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
        if (p.name.find("running_var") != std::string::npos) f = 0.2f + 2.0f * u;
        else if (p.name.find("weight") != std::string::npos) f = (u - 0.3f) * 2.0f;  // some negative scales
        else f = shift + (u - 0.5f);
      }
      p.value->copy_from(Tensor::from_vector(p.value->shape(), v));
      ++touched;
    }
    return touched;
  };
  CHECK(randomize_norms(0.5f) == 8);  // weight, bias, running mean and variance of two blocks
  // every other batch norm's scale away from timm's zero init of the blocks' last norm, so that the
  // attention branches reach the logits
  for (const ParamRef& p : net.params())
    if (p.name.find("bn.weight") != std::string::npos || p.name.find("head") != std::string::npos)
      p.value->copy_from(test::random_tensor(p.value->shape(), rng, 1.0f));
  net.prepare_inference();
  const Tensor x = test::random_tensor({2, 3, 12, 12}, rng).channels_last();
  const auto check_same = [&] {
    Tensor unfolded;
    (void)net.infer_attention(x, &unfolded);
    const auto a = net.infer(x).to_vector(), b = unfolded.to_vector();
    REQUIRE(a.size() == b.size());
    double worst = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    }
    CHECK(scale > 0.1);
    CHECK(worst <= 1e-5 * scale);
  };
  check_same();
  randomize_norms(-1.0f);
  net.prepare_inference();
  check_same();
}
