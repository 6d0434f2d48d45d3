// relpos explain, run as a user runs it: the pictures appear, and explain.json holds the numbers
// they draw, equal to what the API computes (probabilities summing to 1, the position term of
// query_terms, the mean distances, the table similarities); layer, query and head choices; errors.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>

#include "cli_run.hpp"
#include "relpos/attention_maps.hpp"
#include "relpos/model.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using namespace relpos;
using relpos::test::TempDir;

namespace {

test::CliRun run(const std::string& args) { return test::run_cli(args); }
std::string src(const std::string& p) { return test::source_dir() + "/" + p; }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// The sum of a grid's numbers (nulls are keys outside the map).
double grid_sum(const nlohmann::json& g) {
  double s = 0.0;
  for (const auto& row : g)
    for (const auto& v : row)
      if (!v.is_null()) s += v.get<double>();
  return s;
}

// A copy of tests/data/tiny_rgb_config.json with other attention options.
std::string tiny_config(const TempDir& dir, const std::string& name, const std::string& type, const nlohmann::json& attn) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(test::tiny_rgb_config()));
  j["stages"][1]["types"][1] = type;
  j.erase("self_attn");
  j[type] = attn;
  std::ofstream(dir.file(name)) << j.dump();
  return dir.file(name);
}

void check_png(const std::string& path, int min_width, int min_height) {
  INFO(path);
  const cv::Mat img = cv::imread(path, cv::IMREAD_UNCHANGED);
  REQUIRE(!img.empty());
  CHECK(img.type() == CV_8UC3);
  CHECK(img.cols >= min_width);
  CHECK(img.rows >= min_height);
}

}  // namespace

TEST_CASE("explain on the shipped BoTNet: the pictures, and the numbers behind them equal the API's") {
  TempDir dir;
  const std::string image = src("samples/bag_00018.png");
  const auto r = run("explain -m " + src("models/botnet-fmnist.json") + " " + image + " --out " + dir.path);
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("stages.2.1.self_attn") != std::string::npos);
  CHECK(r.out.find("unif.") != std::string::npos);  // the distance table
  // one BoTNet layer of 4 heads: attention panels (224 px each, 5 of them), 4 rows of term grids
  check_png(dir.file("stages.2.1_attention.png"), 5 * 224, 224);
  check_png(dir.file("stages.2.1_terms.png"), 3 * 7 * 40, 4 * 7 * 40);
  check_png(dir.file("stages.2.1_tables.png"), 2 * 13 * 20, 13 * 20);
  check_png(dir.file("distances.png"), 600, 400);
  CHECK(fs::exists(dir.file("distances.txt")));

  const nlohmann::json j = read_json(dir.file("explain.json"));
  CHECK(j["model"] == "botnet-fmnist");
  CHECK(j["prediction"]["label"] == "Bag");
  REQUIRE(j["layers"].size() == 1);
  const nlohmann::json& l = j["layers"][0];
  CHECK(l["name"] == "stages.2.1.self_attn");
  CHECK(l["kind"] == "global");
  CHECK(l["map"] == nlohmann::json::array({7, 7}));
  CHECK(l["input_scale"] == nlohmann::json::array({4.0, 4.0}));
  CHECK(l["position_encoding"] == "relative");
  CHECK(l["pictures"]["attention"] == "stages.2.1_attention.png");

  // the same numbers from the API
  const Model model = Model::load(src("models/botnet-fmnist.json"));
  const AttentionMaps m = model.attention(cv::imread(image, cv::IMREAD_UNCHANGED))[0];
  const QueryTerms t = query_terms(m, 3, 3);  // the default query: the centre
  const AttentionDistance d = mean_attention_distance(m);
  const nlohmann::json& q = l["query"];
  CHECK(q["y"] == 3);
  CHECK(q["x"] == 3);
  CHECK(q["input_box"] == nlohmann::json::array({12.0, 12.0, 16.0, 16.0}));
  REQUIRE(q["heads"].size() == 4);
  for (int h = 0; h < 4; ++h) {
    INFO("head " << h);
    const nlohmann::json& e = q["heads"][static_cast<std::size_t>(h)];
    CHECK(e["probs"].size() == 7);
    CHECK(e["probs"][0].size() == 7);
    CHECK(grid_sum(e["probs"]) == doctest::Approx(1.0).epsilon(1e-5));
    for (int j2 = 0; j2 < 49; ++j2) {
      const auto at = [&](const char* key) { return e[key][static_cast<std::size_t>(j2 / 7)][static_cast<std::size_t>(j2 % 7)].get<float>(); };
      CHECK(at("probs") == t.probs.data()[h * 49 + j2]);
      CHECK(at("position") == t.position.data()[h * 49 + j2]);
      CHECK(at("content") == t.content.data()[h * 49 + j2]);
    }
    CHECK(e["row_term"].size() == 13);
    CHECK(e["column_term"].size() == 13);
    CHECK(l["mean_distance"]["map_pixels"][static_cast<std::size_t>(h)].get<double>() == doctest::Approx(d.map_pixels[static_cast<std::size_t>(h)]));
    CHECK(l["mean_distance"]["input_pixels"][static_cast<std::size_t>(h)].get<double>() ==
          doctest::Approx(4 * d.map_pixels[static_cast<std::size_t>(h)]));
  }
  const nlohmann::json& tab = l["tables"];
  CHECK(tab["kind"] == "relative");
  CHECK(tab["clipped"] == false);
  CHECK(tab["row_offsets"].front() == -6);
  CHECK(tab["row_offsets"].back() == 6);
  REQUIRE(tab["row_similarity"].size() == 13);
  const Tensor sim = cosine_similarity(m.pos_h);
  for (int a = 0; a < 13; ++a) {
    CHECK(tab["row_similarity"][static_cast<std::size_t>(a)][static_cast<std::size_t>(a)].get<double>() == doctest::Approx(1.0));
    CHECK(tab["row_similarity"][static_cast<std::size_t>(a)][0].get<float>() == sim.data()[a * 13]);
  }
}

TEST_CASE("explain on a SASA model: the window of a corner query, one head, one layer") {
  TempDir dir;
  const std::string cfg = tiny_config(dir, "sasa.json", "sasa", {{"heads", 2}, {"kernel", 3}});
  const auto r = run("explain -m " + cfg + " " + src("tests/data/photos/horse.png") +
                     " --layer stages.1.1 --query 0,0 --head 1 --out " + dir.file("out"));
  INFO(r.out);
  REQUIRE(r.status == 0);
  for (const char* f : {"stages.1.1_attention.png", "stages.1.1_terms.png", "stages.1.1_tables.png", "distances.png"})
    CHECK(fs::exists(dir.file("out/" + std::string(f))));
  const nlohmann::json j = read_json(dir.file("out/explain.json"));
  REQUIRE(j["layers"].size() == 1);
  const nlohmann::json& l = j["layers"][0];
  CHECK(l["kind"] == "local");
  CHECK(l["kernel"] == 3);
  CHECK(l["map"] == nlohmann::json::array({6, 6}));
  const nlohmann::json& q = l["query"];
  CHECK(q["keys"] == "window");
  REQUIRE(q["heads"].size() == 1);
  CHECK(q["heads"][0]["head"] == 1);
  const nlohmann::json& p = q["heads"][0]["probs"];
  REQUIRE(p.size() == 3);
  // the window row above and the column left of the corner are outside the map
  for (int k = 0; k < 3; ++k) {
    CHECK(p[0][static_cast<std::size_t>(k)].is_null());
    CHECK(p[static_cast<std::size_t>(k)][0].is_null());
  }
  CHECK(grid_sum(p) == doctest::Approx(1.0).epsilon(1e-5));
  CHECK(l["tables"]["row_offsets"] == nlohmann::json::array({-1, 0, 1}));
}

TEST_CASE("explain says what a layer's position encoding is: clipped, absolute, none") {
  TempDir dir;
  const std::string image = src("tests/data/photos/coins.png");
  SUBCASE("clip") {
    const std::string cfg = tiny_config(dir, "clip.json", "self_attn", {{"heads", 2}, {"clip", 2}});
    REQUIRE(run("explain -m " + cfg + " " + image + " --out " + dir.file("o")).status == 0);
    const nlohmann::json l = read_json(dir.file("o/explain.json"))["layers"][0];
    CHECK(l["position_encoding"] == "relative, clip 2");
    CHECK(l["tables"]["clipped"] == true);
    CHECK(l["tables"]["row_offsets"] == nlohmann::json::array({-2, -1, 0, 1, 2}));
  }
  SUBCASE("absolute") {
    const std::string cfg = tiny_config(dir, "abs.json", "self_attn", {{"heads", 2}, {"pos", "absolute"}});
    REQUIRE(run("explain -m " + cfg + " " + image + " --out " + dir.file("o")).status == 0);
    const nlohmann::json l = read_json(dir.file("o/explain.json"))["layers"][0];
    CHECK(l["position_encoding"] == "absolute");
    CHECK(l["tables"]["kind"] == "absolute");
    CHECK(l["tables"]["position_similarity"].size() == 36);  // every pair of the 6x6 map's positions
    CHECK(!l["query"]["heads"][0].contains("row_term"));
  }
  SUBCASE("none") {
    const std::string cfg = tiny_config(dir, "none.json", "self_attn", {{"heads", 2}, {"pos", "none"}});
    REQUIRE(run("explain -m " + cfg + " " + image + " --out " + dir.file("o")).status == 0);
    const nlohmann::json l = read_json(dir.file("o/explain.json"))["layers"][0];
    CHECK(l["position_encoding"] == "none");
    CHECK(l["tables"]["kind"] == "none");
    CHECK(fs::exists(dir.file("o/stages.1.1_tables.png")));  // a picture that says so
    for (const auto& row : l["query"]["heads"][1]["position"])
      for (const auto& v : row) CHECK(v.get<double>() == 0.0);
  }
}

TEST_CASE("explain: bad layers, queries and heads are usage errors; a model without attention is an error") {
  TempDir dir;
  const std::string model = "-m " + src("models/botnet-fmnist.json") + " " + src("samples/bag_00018.png") + " --out " + dir.path;
  auto r = run("explain " + model + " --layer stages.9.9");
  CHECK(r.status == 2);
  CHECK(r.out.find("not an attention layer of this model (they are: stages.2.1.self_attn)") != std::string::npos);
  r = run("explain " + model + " --query 7,0");
  CHECK(r.status == 2);
  CHECK(r.out.find("outside the 7x7 map") != std::string::npos);
  r = run("explain " + model + " --query 3");
  CHECK(r.status == 2);
  CHECK(r.out.find("--query takes Y,X") != std::string::npos);
  r = run("explain " + model + " --head 4");
  CHECK(r.status == 2);
  CHECK(r.out.find("has 4 heads") != std::string::npos);
  r = run("explain -m " + src("models/fmnist_conv.json") + " " + src("samples/bag_00018.png") + " --out " + dir.path);
  CHECK(r.status == 1);
  CHECK(r.out.find("has no attention layers") != std::string::npos);
  r = run("explain " + model + " --layer stages.2.1");  // the block's name also names its attention layer
  CHECK(r.status == 0);
  r = run("explain -m " + src("models/botnet-fmnist.json") + " " + src("samples/bag_00018.png") + " --out ''");
  CHECK(r.status == 2);
  CHECK(r.out.find("--out needs a folder name") != std::string::npos);
  // a folder that cannot be made: the reason is the making's (it said "No such file or directory")
  std::ofstream(dir.file("plain")) << "x";
  r = run("explain " + model.substr(0, model.find(" --out ")) + " --out " + dir.file("plain") + "/sub");
  CHECK(r.status == 1);
  CHECK(r.out.find("cannot make the output folder (Not a directory)") != std::string::npos);
}
