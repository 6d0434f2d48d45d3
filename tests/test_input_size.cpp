// The position experiment's pieces: items placed on a canvas (training placement seeded per epoch
// and sample, evaluation placement fixed per sample), position tables resampled for another input
// size, and a model built at one input size running at another.
#include <doctest/doctest.h>

#include <cmath>
#include <opencv2/core.hpp>
#include <random>
#include <set>

#include "cli_run.hpp"
#include "model/position_resample.hpp"
#include "relpos/data.hpp"
#include "relpos/error.hpp"
#include "relpos/model.hpp"
#include "relpos/model_config.hpp"
#include "relpos/trainer.hpp"
#include "test_util.hpp"

using namespace relpos;

namespace {

// Items of 3 x 5 whose every pixel is non-zero and tells its sample and position apart.
class TinyItems : public Dataset {
 public:
  explicit TinyItems(std::size_t n) : n_(n) {}
  std::size_t size() const override { return n_; }
  int label(std::size_t i) const override { return static_cast<int>(i % 2); }
  cv::Mat image(std::size_t i) const override {
    cv::Mat m(3, 5, CV_8UC1);
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 5; ++x) m.at<std::uint8_t>(y, x) = static_cast<std::uint8_t>(1 + 15 * y + x + 3 * static_cast<int>(i));
    return m;
  }
  std::string name(std::size_t i) const override { return "item" + std::to_string(i); }
  const std::vector<std::string>& classes() const override { return classes_; }

 private:
  std::size_t n_;
  std::vector<std::string> classes_{"a", "b"};
};

// The item's pixels at (y, x) of the canvas and zero everywhere else.
void check_placed(const cv::Mat& canvas, const cv::Mat& item, int y0, int x0) {
  for (int y = 0; y < canvas.rows; ++y)
    for (int x = 0; x < canvas.cols; ++x) {
      const bool inside = y >= y0 && y < y0 + item.rows && x >= x0 && x < x0 + item.cols;
      const int want = inside ? item.at<std::uint8_t>(y - y0, x - x0) : 0;
      REQUIRE(static_cast<int>(canvas.at<std::uint8_t>(y, x)) == want);
    }
}

ModelConfig small_config(PosEncoding pos, int clip, int size) {
  ModelConfig c = ModelConfig::from_json(nlohmann::json::parse(R"({
    "name": "resize-test", "num_classes": 3, "in_chans": 1, "input_size": [12, 12],
    "stem": {"type": "conv", "chs": 8, "kernel": 3, "stride": 2, "pool": "none"},
    "stages": [{"types": ["bottle", "self_attn"], "chs": 16, "stride": 1, "br": 0.5},
               {"types": ["self_attn"], "chs": 32, "stride": 2, "br": 0.5}],
    "self_attn": {"heads": 2}})"));
  c.input_size = {size, size};
  for (auto& st : c.stages) st.self_attn.pos = pos, st.self_attn.clip = clip;
  return c;
}

Model small_model(PosEncoding pos, int clip, int size) {
  Preprocess pre = default_preprocess(small_config(pos, clip, size));
  pre.crop = false;
  return Model(Network(small_config(pos, clip, size), 3), {}, pre);
}

Tensor input(int size, unsigned seed) {
  std::mt19937 rng(seed);
  return test::random_tensor({2, 1, size, size}, rng);
}

}  // namespace

TEST_CASE("an item lands on the canvas where its seeded offset says, the rest is background") {
  const TinyItems items(1);
  const cv::Mat item = items.image(0);
  std::set<std::pair<int, int>> offsets;
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    const auto [y, x] = canvas_offset(3, 5, 9, seed);
    CHECK(y >= 0);
    CHECK(y <= 6);
    CHECK(x >= 0);
    CHECK(x <= 4);
    offsets.insert({y, x});
    check_placed(place_on_canvas(item, 9, seed), item, y, x);
  }
  CHECK(offsets.size() > 10);  // the position moves with the seed
  // an item as wide as the canvas moves only up and down; a larger one is an error
  for (std::uint64_t seed = 0; seed < 5; ++seed) {
    const auto [y, x] = canvas_offset(3, 5, 5, seed);
    CHECK(x == 0);
    check_placed(place_on_canvas(item, 5, seed), item, y, 0);
  }
  CHECK_THROWS_AS(place_on_canvas(item, 4, 0), Error);
  CHECK_THROWS_WITH_AS(CanvasDataset(items, 4), doctest::Contains("--canvas 4"), Error);
}

TEST_CASE("evaluation canvases are fixed per sample; training canvases move with the epoch") {
  const TinyItems items(6);
  const CanvasDataset a(items, 11), b(items, 11);
  std::set<std::uint64_t> seeds;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const cv::Mat one = a.image(i);
    CHECK(cv::norm(one, b.image(i), cv::NORM_INF) == 0);   // the same in every run
    CHECK(cv::norm(one, a.image(i), cv::NORM_INF) == 0);   // and every time it is read
    const auto [y, x] = canvas_offset(3, 5, 11, a.sample_seed(i));
    check_placed(one, items.image(i), y, x);
    seeds.insert(a.sample_seed(i));
    CHECK(a.label(i) == items.label(i));
  }
  CHECK(seeds.size() == items.size());

  Preprocess pre;
  pre.channels = ChannelOrder::Gray;
  pre.height = pre.width = 11;
  pre.crop = false;
  pre.mean = {0.0f, 0.0f, 0.0f};
  pre.std = {1.0f, 1.0f, 1.0f};
  DataLoader::Options o;
  o.batch = 6;
  o.shuffle = false;
  o.workers = 1;
  o.augment.canvas = 11;  // no other augmentation
  o.seed = 5;
  const auto epoch_pixels = [&](int epoch) {
    DataLoader loader(items, pre, o);
    loader.start_epoch(epoch);
    Batch batch;
    REQUIRE(loader.next(batch));
    CHECK(batch.images.shape() == Shape{6, 1, 11, 11});
    return batch.images.contiguous().to_vector();
  };
  const std::vector<float> e0 = epoch_pixels(0), again = epoch_pixels(0), e1 = epoch_pixels(1);
  CHECK(e0 == again);  // seeded: a resumed run sees the same canvases
  CHECK(e0 != e1);     // a new epoch, new positions
  // every image holds its item's 15 pixels (scaled to [0, 1]) and background elsewhere
  for (int i = 0; i < 6; ++i) {
    int lit = 0;
    for (int p = 0; p < 121; ++p) lit += e0[static_cast<std::size_t>(i * 121 + p)] != 0.0f;
    CHECK(lit == 15);
  }
}

TEST_CASE("position tables: resampling to the same size is the identity; a new size interpolates") {
  std::mt19937 rng(1);
  const Tensor abs = test::random_tensor({2, 12, 3}, rng);  // 2 heads, a 3 x 4 grid, d = 3
  CHECK(test::max_abs_diff(detail::resample_position_grid(abs, 3, 4, 3, 4), abs) == 0.0f);
  const Tensor rel = test::random_tensor({7, 4}, rng);
  CHECK(test::max_abs_diff(detail::resample_position_grid(rel, 7, 1, 7, 1), rel) == 0.0f);

  // 1D, 3 -> 5 rows of value r: new row n reads old row (n + 0.5) * 3/5 - 0.5, clamped to [0, 2]
  const Tensor ramp = Tensor::from_vector({3, 1}, {0.0f, 1.0f, 2.0f});
  const std::vector<float> up = detail::resample_position_grid(ramp, 3, 1, 5, 1).to_vector();
  const std::vector<float> want = {0.0f, 0.4f, 1.0f, 1.6f, 2.0f};
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(up[i] == doctest::Approx(want[i]).epsilon(1e-6));

  // 2D, a 2 x 2 grid of v = 10 y + x (and -v in the second channel) to 4 x 4: bilinear of a
  // linear function is that function at the source point; sources 0, 0.25, 0.75, 1 on each side
  const Tensor grid = Tensor::from_vector({4, 2}, {0, 0, 1, -1, 10, -10, 11, -11});
  const std::vector<float> g = detail::resample_position_grid(grid, 2, 2, 4, 4).to_vector();
  const float src[4] = {0.0f, 0.25f, 0.75f, 1.0f};
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) {
      CHECK(g[static_cast<std::size_t>((y * 4 + x) * 2)] == doctest::Approx(10 * src[y] + src[x]));
      CHECK(g[static_cast<std::size_t>((y * 4 + x) * 2 + 1)] == doctest::Approx(-10 * src[y] - src[x]));
    }
  // shrinking: 4 -> 2 rows of 0..3 read rows 0.5 and 2.5
  const Tensor four = Tensor::from_vector({4, 1}, {0.0f, 1.0f, 2.0f, 3.0f});
  const std::vector<float> down = detail::resample_position_grid(four, 4, 1, 2, 1).to_vector();
  CHECK(down[0] == doctest::Approx(0.5f));
  CHECK(down[1] == doctest::Approx(2.5f));
  CHECK_THROWS_AS(detail::resample_position_grid(rel, 3, 3, 5, 5), Error);  // 7 rows are no 3 x 3 grid
}

TEST_CASE("a model built at one input size runs at another") {
  for (const auto& setup : {std::pair{PosEncoding::Relative, 0}, std::pair{PosEncoding::Absolute, 0},
                            std::pair{PosEncoding::Relative, 2}, std::pair{PosEncoding::None, 0}}) {
    const PosEncoding pos = setup.first;  // not a structured binding: CAPTURE takes them by reference
    const int clip = setup.second;
    CAPTURE(to_string(pos));
    CAPTURE(clip);
    const Model m = small_model(pos, clip, 12);
    // the same size: the same model
    std::string note = "unset";
    const Model same = m.at_input_size(12, 12, &note);
    CHECK(note.empty());
    CHECK(test::weights_of(same) == test::weights_of(m));
    CHECK(test::max_abs_diff(same.logits(input(12, 1)), m.logits(input(12, 1))) == 0.0f);
    // 20 x 20: maps of 10 and 5 instead of 6 and 3
    const Model big = m.at_input_size(20, 20, &note);
    CHECK(big.preprocess().height == 20);
    CHECK(big.network().config().input_size[1] == 20);
    const Tensor out = big.logits(input(20, 2));
    CHECK(out.shape() == Shape{2, 3});
    for (float v : out.to_vector()) CHECK(std::isfinite(v));
    const bool fixed = m.network().config().fixed_input_size();
    CHECK(note.empty() == !fixed);
    if (fixed) CHECK_THROWS_WITH_AS(m.logits(input(20, 2)), doctest::Contains("12x12"), Error);
    if (pos == PosEncoding::Relative && clip == 0) {
      // 2*6-1 = 11 offsets -> 19: the ends and the middle (offset 0) keep their rows
      const Tensor& old_t = *m.network().find("stages.0.1.self_attn.pos_embed.height_rel")->value;
      const Tensor& new_t = *big.network().find("stages.0.1.self_attn.pos_embed.height_rel")->value;
      CHECK(new_t.shape() == Shape{19, old_t.dim(1)});
      const std::vector<float> o = old_t.contiguous().to_vector(), n = new_t.contiguous().to_vector();
      const std::size_t d = static_cast<std::size_t>(old_t.dim(1));
      for (std::size_t c = 0; c < d; ++c) {
        CHECK(n[c] == doctest::Approx(o[c]));
        CHECK(n[9 * d + c] == doctest::Approx(o[5 * d + c]));
        CHECK(n[18 * d + c] == doctest::Approx(o[10 * d + c]));
      }
      CHECK(note.find("height_rel [11, 8] -> [19, 8]") != std::string::npos);
    }
    if (pos == PosEncoding::Absolute)
      CHECK(big.network().find("stages.1.0.self_attn.pos_embed.abs")->value->dim(0) == 100);  // 10 x 10 before the pool
    // saved at one size, loaded and run at another
    test::TempDir dir;
    m.save_json(dir.file("m.json"));
    const Model back = Model::load(dir.file("m.json")).at_input_size(20, 20);
    CHECK(test::max_abs_diff(back.logits(input(20, 3)), big.logits(input(20, 3))) == 0.0f);
  }
}

TEST_CASE("an input size that the strides do not divide: the tables fit the maps the convolutions make") {
  // 23x23: the stem's stride-2 convolution makes 12x12 (an odd side rounds up); the tables were
  // sized for 11x11 (23 / 2 rounded down), so the model was built but could never run
  for (const PosEncoding pos : {PosEncoding::Relative, PosEncoding::Absolute}) {
    CAPTURE(to_string(pos));
    const Network net(small_config(pos, 0, 23), 1);
    if (pos == PosEncoding::Relative)
      CHECK(net.find("stages.0.1.self_attn.pos_embed.height_rel")->value->dim(0) == 23);  // 2 * 12 - 1
    else
      CHECK(net.find("stages.1.0.self_attn.pos_embed.abs")->value->dim(0) == 144);
    const Model m(Network(small_config(pos, 0, 23), 1), {}, default_preprocess(small_config(pos, 0, 23)));
    const Tensor out = m.logits(input(23, 4));
    CHECK(out.shape() == Shape{2, 3});
    for (float v : out.to_vector()) CHECK(std::isfinite(v));
    // resampled from 12x12 to 23x23
    const Tensor resized = small_model(pos, 0, 12).at_input_size(23, 23).logits(input(23, 4));
    for (float v : resized.to_vector()) CHECK(std::isfinite(v));
  }
  // the shipped Fashion-MNIST BoTNet (28x28) at 30x30, through the API
  const Model fm = Model::load(test::source_dir() + "/models/botnet-fmnist.json").at_input_size(30, 30);
  CHECK(fm.classify(cv::Mat(30, 30, CV_8UC1, cv::Scalar(128)), 1).size() == 1);
}

TEST_CASE("a stride-2 attention block on an odd map is an error naming the input size and the block") {
  // 10x10 input: the stem's stride 2 leaves 5x5, which the attention's 2x2 pool takes to 2x2 and the
  // stride-2 shortcut to 3x3 (timm's BoTNet cannot add them either)
  const std::string want = "resize-test: at 10x10 input, stages.1.0 gets a 5x5 map, which its body takes to 2x2 and "
                           "its shortcut to 3x3: a stride-2 attention block needs even sides";
  CHECK_THROWS_WITH_AS(Network(small_config(PosEncoding::Relative, 2, 10), 1), want.c_str(), Error);
  // a size-agnostic model built at 12x12 is told so at the odd size, before any op runs
  const Model m = small_model(PosEncoding::Relative, 2, 12);
  CHECK_THROWS_WITH_AS(m.logits(input(10, 1)), want.c_str(), Error);
  CHECK_THROWS_WITH_AS(m.at_input_size(10, 10), want.c_str(), Error);
  CHECK(m.logits(input(20, 1)).shape() == Shape{2, 3});  // even sides run
}

TEST_CASE("command line: --canvas and --input-size are checked") {
  const std::string config = std::string(RELPOS_SOURCE_DIR) + "/models/exp_rel.json";
  test::TempDir dir;
  const auto r = test::run_cli("train -c " + config + " --canvas 30 --epochs 1 --threads 1 -q -o " + dir.file("run"));
  CHECK(r.status == 1);
  CHECK(r.out.find("--canvas 30") != std::string::npos);
  const auto e = test::run_cli("eval -m " + config + " --input-size 0x5 -q");
  CHECK(e.status == 2);
  CHECK(e.out.find("--input-size") != std::string::npos);
}

TEST_CASE("training on canvases: the options go into the checkpoint, and a resumed run is the same run") {
  test::TempDir dir;
  const std::string data = dir.file("data");
  test::make_pattern_dataset(data, 8, 2);  // 12x12 images, 3 classes
  const auto canvas_model = [] {
    ModelConfig c = ModelConfig::load(test::tiny_rgb_config());
    c.input_size = {16, 16};
    Preprocess pre = default_preprocess(c);
    pre.crop = false;
    return Model(Network(c, 4), {}, pre);
  };
  TrainOptions o;
  o.data = data;
  o.epochs = 2;
  o.batch = 8;
  o.augment.canvas = 16;
  o.train_images = 16;  // of 24
  o.seed = 2;
  o.checkpoint_minutes = 0;
  o.out = dir.file("full");
  Model full = canvas_model();
  const TrainResult r = train(full, o);
  CHECK(r.images == doctest::Approx(32));  // 16 images, 2 epochs
  CHECK(r.history.back().test_acc >= 0.0);  // scored on canvases of the test set
  const TrainOptions back = TrainOptions::from_json(o.to_json());
  CHECK(back.augment.canvas == 16);
  CHECK(back.train_images == 16);
  // stopped after 3 steps, resumed: the same canvases, so the same weights
  o.out = dir.file("part");
  o.max_steps = 3;
  Model part = canvas_model();
  train(part, o);
  Model resumed = canvas_model();
  TrainOptions how;
  train(resumed, how, dir.file("part") + "/checkpoint.safetensors");
  CHECK(test::weights_of(resumed) == test::weights_of(full));
  // a canvas the model's input does not match is an error naming --canvas
  o.out = dir.file("bad");
  o.max_steps = 0;
  o.augment.canvas = 20;
  Model bad = canvas_model();
  CHECK_THROWS_WITH_AS(train(bad, o), doctest::Contains("--canvas 20"), Error);
}
