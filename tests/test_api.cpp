// The C++ API a vision pipeline uses: OpenCV images in, predictions or feature maps out, one
// loaded model shared by many threads.
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <omp.h>

#include <random>
#include <limits>
#include <cmath>
#include <thread>

#include "relpos/error.hpp"
#include "core/ops_internal.hpp"
#include "relpos/model.hpp"
#include "relpos/ops.hpp"
#include "test_util.hpp"

using namespace relpos;

namespace {
Model tiny() { return Model::create(test::source_dir() + "/models/tiny_botnet_96x64.json", 11); }
cv::Mat sample(const std::string& name) {
  cv::Mat m = cv::imread(test::source_dir() + "/samples/" + name, cv::IMREAD_UNCHANGED);
  REQUIRE(!m.empty());
  return m;
}
}  // namespace

TEST_CASE("classify(cv::Mat) agrees with the network on the preprocessed batch") {
  Model m = tiny();
  const cv::Mat img = sample("coat_00006.png");
  const auto preds = m.classify(img, 10);
  REQUIRE(preds.size() == 10);
  const Tensor logits = m.network().infer(make_batch({img}, m.preprocess()));
  const auto v = logits.to_vector();
  float psum = 0.0f;
  for (const auto& p : preds) {
    CHECK(p.logit == v[static_cast<std::size_t>(p.index)]);
    psum += p.probability;
  }
  CHECK(psum == doctest::Approx(1.0f).epsilon(1e-5));
  for (std::size_t i = 1; i < preds.size(); ++i) CHECK(preds[i - 1].logit >= preds[i].logit);
}

TEST_CASE("tta hflip averages the logits of the image and its mirror; it round-trips and is checked") {
  Model m = tiny();
  Preprocess p = m.preprocess();
  p.crop = false;  // an image of the input size goes in unresized, so mirroring commutes with it
  m.set_preprocess(p);
  cv::Mat img, mirror;
  cv::resize(sample("sandal_00011.png"), img, cv::Size(p.width, p.height));
  cv::flip(img, mirror, 1);
  const auto plain = m.logits(make_batch({img}, m.preprocess())).to_vector();
  const auto flipped = m.logits(make_batch({mirror}, m.preprocess())).to_vector();
  p.tta = Tta::HFlip;
  m.set_preprocess(p);
  // channels-last and contiguous batches of two images give the same means
  const Tensor batch = make_batch({img, mirror}, m.preprocess());
  for (const Tensor& b : {batch, batch.contiguous()}) {
    const auto both = m.logits(b).to_vector();
    for (std::size_t i = 0; i < plain.size(); ++i) {
      const float want = 0.5f * (plain[i] + flipped[i]);
      CHECK(both[i] == doctest::Approx(want).epsilon(1e-5));
      CHECK(both[plain.size() + i] == doctest::Approx(want).epsilon(1e-5));
    }
  }
  CHECK(m.classify(img, 1)[0].index == m.classify(mirror, 1)[0].index);
  CHECK(Preprocess::from_json(m.preprocess().to_json()).tta == Tta::HFlip);
  CHECK(m.preprocess().describe().find("mirror") != std::string::npos);
  nlohmann::json bad = m.preprocess().to_json();
  bad["tta"] = "rotate";
  CHECK_THROWS_WITH_AS(Preprocess::from_json(bad), doctest::Contains("key 'tta' is \"rotate\" (expected none or hflip)"), Error);
}

TEST_CASE("features() gives the stem map and every stage's map, like timm's features_only") {
  Model m = tiny();
  const auto maps = m.features(sample("bag_00018.png"));
  REQUIRE(maps.size() == 5);
  const std::vector<Shape> want = {{1, 16, 48, 32}, {1, 32, 24, 16}, {1, 64, 12, 8}, {1, 128, 6, 4}, {1, 256, 3, 2}};
  for (std::size_t i = 0; i < maps.size(); ++i) {
    CHECK(maps[i].shape() == want[i]);
    CHECK(maps[i].layout() == Layout::Contiguous);
  }
}

TEST_CASE("images of any depth and channel count go through the same preprocessing") {
  Model m = tiny();
  const cv::Mat gray = sample("bag_00018.png");
  cv::Mat bgr, bgra, f32;
  cv::cvtColor(gray, bgr, cv::COLOR_GRAY2BGR);
  cv::cvtColor(gray, bgra, cv::COLOR_GRAY2BGRA);
  const auto a = m.classify(gray, 1), b = m.classify(bgr, 1), c = m.classify(bgra, 1);
  CHECK(a[0].logit == doctest::Approx(b[0].logit).epsilon(1e-5));
  CHECK(b[0].logit == doctest::Approx(c[0].logit).epsilon(1e-5));
  CHECK_THROWS_AS(m.classify(cv::Mat(), 1), Error);
  // a float image of NaN was classified as a class with a probability
  cv::Mat nan_image(28, 28, CV_32FC3, cv::Scalar::all(std::nan("")));
  CHECK_THROWS_WITH_AS(m.classify(nan_image, 1), doctest::Contains("NaN or infinite pixel values"), Error);
  gray.convertTo(f32, CV_32F);
  f32.at<float>(3, 4) = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH_AS(m.classify(f32, 1), doctest::Contains("NaN or infinite pixel values"), Error);
  // top_k: logits of another width gave empty labels; NaN logits a ranking
  const int classes = m.network().config().num_classes;
  CHECK_THROWS_WITH_AS(m.top_k(Tensor::zeros({1, classes + 10}), 3), doctest::Contains("do not fit"), Error);
  Tensor bad = Tensor::zeros({2, classes});
  bad.data()[classes + 1] = std::nanf("");
  CHECK_THROWS_WITH_AS(m.top_k(bad, 3), doctest::Contains("the logits of image 1 are not finite"), Error);
  CHECK(m.top_k(Tensor::zeros({2, classes}), 3).size() == 2);
}

TEST_CASE("concurrent classify() calls on one loaded model are safe and agree with serial calls") {
  Model m = tiny();
  const std::vector<std::string> names = {"bag_00018.png", "coat_00006.png", "sandal_00008.png", "trouser_00002.png"};
  std::vector<cv::Mat> imgs;
  for (const auto& n : names) imgs.push_back(sample(n));
  std::vector<float> serial;
  for (const auto& img : imgs) serial.push_back(m.classify(img, 1)[0].logit);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep)
        for (std::size_t i = 0; i < imgs.size(); ++i) {
          const std::size_t k = (i + static_cast<std::size_t>(t)) % imgs.size();
          if (m.classify(imgs[k], 1)[0].logit != serial[k]) ++mismatches[static_cast<std::size_t>(t)];
        }
    });
  for (auto& th : threads) th.join();
  for (int x : mismatches) CHECK(x == 0);
}

TEST_CASE("without a GPU, asking for CUDA memory fails with a message, not a crash") {
  if (cuda_available()) return;
  CHECK_THROWS_WITH_AS(Tensor::zeros({1}, Device::CUDA), doctest::Contains("CUDA"), Error);
}

TEST_CASE("set_num_threads holds in threads started later; features() takes a batch") {
  Model m = tiny();
  const std::vector<cv::Mat> imgs = {sample("bag_00018.png"), sample("coat_00006.png")};
  set_num_threads(1);
  int seen = -1, own = -1, after = -2;
  std::thread t([&] {
    own = omp_get_max_threads();
    m.classify(imgs[0], 1);
    seen = threads_in_use();
    after = omp_get_max_threads();  // the thread's own OpenMP setting is left alone
  });
  t.join();
  CHECK(seen == 1);
  CHECK(after == own);
  CHECK(num_threads() == 1);
  set_num_threads(0);
  CHECK_THROWS_AS(set_num_threads(-1), Error);
  CHECK_THROWS_AS(set_num_threads(100000), Error);
  const auto batch = m.features(imgs);
  for (std::size_t i = 0; i < imgs.size(); ++i) {
    const auto one = m.features(imgs[i]);
    REQUIRE(one.size() == batch.size());
    for (std::size_t s = 0; s < one.size(); ++s) {
      CHECK(batch[s].dim(0) == 2);
      const auto b = batch[s].to_vector(), o = one[s].to_vector();
      const std::size_t per = o.size();
      float worst = 0.0f;
      for (std::size_t k = 0; k < per; ++k) worst = std::max(worst, std::abs(b[i * per + k] - o[k]));
      CHECK(worst <= 1e-4f);
    }
  }
  CHECK_THROWS_AS(m.features(std::vector<cv::Mat>{}), Error);
}

TEST_CASE("relpos calls give the calling thread back its OpenMP thread count") {
  // Every call set the thread's count to relpos's and left it so: an application's own
  // `#pragma omp parallel` after a classify() then ran on relpos's count (1 on a busy machine).
  Model m = tiny();
  const cv::Mat img = sample("bag_00018.png");
  // (3, not more: a team of 7 on this test's 2 cores left libomp allocations that LeakSanitizer
  // reports in the clang build)
  const int before = omp_get_max_threads();
  for (const int relpos_threads : {1, 2, 0}) {
    CAPTURE(relpos_threads);
    set_num_threads(relpos_threads);
    omp_set_num_threads(3);
    m.classify(img, 1);
    CHECK(omp_get_max_threads() == 3);
    const Tensor x = make_batch({img}, m.preprocess());
    CHECK(omp_get_max_threads() == 3);
    (void)m.logits(x);
    (void)ops::global_avg_pool(x);
    (void)m.features(img);
    CHECK(omp_get_max_threads() == 3);
    if (relpos_threads > 0) CHECK(threads_in_use() == relpos_threads);
    int in_region = 0;
#pragma omp parallel
    {
#pragma omp single
      in_region = omp_get_num_threads();
    }
    CHECK(in_region == 3);
  }
  set_num_threads(0);
  omp_set_num_threads(before);
}

TEST_CASE("logits() refuses a batch with NaN or infinity; a batch's bad image is named by its place") {
  Model m = tiny();
  const cv::Mat img = sample("bag_00018.png");
  Tensor x = make_batch({img, img}, m.preprocess());
  x.data()[x.numel() / 2 + 5] = std::numeric_limits<float>::quiet_NaN();  // in image 1
  // it gave finite logits: a ReLU maps NaN to 0
  CHECK_THROWS_WITH_AS(m.logits(x), doctest::Contains("logits: the batch holds a non-finite value (nan) in image 1"), Error);
  x.data()[x.numel() / 2 + 5] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH_AS(m.logits(x), doctest::Contains("non-finite value (inf) in image 1"), Error);
  // an error in a batch of images names which one (it said only "empty image")
  CHECK_THROWS_WITH_AS(m.classify({img, img, cv::Mat(), img}, 1), doctest::Contains("images[2] (of 4): empty image"), Error);
  cv::Mat two(8, 8, CV_8UC2, cv::Scalar(1, 2));
  CHECK_THROWS_WITH_AS(m.features(std::vector<cv::Mat>{img, two}), doctest::Contains("images[1] (of 2): images must have 1, 3 or 4 channels"),
                       Error);
  CHECK_THROWS_WITH_AS(m.classify(cv::Mat(), 1), doctest::Contains("empty image"), Error);  // one image: no index
}

TEST_CASE("Model::create refuses a weights file (it made random weights that carried the file's labels)") {
  CHECK_THROWS_WITH_AS(Model::create(test::source_dir() + "/models/botnet-fmnist.json"),
                       doctest::Contains("botnet-fmnist.json: holds trained weights, which Model::create would not use"),
                       Error);
  CHECK_THROWS_WITH_AS(Model::create("botnet-fmnist"), doctest::Contains("holds trained weights"), Error);  // by name
  CHECK_NOTHROW(Model::create("fmnist_botnet"));  // its config
  test::TempDir d;
  Model::load(test::source_dir() + "/models/botnet-fmnist.json").save_safetensors(d.file("m.safetensors"));
  CHECK_THROWS_WITH_AS(Model::create(d.file("m.safetensors")), doctest::Contains("holds trained weights"), Error);
}

TEST_CASE("Tensor::dim names the dimension asked for when it is out of range") {
  const Tensor t({2, 3});
  CHECK(t.dim(-1) == 3);
  CHECK(t.dim(-2) == 2);
  CHECK_THROWS_WITH_AS(t.dim(-3), doctest::Contains("dimension -3 out of range for shape [2, 3]"), Error);  // said -1
  CHECK_THROWS_WITH_AS(t.dim(2), doctest::Contains("dimension 2 out of range"), Error);
}

TEST_CASE("one OpCache used with two weight tensors gives each its own result, not a stale plan") {
  std::mt19937 rng(11);
  const Tensor x = test::random_tensor({1, 4, 6, 5}, rng).channels_last();
  const Tensor w1 = test::random_tensor({3, 4, 3, 3}, rng), w2 = test::random_tensor({3, 4, 3, 3}, rng);
  OpCache cache;
  const ops::ConvSpec spec{1, 1, 1};
  const Tensor y1 = ops::conv2d(x, w1, nullptr, spec, {}, &cache);
  const Tensor y2 = ops::conv2d(x, w2, nullptr, spec, {}, &cache);
  CHECK(test::max_abs_diff(y1, ops::conv2d(x, w1, nullptr, spec)) == 0.0f);
  CHECK(test::max_abs_diff(y2, ops::conv2d(x, w2, nullptr, spec)) == 0.0f);
  CHECK(test::max_abs_diff(y1, y2) > 0.0f);
}

TEST_CASE("a moved-from model throws relpos::Error when used, and works again once a model is assigned to it") {
  Model a = tiny();
  const cv::Mat img(64, 96, CV_8UC3, cv::Scalar(10, 120, 200));
  const auto want = a.classify(img, 3);
  Model b = std::move(a);
  // before: a segfault in Network::device()
  CHECK_THROWS_WITH_AS(a.classify(img, 3), doctest::Contains("moved from"), Error);  // NOLINT(bugprone-use-after-move)
  CHECK_THROWS_WITH_AS(a.features(img), doctest::Contains("moved from"), Error);
  CHECK(b.classify(img, 3)[0].index == want[0].index);
  a = tiny();
  CHECK(a.classify(img, 3)[0].probability == want[0].probability);
}
