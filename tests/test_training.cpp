// Training: optimizers against PyTorch's update rules, the schedule, data loading and
// augmentation, falling loss, determinism, and checkpoints that resume exactly.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>

#include "relpos/data.hpp"
#include "relpos/error.hpp"
#include "relpos/ops.hpp"
#include "relpos/optim.hpp"
#include "relpos/runtime.hpp"
#include "relpos/safetensors.hpp"
#include "io/weights_file.hpp"
#include "train/plots.hpp"
#include "relpos/trainer.hpp"
#include "test_util.hpp"

using namespace relpos;
namespace fs = std::filesystem;

namespace {

using test::weights_of;

TrainOptions small_run(const std::string& data, const std::string& out) {
  TrainOptions o;
  o.data = data;
  o.epochs = 2;
  o.batch = 16;
  o.lr = 0.05f;
  o.warmup_epochs = 0.5f;
  o.out = out;
  o.augment = {1, true, 0.3f};
  o.seed = 3;
  return o;
}

// One epoch of small_run on a small pattern dataset in dir/data, written to dir/run; the options it
// ran with.
TrainOptions train_one_epoch(const test::TempDir& dir) {
  test::make_pattern_dataset(dir.path + "/data", 8, 2);
  TrainOptions o = small_run(dir.path + "/data", dir.path + "/run");
  o.epochs = 1;
  Model m = Model::create(test::tiny_rgb_config(), 5);
  train(m, o);
  return o;
}

// Writes `to` as the checkpoint `from` with its metadata edited (the two may be one file).
void rewrite_metadata(const std::string& from, const std::string& to,
                      const std::function<void(std::map<std::string, std::string>&)>& edit) {
  const SafetensorsFile f = SafetensorsFile::read(from);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& e : f.entries()) tensors.emplace_back(e.name, f.tensor(e.name));
  std::map<std::string, std::string> meta = f.metadata();
  edit(meta);
  write_safetensors(to, tensors, meta);
}

void write_gz(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

std::vector<std::uint8_t> idx_bytes(std::vector<std::uint32_t> dims, std::uint8_t fill) {
  std::vector<std::uint8_t> b = {0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
  std::size_t n = 1;
  for (auto d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(d >> s));
    n *= d;
  }
  b.insert(b.end(), n, fill);
  return b;
}

}  // namespace

TEST_CASE("SGD (momentum, Nesterov, weight decay) and AdamW follow PyTorch's update rules") {
  const std::vector<float> p0 = {1.0f, -2.0f, 0.5f}, g = {0.1f, -0.3f, 0.2f};
  SUBCASE("SGD Nesterov") {
    Tensor p = Tensor::from_vector({3}, p0), buf = Tensor::zeros({3});
    const Tensor gt = Tensor::from_vector({3}, g);
    const float lr = 0.1f, mom = 0.9f, wd = 0.01f;
    std::vector<double> ref(p0.begin(), p0.end()), b(3, 0.0);
    for (int step = 0; step < 3; ++step) {
      ops::sgd_update(p, gt, buf, lr, mom, true, wd, step == 0);
      for (int i = 0; i < 3; ++i) {
        const double gi = g[static_cast<std::size_t>(i)] + wd * ref[static_cast<std::size_t>(i)];
        b[static_cast<std::size_t>(i)] = step == 0 ? gi : mom * b[static_cast<std::size_t>(i)] + gi;
        ref[static_cast<std::size_t>(i)] -= lr * (gi + mom * b[static_cast<std::size_t>(i)]);
      }
    }
    const auto got = p.to_vector();
    for (int i = 0; i < 3; ++i) CHECK(got[static_cast<std::size_t>(i)] == doctest::Approx(ref[static_cast<std::size_t>(i)]).epsilon(1e-6));
  }
  SUBCASE("AdamW") {
    Tensor p = Tensor::from_vector({3}, p0), m = Tensor::zeros({3}), v = Tensor::zeros({3});
    const Tensor gt = Tensor::from_vector({3}, g);
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.05;
    std::vector<double> ref(p0.begin(), p0.end()), mm(3, 0.0), vv(3, 0.0);
    for (int step = 1; step <= 3; ++step) {
      ops::adamw_update(p, gt, m, v, static_cast<float>(lr), 0.9f, 0.999f, 1e-8f, static_cast<float>(wd), step);
      for (std::size_t i = 0; i < 3; ++i) {
        ref[i] *= 1 - lr * wd;
        mm[i] = b1 * mm[i] + (1 - b1) * g[i];
        vv[i] = b2 * vv[i] + (1 - b2) * g[i] * g[i];
        const double mh = mm[i] / (1 - std::pow(b1, step)), vh = vv[i] / (1 - std::pow(b2, step));
        ref[i] -= lr * mh / (std::sqrt(vh) + eps);
      }
    }
    const auto got = p.to_vector();
    for (std::size_t i = 0; i < 3; ++i) CHECK(got[i] == doctest::Approx(ref[i]).epsilon(1e-5));
  }
}

TEST_CASE("warmup then cosine") {
  LrSchedule s;
  s.lr = 0.1f, s.min_lr = 0.001f, s.warmup_lr = 0.0f, s.warmup_steps = 10, s.total_steps = 110;
  CHECK(s.at(0) == doctest::Approx(0.0f));
  CHECK(s.at(5) == doctest::Approx(0.05f));
  CHECK(s.at(10) == doctest::Approx(0.1f));
  CHECK(s.at(60) == doctest::Approx(0.0505f));
  CHECK(s.at(110) == doctest::Approx(0.001f));
  CHECK(s.at(500) == doctest::Approx(0.001f));
}

TEST_CASE("the optimizer leaves norm parameters, biases and position tables out of weight decay") {
  Model m = Model::create(test::tiny_rgb_config(), 1);
  int decayed = 0, exempt = 0;
  for (const auto& p : m.network().params()) {
    if (!p.grad) continue;
    const bool table = p.name.find("pos_embed") != std::string::npos;
    const bool norm_or_bias = p.name.find(".bn.") != std::string::npos || p.name.find("post_attn") != std::string::npos ||
                              p.name.find("bias") != std::string::npos;
    CHECK_MESSAGE(p.no_weight_decay == (table || norm_or_bias), p.name);
    (p.no_weight_decay ? exempt : decayed)++;
  }
  CHECK(decayed > 0);
  CHECK(exempt > 0);
}

TEST_CASE("learning-curve axes are padded but stay within what a loss or an accuracy can be") {
  // a loss falling to 0.01: the padding would put the axis at -0.05
  AxisRange r = padded_axis(0.01, 0.6, 0.0, 1e300);
  CHECK(r.lo == 0.0);
  CHECK(r.hi == doctest::Approx(0.6 + 0.08 * 0.59));
  // accuracies up to 99.9%: not past 100
  r = padded_axis(80.0, 99.9, 0.0, 100.0);
  CHECK(r.lo == doctest::Approx(80.0 - 0.08 * 19.9));
  CHECK(r.hi == 100.0);
  // flat series keep a visible span on the side that has room
  r = padded_axis(100.0, 100.0, 0.0, 100.0);
  CHECK(r.lo == doctest::Approx(95.0));
  CHECK(r.hi == 100.0);
  r = padded_axis(0.0, 0.0, 0.0, 1e300);
  CHECK(r.lo == 0.0);
  CHECK(r.hi == doctest::Approx(1e-3));
  r = padded_axis(2.0, 2.0, 0.0, 1e300);
  CHECK(r.lo == doctest::Approx(1.9));
  CHECK(r.hi == doctest::Approx(2.1));
  r = padded_axis(0.0, 0.0, 0.0, 100.0, 1.0);  // a flat 0% accuracy: ticks 0.0 to 1.0, not all 0.0
  CHECK(r.hi == doctest::Approx(1.0));
}

TEST_CASE("IDX files: reading, and clear errors for damaged ones") {
  test::TempDir dir;
  auto imgs = idx_bytes({5, 4, 3}, 7);
  auto labs = idx_bytes({5}, 2);
  write_gz(dir.file("i.gz"), imgs);
  write_gz(dir.file("l.gz"), labs);
  IdxDataset d(dir.file("i.gz"), dir.file("l.gz"), {"a", "b", "c"});
  CHECK(d.size() == 5);
  CHECK(d.label(4) == 2);
  CHECK(d.image(1).rows == 4);
  CHECK(d.image(1).cols == 3);
  CHECK(d.image(1).at<std::uint8_t>(2, 2) == 7);
  {
    // an image outlives its dataset (quantize's last calibration batch did, and crashed): it owns its pixels
    cv::Mat kept;
    {
      const IdxDataset e(dir.file("i.gz"), dir.file("l.gz"), {"a", "b", "c"});
      kept = e.image(1);
    }
    CHECK(kept.u != nullptr);
    CHECK(kept.at<std::uint8_t>(2, 2) == 7);
  }
  // truncated data, a cut gzip stream, wrong label counts, out-of-range labels
  auto cut = imgs;
  cut.resize(cut.size() - 3);
  write_gz(dir.file("cut.gz"), cut);
  CHECK_THROWS_WITH_AS(IdxDataset(dir.file("cut.gz"), dir.file("l.gz"), {"a", "b", "c"}), doctest::Contains("promises"), Error);
  std::ifstream in(dir.file("i.gz"), std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(dir.file("trunc.gz"), std::ios::binary) << gz.substr(0, gz.size() / 2);
  CHECK_THROWS_WITH_AS(IdxDataset(dir.file("trunc.gz"), dir.file("l.gz"), {"a", "b", "c"}), doctest::Contains("trunc.gz"), Error);
  write_gz(dir.file("l4.gz"), idx_bytes({4}, 1));
  CHECK_THROWS_WITH_AS(IdxDataset(dir.file("i.gz"), dir.file("l4.gz"), {"a", "b", "c"}), doctest::Contains("4 labels"), Error);
  write_gz(dir.file("l9.gz"), idx_bytes({5}, 9));
  CHECK_THROWS_WITH_AS(IdxDataset(dir.file("i.gz"), dir.file("l9.gz"), {"a", "b", "c"}), doctest::Contains("label 9"), Error);
  CHECK_THROWS_WITH_AS(IdxDataset(dir.file("nope.gz"), dir.file("l.gz"), {"a"}), doctest::Contains("cannot open"), Error);
}

TEST_CASE("Fashion-MNIST from the Debian package") {
  if (!fs::exists(std::string(kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz")) {
    MESSAGE("dataset-fashion-mnist is not installed");
    return;
  }
  auto test = open_dataset("fashion-mnist", "test");
  CHECK(test->size() == 10000);
  CHECK(test->classes().size() == 10);
  CHECK(test->image(0).rows == 28);
  CHECK(test->label(0) == 9);  // the first test image is an ankle boot
}

TEST_CASE("image folders: classes from folder names; unreadable files are reported and skipped") {
  test::TempDir dir;
  test::make_pattern_dataset(dir.path, 4, 2);
  std::ofstream(dir.path + "/train/dots/broken.png") << "not a png";
  auto d = open_dataset(dir.path, "train");
  CHECK(d->classes() == std::vector<std::string>{"bars", "columns", "dots"});
  CHECK(d->size() == 13);
  Model m = Model::create(test::tiny_rgb_config());
  DataLoader::Options lo;
  lo.batch = 5;
  lo.drop_last = false;
  lo.shuffle = false;
  std::vector<std::string> messages;  // the skip goes to the application's log handler, once
  std::mutex messages_mutex;
  set_log_handler([&](const std::string& m) {
    std::lock_guard<std::mutex> lock(messages_mutex);
    messages.push_back(m);
  });
  {
    DataLoader loader(*d, m.preprocess(), lo);
    for (int epoch = 0; epoch < 2; ++epoch) {
      loader.start_epoch(epoch);
      Batch b;
      std::size_t seen = 0;
      while (loader.next(b)) seen += b.labels.size();
      CHECK(seen == 12);
    }
    CHECK(loader.skipped() == 1);
  }
  set_log_handler(nullptr);
  REQUIRE(messages.size() == 1);
  CHECK(messages[0].find("skipped") != std::string::npos);
  CHECK(messages[0].find("broken.png") != std::string::npos);
  fs::create_directories(dir.path + "/empty/x");
  CHECK_THROWS_WITH_AS(ImageFolderDataset(dir.path + "/empty"), doctest::Contains("holds no images"), Error);
  CHECK_THROWS_WITH_AS(open_dataset(dir.path + "/nothing-here", "train"), doctest::Contains("not a folder"), Error);
}

TEST_CASE("image folders: linked subfolders are followed once, a broken link is an error naming it") {
  test::TempDir dir;
  test::make_pattern_dataset(dir.path, 4, 2);
  const std::string dots = dir.path + "/train/dots";
  // a subfolder reached through a link counts (as torchvision's ImageFolder follows links), a link
  // back up the tree is walked once instead of forever
  fs::create_directories(dir.path + "/more");
  fs::copy_file(dots + "/000.png", dir.path + "/more/extra.png");
  fs::create_directory_symlink(dir.path + "/more", dots + "/linked");
  fs::create_directory_symlink(dots, dots + "/linked_back");
  auto d = open_dataset(dir.path, "train");
  CHECK(d->size() == 13);
  CHECK(find_images(dots).size() == 5);
  CHECK(find_images(dots).back() == dots + "/linked/extra.png");
  // an image whose link's target is gone is named, not silently left out
  fs::create_symlink(dir.path + "/gone.png", dots + "/lost.png");
  CHECK_THROWS_WITH_AS(open_dataset(dir.path, "train"), doctest::Contains((dots + "/lost.png: broken symbolic link").c_str()),
                       Error);
  std::vector<std::pair<std::string, std::string>> problems;
  CHECK(find_images(dots, &problems).size() == 5);  // with a list for the problems, the walk goes on
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].first == dots + "/lost.png");
  CHECK(problems[0].second.find("'" + dir.path + "/gone.png' does not exist") != std::string::npos);
  fs::remove(dots + "/lost.png");
  // so is a link to a folder whose target is gone (a disk not mounted), and a link loop: each left
  // the images it would have led to out without a word
  fs::create_directory_symlink(dir.path + "/unmounted/bags", dots + "/extra");
  CHECK_THROWS_WITH_AS(open_dataset(dir.path, "train"), doctest::Contains((dots + "/extra: broken symbolic link").c_str()),
                       Error);
  fs::remove(dots + "/extra");
  fs::create_symlink(dots + "/loop_b", dots + "/loop_a");
  fs::create_symlink(dots + "/loop_a", dots + "/loop_b");
  problems.clear();
  CHECK(find_images(dots, &problems).size() == 5);
  REQUIRE(problems.size() == 2);
  CHECK(problems[0].second.find("cannot open it: Too many levels of symbolic links") != std::string::npos);
  fs::remove(dots + "/loop_a");
  fs::remove(dots + "/loop_b");
  // whatever its name: "photos.2019" was a folder of images too
  fs::create_directory_symlink(dir.path + "/gone", dots + "/photos.2019");
  CHECK_THROWS_WITH_AS(find_images(dots), doctest::Contains((dots + "/photos.2019: broken symbolic link").c_str()), Error);
  fs::remove(dots + "/photos.2019");
  // so is a class folder's link whose target is gone: it would drop a class
  fs::create_directory_symlink(dir.path + "/gone", dir.path + "/train/stripes");
  CHECK_THROWS_WITH_AS(open_dataset(dir.path, "train"),
                       doctest::Contains((dir.path + "/train/stripes: broken symbolic link").c_str()), Error);
  fs::remove(dir.path + "/train/stripes");
  // a link from one class folder into another's (or above it) would give the same images two classes
  fs::create_directory_symlink(dir.path + "/train/bars", dots + "/bars_too");
  CHECK_THROWS_WITH_AS(open_dataset(dir.path, "train"),
                       doctest::Contains(("reached both from class folder 'bars' (as " + dir.path + "/train/bars) and from 'dots' (as " +
                                          dots + "/bars_too)").c_str()),
                       Error);
  fs::remove(dots + "/bars_too");
  fs::create_directory_symlink("..", dots + "/up");
  CHECK_THROWS_WITH_AS(open_dataset(dir.path, "train"), doctest::Contains("a symbolic link leads from one class folder"), Error);
  fs::remove(dots + "/up");
  // a link to one image of another class (before: counted for both)
  fs::create_symlink(dir.path + "/train/bars/000.png", dots + "/bar.png");
  CHECK_THROWS_WITH_AS(open_dataset(dir.path, "train"),
                       doctest::Contains((dots + "/bar.png is a symbolic link to " + fs::canonical(dir.path).string() +
                                          "/train/bars/000.png, an image of class folder 'bars'").c_str()),
                       Error);
  fs::remove(dots + "/bar.png");
  fs::create_symlink(dots + "/000.png", dots + "/same_class.png");  // a link within the class is fine
  CHECK(open_dataset(dir.path, "train")->size() == 14);
  fs::remove(dots + "/same_class.png");
  CHECK(open_dataset(dir.path, "train")->size() == 13);
  // hidden entries are not data: a notebook's checkpoint folder was a class ("holds no images", or one
  // with no test folder), macOS's "._name.png" an image that does not decode; .jfif/.jpe/.dib are images
  fs::create_directories(dir.path + "/train/.ipynb_checkpoints");
  fs::copy_file(dots + "/000.png", dir.path + "/train/.ipynb_checkpoints/000.png");
  std::ofstream(dots + "/._000.png") << "AppleDouble";
  fs::create_directories(dots + "/.hidden");
  fs::copy_file(dots + "/000.png", dots + "/.hidden/000.png");
  fs::copy_file(dots + "/000.png", dots + "/photo.jfif");
  const auto with_hidden = open_dataset(dir.path, "train");
  CHECK(with_hidden->classes().size() == 3);
  CHECK(with_hidden->size() == 14);  // 13 and the .jfif
  // a label starting with '.' names a hidden folder: said so (the folder is there, and was said missing)
  CHECK_THROWS_WITH_AS(ImageFolderDataset(dir.path + "/train", {"bars", "columns", "dots", ".ipynb_checkpoints"}),
                       doctest::Contains("a folder whose name starts with '.' is hidden, never a class"), Error);
}

TEST_CASE("the data loader restarts epochs while its workers are busy, and every epoch is complete and right") {
  // start_epoch() replaces the sample order while workers may still be making batches of the
  // last epoch (they work on that epoch's own snapshot); run under tools/tsan_check.sh too.
  test::TempDir dir;
  test::make_pattern_dataset(dir.path, 8, 2);
  auto d = open_dataset(dir.path, "train");
  Model m = Model::create(test::tiny_rgb_config());
  DataLoader::Options lo;
  lo.batch = 3;
  lo.drop_last = false;
  lo.shuffle = true;
  lo.workers = 3;
  lo.prefetch = 4;
  DataLoader loader(*d, m.preprocess(), lo);
  for (int epoch = 0; epoch < 40; ++epoch) {
    loader.start_epoch(epoch);
    Batch b;
    if (epoch % 3 == 0) {  // abandon this epoch after one batch, with work in flight
      CHECK(loader.next(b));
      continue;
    }
    std::size_t seen = 0;
    while (loader.next(b)) seen += b.labels.size();
    CHECK(seen == d->size());
  }
}

TEST_CASE("augmentation is deterministic per (seed, epoch, sample) and does what it says") {
  const int h = 6, w = 5, c = 2;
  std::vector<float> base(static_cast<std::size_t>(h * w * c));
  for (std::size_t i = 0; i < base.size(); ++i) base[i] = static_cast<float>(i + 1);
  const float fill[3] = {-7.0f, -8.0f, 0.0f};
  Augment a{2, true, 0.0f};
  auto x1 = base, x2 = base;
  augment_image(x1.data(), h, w, c, a, fill, 42);
  augment_image(x2.data(), h, w, c, a, fill, 42);
  CHECK(x1 == x2);
  bool any_different = false;
  for (std::uint64_t s = 0; s < 20 && !any_different; ++s) {
    auto x3 = base;
    augment_image(x3.data(), h, w, c, a, fill, s);
    any_different = x3 != x1;
  }
  CHECK(any_different);
  // erasing always (p = 1): some zeros appear, nothing else changes
  Augment e{0, false, 1.0f};
  auto x4 = base;
  augment_image(x4.data(), h, w, c, e, fill, 7);
  int zeros = 0;
  for (std::size_t i = 0; i < x4.size(); ++i) {
    if (x4[i] == 0.0f) ++zeros;
    else CHECK(x4[i] == base[i]);
  }
  CHECK(zeros > 0);
  CHECK(mix_seed(1, 2, 3) != mix_seed(1, 2, 4));
}

TEST_CASE("training a few steps lowers the loss; the same seeds give the same weights") {
  test::TempDir dir;
  test::make_pattern_dataset(dir.path + "/data", 40, 10);
  auto run = [&](const std::string& out) {
    Model m = Model::create(test::tiny_rgb_config(), 5);
    TrainOptions o = small_run(dir.path + "/data", dir.path + "/" + out);
    o.epochs = 8;
    o.augment = {1, false, 0.0f};
    // progress reaches the caller as events (the library prints nothing itself)
    std::size_t steps = 0, last_batch = 0, batches = 0;
    std::vector<EpochLog> ends;
    o.on_event = [&](const TrainEvent& e) {
      if (e.kind == TrainEvent::Kind::Step) {
        ++steps;
        CHECK(e.epochs == 8);
        CHECK(e.batch == (last_batch % e.batches) + 1);
        last_batch = e.batch;
        batches = e.batches;
        CHECK((std::isfinite(e.loss) && e.acc >= 0 && e.acc <= 1 && e.eta_run >= e.eta_epoch));
      } else if (e.kind == TrainEvent::Kind::EpochEnd) {
        ends.push_back(e.log);
      }
    };
    const TrainResult r = train(m, o);
    CHECK(steps == 8 * batches);
    REQUIRE(ends.size() == r.history.size());
    for (std::size_t i = 0; i < ends.size(); ++i) CHECK(ends[i].test_acc == r.history[i].test_acc);
    return std::make_pair(r, weights_of(m));
  };
  const auto [r1, w1] = run("a");
  REQUIRE(r1.history.size() == 8);
  for (const auto& e : r1.history) INFO("epoch " << e.epoch << " loss " << e.train_loss << " test acc " << e.test_acc);
  std::string hist;
  for (const auto& e : r1.history) hist += std::to_string(e.train_loss) + "/" + std::to_string(e.test_acc) + " ";
  INFO("train loss / test accuracy per epoch: " << hist);
  CHECK(r1.history.back().train_loss < 0.7 * r1.history.front().train_loss);
  CHECK(r1.history.back().test_acc > 0.8);
  const auto [r2, w2] = run("b");
  CHECK(w1 == w2);
  for (const char* f : {"model.json", "log.csv", "curves.png", "checkpoint.safetensors"}) CHECK(fs::exists(dir.path + "/a/" + f));
  Model back = Model::load(dir.path + "/a/model.json");
  CHECK(back.labels() == std::vector<std::string>{"bars", "columns", "dots"});
}

TEST_CASE("a new run refuses a folder holding an earlier run's results unless told to overwrite them") {
  test::TempDir dir;
  TrainOptions o = train_one_epoch(dir);
  const std::string log = dir.path + "/run/log.csv";
  const auto written = fs::last_write_time(log);
  Model again = Model::create(test::tiny_rgb_config(), 6);
  CHECK_THROWS_WITH_AS(train(again, o),
                       doctest::Contains((dir.path + "/run/checkpoint.safetensors: the output folder holds an earlier "
                                                     "run's results; continue it with --resume")
                                             .c_str()),
                       Error);
  CHECK(fs::last_write_time(log) == written);  // nothing was replaced
  // any one of the results is enough to refuse
  fs::remove(dir.path + "/run/checkpoint.safetensors");
  CHECK_THROWS_WITH_AS(train(again, o), doctest::Contains("/run/model.json: the output folder holds"), Error);
  o.overwrite = true;
  std::ofstream(dir.path + "/run/best.safetensors") << "an earlier run's";  // left beside the new run's before
  CHECK(train(again, o).history.size() == 1);
  CHECK(fs::exists(dir.path + "/run/checkpoint.safetensors"));
  CHECK_FALSE(fs::exists(dir.path + "/run/best.safetensors"));
  // resuming continues its own folder: no refusal; the run ended at a rate of 0, so going on needs one
  o.epochs = 2;
  const std::string ckpt = dir.path + "/run/checkpoint.safetensors";
  CHECK_THROWS_WITH_AS(train(again, o, ckpt, nullptr, 2), doctest::Contains("goes on at a learning rate of 0"), Error);
  o.extend_lr = 0.01f;
  CHECK(train(again, o, ckpt, nullptr, 2).history.size() == 2);
  CHECK_THROWS_WITH_AS(train(again, o, ckpt, nullptr, 2), doctest::Contains("needs more epochs than the run's 2"), Error);
  // a weights file is not a checkpoint: said so, with what to use instead
  CHECK_THROWS_WITH_AS(train(again, o, dir.path + "/run/model.json", nullptr, 3),
                       doctest::Contains("a weights JSON file, not a training checkpoint"), Error);
  // --save naming the run's own checkpoint replaced it with weights JSON (the run could not resume)
  TrainOptions fresh = o;
  fresh.extend_lr = 0.0f;
  fresh.epochs = 1;
  fresh.out = dir.path + "/run2";
  fresh.save = dir.path + "/run2/checkpoint.safetensors";
  CHECK_THROWS_WITH_AS(train(again, fresh), doctest::Contains("--save names the run's own checkpoint.safetensors"), Error);
  fresh.save = dir.path + "/saved.safetensors";  // by its name: safetensors
  CHECK(train(again, fresh).saved == fresh.save);
  CHECK(detail::model_file_kind(fresh.save) == detail::ModelFileKind::Safetensors);
}

TEST_CASE("a training run keeps one thread count while another process loads the machine") {
  // The adaptive default (docs/threads.md) would give a core to a busy neighbour; training keeps
  // OpenMP's default instead, since oneDNN's reductions, and so the weights, depend on the count.
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (std::getenv("OMP_NUM_THREADS") || std::getenv("RELPOS_ADAPTIVE_THREADS") || cores < 2 || num_threads() != 0) {
    MESSAGE("skipped: the thread count is set from outside, or one core");
    return;
  }
  test::TempDir dir;
  test::make_pattern_dataset(dir.path + "/data", 12, 3);
  const pid_t busy = fork();
  REQUIRE(busy >= 0);
  if (busy == 0) {
    for (volatile unsigned long i = 0;; i = i + 1) {
    }
  }
  std::vector<int> seen;
  TrainOptions o = small_run(dir.path + "/data", dir.path + "/out");
  o.on_event = [&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::Step) seen.push_back(threads_in_use());
  };
  Model m = Model::create(test::tiny_rgb_config(), 4);
  train(m, o);
  kill(busy, SIGKILL);
  waitpid(busy, nullptr, 0);
  REQUIRE(!seen.empty());
  for (int n : seen) CHECK(n == cores);
}

TEST_CASE("a run stopped mid-epoch or between epochs resumes to exactly the uninterrupted weights") {
  test::TempDir dir;
  test::make_pattern_dataset(dir.path + "/data", 12, 3);
  const std::string data = dir.path + "/data";
  Model full = Model::create(test::tiny_rgb_config(), 9);
  train(full, small_run(data, dir.path + "/full"));
  const auto want = weights_of(full);

  for (long stop_at : {3L, 2L * 2}) {  // 36 images / 16 = 2 batches per epoch: mid-epoch and at a boundary
    CAPTURE(stop_at);
    const std::string out = dir.path + "/part" + std::to_string(stop_at);
    Model part = Model::create(test::tiny_rgb_config(), 9);
    TrainOptions o = small_run(data, out);
    o.max_steps = stop_at;
    const TrainResult r = train(part, o);
    CHECK(!r.checkpoint.empty());
    // a fresh process would start from the checkpoint alone
    Model resumed = Model::create(test::tiny_rgb_config(), 123);
    TrainOptions again = small_run(data, out);
    train(resumed, again, out + "/checkpoint.safetensors");
    CHECK(weights_of(resumed) == want);
  }
  // the stop flag (Ctrl-C) saves a checkpoint and says so
  std::atomic<bool> stop{true};
  Model m = Model::create(test::tiny_rgb_config(), 9);
  const TrainResult r = train(m, small_run(data, dir.path + "/stopped"), "", &stop);
  CHECK(r.interrupted);
  CHECK(fs::exists(dir.path + "/stopped/checkpoint.safetensors"));
}

TEST_CASE("unreadable training classes and evaluation sets are refused before the first step; an evaluation that "
          "fails keeps the epoch") {
  test::TempDir dir;
  const std::string data = dir.path + "/data";
  test::make_pattern_dataset(data, 12, 3);
  Model full = Model::create(test::tiny_rgb_config(), 9);
  train(full, small_run(data, dir.path + "/full"));
  const auto want = weights_of(full);
  set_log_handler([](const std::string&) {});  // (the skipped files' lines)
  const auto garble = [](const std::string& folder) {
    for (const auto& e : fs::directory_iterator(folder)) std::ofstream(e.path()) << "not an image";
  };
  const auto refused = [&](const std::string& root, const std::string& out, const std::string& says) {
    Model m = Model::create(test::tiny_rgb_config(), 9);
    CHECK_THROWS_WITH_AS(train(m, small_run(root, out)), doctest::Contains(says.c_str()), Error);
    CHECK_FALSE(fs::exists(out + "/checkpoint.safetensors"));  // (refused before the first step)
  };
  // a test set none of whose images reads: it stopped the run at the end of its first epoch, losing it
  fs::copy(data, dir.path + "/bad_test", fs::copy_options::recursive);
  for (const char* c : {"bars", "columns", "dots"}) garble(dir.path + "/bad_test/test/" + c);
  refused(dir.path + "/bad_test", dir.path + "/o1", dir.path + "/bad_test/test: none of its 9 images can be read (the first: ");
  // a class none of whose images reads would have an output never trained; all of them: a run of no steps
  fs::copy(data, dir.path + "/bad_class", fs::copy_options::recursive);
  garble(dir.path + "/bad_class/train/dots");
  refused(dir.path + "/bad_class", dir.path + "/o2",
          dir.path + "/bad_class/train: none of the 12 images of class 'dots' can be read (the first: ");
  // one class: nothing to tell apart
  fs::create_directories(dir.path + "/one/train");
  fs::copy(data + "/train/dots", dir.path + "/one/train/dots", fs::copy_options::recursive);
  refused(dir.path + "/one/train", dir.path + "/o3", "1 class ('dots'): a classifier learns to tell classes apart");
  // A readable class (one bad image among good ones) trains as before: the loader skips the bad one.
  fs::copy(data, dir.path + "/some_bad", fs::copy_options::recursive);
  std::ofstream(dir.path + "/some_bad/train/dots/zz.png") << "not an image";
  Model m = Model::create(test::tiny_rgb_config(), 9);
  CHECK(train(m, small_run(dir.path + "/some_bad", dir.path + "/o4")).history.size() == 2);

  // The test images become unreadable during the first epoch: its evaluation fails, the epoch's
  // training is saved, and once they are back the resumed run evaluates it and ends as the
  // uninterrupted run.
  fs::copy(data, dir.path + "/later", fs::copy_options::recursive);
  const std::string saved = dir.path + "/test_images";
  fs::copy(data + "/test", saved, fs::copy_options::recursive);
  TrainOptions o = small_run(dir.path + "/later", dir.path + "/o5");
  bool garbled = false;
  o.on_event = [&](const TrainEvent&) {
    if (garbled) return;
    garbled = true;
    for (const char* c : {"bars", "columns", "dots"}) garble(dir.path + "/later/test/" + c);
  };
  Model part = Model::create(test::tiny_rgb_config(), 9);
  CHECK_THROWS_WITH_AS(train(part, o),
                       doctest::Contains(("evaluating epoch 1: none of the 9 images to evaluate can be read (the first: " +
                                          dir.path + "/later/test/bars/000.png); the epoch's training is saved in " +
                                          dir.path + "/o5/checkpoint.safetensors")
                                             .c_str()),
                       Error);
  REQUIRE(garbled);
  fs::remove_all(dir.path + "/later/test");
  fs::copy(saved, dir.path + "/later/test", fs::copy_options::recursive);
  Model resumed = Model::create(test::tiny_rgb_config(), 123);
  const TrainResult r = train(resumed, small_run(dir.path + "/later", dir.path + "/o5"), dir.path + "/o5/checkpoint.safetensors");
  set_log_handler(nullptr);
  CHECK(r.history.size() == 2);
  CHECK(r.history[0].test_acc >= 0.0);
  CHECK(weights_of(resumed) == want);
}

TEST_CASE("checkpoint_minutes writes checkpoints inside an epoch; resuming from one is exact") {
  test::TempDir dir;
  test::make_pattern_dataset(dir.path + "/data", 12, 3);  // 36 images: 2 batches of 16 per epoch
  const std::string data = dir.path + "/data";
  Model full = Model::create(test::tiny_rgb_config(), 9);
  TrainOptions o = small_run(data, dir.path + "/full");
  o.checkpoint_minutes = 0;  // epoch ends only
  CHECK(train(full, o).checkpoints == 2);
  // due after every step: one inside each epoch (after its first batch) and one at each end
  Model often = Model::create(test::tiny_rgb_config(), 9);
  o = small_run(data, dir.path + "/often");
  o.checkpoint_minutes = 1e-12;
  CHECK(train(often, o).checkpoints == 4);
  CHECK(weights_of(often) == weights_of(full));  // checkpoints do not change the run
  // a run that stops right after a mid-epoch checkpoint resumes to the same weights
  Model part = Model::create(test::tiny_rgb_config(), 9);
  o = small_run(data, dir.path + "/part");
  o.checkpoint_minutes = 1e-12;
  o.max_steps = 3;
  train(part, o);
  Model resumed = Model::create(test::tiny_rgb_config(), 5);
  train(resumed, small_run(data, dir.path + "/part"), dir.path + "/part/checkpoint.safetensors");
  CHECK(weights_of(resumed) == weights_of(full));
  // a run on 1 thread resumed with no thread setting computes on 1 thread again (it took OpenMP's
  // default, whose sums differ: not the weights of the uninterrupted run)
  set_num_threads(1);
  Model one = Model::create(test::tiny_rgb_config(), 9);
  train(one, small_run(data, dir.path + "/one"));
  Model one_part = Model::create(test::tiny_rgb_config(), 9);
  o = small_run(data, dir.path + "/one_part");
  o.max_steps = 3;
  train(one_part, o);
  set_num_threads(0);
  Model one_resumed = Model::create(test::tiny_rgb_config(), 5);
  train(one_resumed, small_run(data, dir.path + "/one_part"), dir.path + "/one_part/checkpoint.safetensors");
  CHECK(weights_of(one_resumed) == weights_of(one));
  CHECK(threads_in_use() == omp_get_num_procs());  // the run's count ends with the run
}

TEST_CASE("a run begun before the rate and momentum checks resumes with the recipe it began with") {
  // min_lr above lr, momentum 1: refused for a new run, but a checkpoint recorded before that rule
  // still resumes (the refusal named --min-lr, a flag that cannot be given with --resume)
  test::TempDir dir;
  TrainOptions o = train_one_epoch(dir);
  const std::string ckpt = dir.path + "/run/checkpoint.safetensors";
  rewrite_metadata(ckpt, ckpt, [&](std::map<std::string, std::string>& meta) {
    nlohmann::json oj = nlohmann::json::parse(meta.at("relpos.train_options"));
    oj["min_lr"] = 2.0 * oj["lr"].get<double>();
    oj["optimizer"]["momentum"] = 1.0;
    meta["relpos.train_options"] = oj.dump();
  });
  Model m = Model::create(test::tiny_rgb_config(), 5);
  CHECK(train(m, o, ckpt, nullptr, 2).history.size() == 2);
  TrainOptions fresh = o;  // a new run with either is refused
  fresh.out = dir.path + "/new";
  fresh.min_lr = 2.0f * fresh.lr;
  Model n = Model::create(test::tiny_rgb_config(), 5);
  CHECK_THROWS_WITH_AS(train(n, fresh), doctest::Contains("the learning rate would rise"), Error);
  fresh.min_lr = 0.0f;
  fresh.optimizer.momentum = 1.0f;
  CHECK_THROWS_WITH_AS(train(n, fresh), doctest::Contains("it must be from 0 to below 1"), Error);
}

TEST_CASE("a run whose recorded --save has no .json or .safetensors extension (older relpos wrote JSON to any name) resumes") {
  test::TempDir dir;
  TrainOptions o = train_one_epoch(dir);
  const std::string ckpt = dir.path + "/run/checkpoint.safetensors";
  rewrite_metadata(ckpt, ckpt, [&](std::map<std::string, std::string>& meta) {
    nlohmann::json oj = nlohmann::json::parse(meta.at("relpos.train_options"));
    oj["save"] = dir.path + "/final.weights";
    meta["relpos.train_options"] = oj.dump();
  });
  Model m = Model::create(test::tiny_rgb_config(), 5);
  TrainOptions more = o;
  more.save.clear();  // not given now: the run's own
  more.extend_lr = 0.01f;  // (a finished run ends at a rate of 0)
  train(m, more, ckpt, nullptr, 2);
  CHECK(std::filesystem::exists(dir.path + "/final.weights"));
  // given now, the rule holds
  more.save = dir.path + "/other.weights";
  Model again = Model::create(test::tiny_rgb_config(), 5);
  CHECK_THROWS_WITH_AS(train(again, more, ckpt, nullptr, 3), doctest::Contains("give a file name with one of these extensions"),
                       Error);
}

TEST_CASE("a training option that is NaN is an error naming it, before any work (it trained with the option off, unresumable)") {
  test::TempDir dir;
  test::make_pattern_dataset(dir.path + "/data", 4, 2);
  for (const char* which : {"ema_decay", "clip_grad", "val_split", "checkpoint_minutes", "bucket_mb"}) {
    CAPTURE(which);
    TrainOptions o = small_run(dir.path + "/data", dir.path + "/run_" + std::string(which));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::string w = which;
    if (w == "ema_decay") o.ema_decay = nan;
    if (w == "clip_grad") o.clip_grad = nan;
    if (w == "val_split") o.val_split = nan;
    if (w == "checkpoint_minutes") o.checkpoint_minutes = nan;
    if (w == "bucket_mb") o.bucket_mb = nan;
    Model m = Model::create(test::tiny_rgb_config(), 5);
    CHECK_THROWS_WITH_AS(train(m, o), ("the training option " + w + " is nan; it must be a finite number").c_str(), Error);
    CHECK(!std::filesystem::exists(dir.path + "/run_" + w));
  }
}

TEST_CASE("a checkpoint with missing or impossible progress is an error naming the file and the entry") {
  test::TempDir dir;
  TrainOptions o = train_one_epoch(dir);
  const std::string ckpt = dir.path + "/run/checkpoint.safetensors";
  const auto damaged = [&](const std::string& name, const std::function<void(std::map<std::string, std::string>&)>& edit) {
    rewrite_metadata(ckpt, dir.file(name), edit);
    return dir.file(name);
  };
  // a missing entry said "map::at"
  std::string p = damaged("a.safetensors", [](auto& meta) { meta.erase("relpos.progress"); });
  CHECK_THROWS_WITH_AS(load_checkpoint_model(p), (p + ": damaged checkpoint: no 'relpos.progress' in its metadata").c_str(),
                       Error);
  const auto with_progress = [&](const std::string& name, const std::string& key, const nlohmann::json& value) {
    return damaged(name, [&](auto& meta) {
      nlohmann::json pj = nlohmann::json::parse(meta.at("relpos.progress"));
      pj[key] = value;
      meta["relpos.progress"] = pj.dump();
    });
  };
  p = with_progress("b.safetensors", "epoch", -5);
  CHECK_THROWS_WITH_AS(load_checkpoint_model(p), doctest::Contains((p + ": damaged checkpoint: progress epoch -5").c_str()),
                       Error);
  // values as written (they wrapped: batch 18446744073709551613, epoch -2147483648), and beyond the run
  p = with_progress("b2.safetensors", "batch_in_epoch", -3);
  CHECK_THROWS_WITH_AS(load_checkpoint_model(p),
                       doctest::Contains((p + ": damaged checkpoint: progress batch_in_epoch -3").c_str()), Error);
  p = with_progress("b3.safetensors", "epoch", 1e12);
  CHECK_THROWS_WITH_AS(load_checkpoint_model(p), doctest::Contains("progress epoch is 1000000000000.0, not a whole number"),
                       Error);
  p = with_progress("b4.safetensors", "epoch", 5);
  CHECK_THROWS_WITH_AS(load_checkpoint_model(p), doctest::Contains("progress epoch 5 of a run of 1 epochs"), Error);
  p = with_progress("b5.safetensors", "step", 99999999);
  CHECK_THROWS_WITH_AS(load_checkpoint_model(p), doctest::Contains("progress step 99999999 after 1 epochs"), Error);
  // training options that would silently fall back to defaults, or cannot train
  const auto with_options = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    return damaged(name, [&](auto& meta) {
      nlohmann::json oj = nlohmann::json::parse(meta.at("relpos.train_options"));
      edit(oj);
      meta["relpos.train_options"] = oj.dump();
    });
  };
  p = with_options("o1.safetensors", [](nlohmann::json& oj) { oj.erase("epochs"); });
  CHECK_THROWS_WITH_AS(load_checkpoint_model(p),
                       (p + ": damaged checkpoint: no 'epochs' in its training options (relpos.train_options)").c_str(), Error);
  p = with_options("o2.safetensors", [](nlohmann::json& oj) { oj["batch"] = 0; });
  CHECK_THROWS_WITH_AS(load_checkpoint_model(p), doctest::Contains((p + ": damaged checkpoint: training options").c_str()),
                       Error);
  // a batch beyond the epoch's end is found when the run resumes on its data
  p = with_progress("c.safetensors", "batch_in_epoch", 1000000000);
  Model r = Model::create(test::tiny_rgb_config(), 5);
  CHECK_THROWS_WITH_AS(train(r, o, p), doctest::Contains((p + ": the checkpoint stands at batch 1000000000").c_str()),
                       Error);
}

TEST_CASE("training options from an older checkpoint without newer keys load with their defaults") {
  TrainOptions o;
  o.lr = 0.25f;
  nlohmann::json j = o.to_json();
  j.erase("checkpoint_minutes");
  j.erase("max_steps");
  j["augment"].erase("erase_max_area");
  const TrainOptions back = TrainOptions::from_json(j);
  CHECK(back.lr == 0.25f);
  CHECK(back.checkpoint_minutes == TrainOptions{}.checkpoint_minutes);
  CHECK(back.augment.erase_max_area == TrainOptions{}.augment.erase_max_area);
  // a key a newer relpos wrote is ignored; a known key with a bad value is an error naming it
  j["some_future_option"] = 3;
  j["optimizer"]["kind"] = "adamw";
  CHECK(TrainOptions::from_json(j).optimizer.kind == OptimizerKind::AdamW);
  j["optimizer"]["kind"] = "lion";
  CHECK_THROWS_WITH_AS(TrainOptions::from_json(j), doctest::Contains("training options: optimizer: key 'kind'"), Error);
  j["optimizer"]["kind"] = "sgd";
  j["epochs"] = "ten";
  CHECK_THROWS_WITH_AS(TrainOptions::from_json(j), doctest::Contains("key 'epochs' has the wrong type"), Error);
  // every option survives a round trip
  TrainOptions all;
  all.epochs = 7, all.batch = 33, all.optimizer.kind = OptimizerKind::AdamW, all.augment.erase_prob = 0.5f;
  all.seed = 99, all.out = "x/y", all.checkpoint_minutes = 0.5;
  CHECK(TrainOptions::from_json(all.to_json()).to_json() == all.to_json());
}

TEST_CASE("evaluation: confusion matrix, per-class accuracy; wrong class counts are refused") {
  test::TempDir dir;
  test::make_pattern_dataset(dir.path, 2, 5);
  auto data = open_dataset(dir.path, "test");
  Model m = Model::create(test::tiny_rgb_config(), 2);
  const EvalResult r = evaluate(m, *data, 4);
  CHECK(r.count == 15);
  long total = 0, diag = 0;
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 3; ++j) {
      total += r.confusion[i][j];
      if (i == j) diag += r.confusion[i][j];
    }
  CHECK(total == 15);
  CHECK(r.top1 == doctest::Approx(static_cast<double>(diag) / 15));
  CHECK(format_confusion(r).find("[2] dots") != std::string::npos);
  {
    // labels beyond ASCII: columns counted in characters, a long label cut between characters
    EvalResult u = r;
    u.classes = {"café", "日本語日本語日本語日本語日本語", "x"};
    const std::string text = format_confusion(u);
    std::istringstream lines(text);
    std::string line;
    std::vector<std::size_t> widths;
    std::getline(lines, line);  // the title
    while (std::getline(lines, line)) {
      std::size_t chars = 0;
      for (const char c : line) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
      widths.push_back(chars);
    }
    REQUIRE(widths.size() == 4);  // the header and three rows, all as wide
    CHECK(widths[1] == widths[0]);
    CHECK(widths[2] == widths[0]);
    CHECK(widths[3] == widths[0]);
    CHECK(text.find("[1] 日本語日本語日本語日本") != std::string::npos);  // 14 characters of it
  }
  plot_confusion(r, dir.file("cm.png"));
  CHECK(fs::file_size(dir.file("cm.png")) > 1000);
  Model ten = Model::create(test::source_dir() + "/models/tiny_botnet_96x64.json");
  CHECK_THROWS_WITH_AS(evaluate(ten, *data), doctest::Contains("3 classes but the model 10"), Error);
}
