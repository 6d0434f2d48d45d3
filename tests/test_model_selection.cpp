// Validation and model selection: a seeded held-out part of the training set (or a val/ folder)
// scored every epoch, the best epoch kept beside the last, the test set scored once at the end;
// an EMA of the weights is what is evaluated and saved when it is on.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "cli_run.hpp"
#include "data/dataset_subset.hpp"
#include "relpos/safetensors.hpp"
#include "relpos/error.hpp"
#include "relpos/trainer.hpp"
#include "test_util.hpp"
#include "train/weight_ema.hpp"

using namespace relpos;
namespace fs = std::filesystem;

namespace {

using test::weights_of;

TrainOptions quick(const std::string& data, const std::string& out, int epochs) {
  TrainOptions o;
  o.data = data;
  o.epochs = epochs;
  o.batch = 16;
  o.lr = 0.05f;
  o.warmup_epochs = 0.5f;
  o.out = out;
  o.workers = 1;
  o.seed = 2;
  o.checkpoint_minutes = 0;
  return o;
}

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

TEST_CASE("the validation split is seeded, per class, and disjoint from the images trained on") {
  test::TempDir d;
  test::make_pattern_dataset(d.path, 10, 1);
  const auto data = open_dataset(d.path, "train");
  const auto [train, val] = detail::split_for_validation(*data, 0.2f, 5);
  CHECK(val.size() == 6);  // 2 of each class's 10
  CHECK(train.size() + val.size() == data->size());
  std::set<std::size_t> all(train.begin(), train.end());
  for (std::size_t i : val) CHECK(all.insert(i).second);  // never in both
  CHECK(all.size() == data->size());
  std::vector<int> per_class(3, 0);
  for (std::size_t i : val) ++per_class[static_cast<std::size_t>(data->label(i))];
  CHECK(per_class == std::vector<int>{2, 2, 2});
  CHECK(detail::split_for_validation(*data, 0.2f, 5).second == val);  // the same seed, the same split
  CHECK(detail::split_for_validation(*data, 0.2f, 6).second != val);
  const detail::DatasetSubset sub(*data, val);
  CHECK(sub.size() == 6);
  CHECK(sub.name(0) == data->name(val[0]));
  CHECK_THROWS_WITH_AS(detail::split_for_validation(*data, 1.5f, 5), doctest::Contains("between 0 and 1"), Error);
}

TEST_CASE("with --val-split: val columns each epoch, best.safetensors and model.json from the best epoch, test scored once") {
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 20, 6);
  Model m = Model::create(test::tiny_rgb_config(), 3);
  TrainOptions o = quick(d.path + "/data", d.path + "/run", 3);
  o.val_split = 0.25f;
  std::size_t batches = 0;
  o.on_event = [&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::Step) batches = e.batches;
  };
  const TrainResult r = train(m, o);
  CHECK(batches == 45 / 16);  // 60 images less 15 held out
  REQUIRE(r.history.size() == 3);
  int best = 0;
  double best_acc = -1;
  for (const auto& e : r.history) {
    CHECK(e.val_acc >= 0);
    CHECK(e.test_acc == -1.0);  // not scored every epoch: the test set is not for choosing
    if (e.val_acc > best_acc) best = e.epoch, best_acc = e.val_acc;
  }
  CHECK(r.best_epoch == best);
  CHECK(r.best_val_acc == best_acc);
  CHECK(r.test_acc >= 0);  // once, at the end
  CHECK(first_line(d.path + "/run/log.csv") == "epoch,lr,train_loss,train_acc,val_loss,val_acc,test_loss,test_acc,seconds,img_per_s");
  REQUIRE(fs::exists(d.path + "/run/best.safetensors"));
  // model.json holds the best epoch's weights, the same as best.safetensors as a model
  const Model best_model = Model::load(d.path + "/run/best.safetensors");
  CHECK(weights_of(Model::load(d.path + "/run/model.json")) == weights_of(best_model));
  CHECK(evaluate(best_model, *open_dataset(d.path + "/data", "test", best_model.labels())).top1 ==
        doctest::Approx(r.test_acc));
  // eval and classify take the training checkpoints as models
  auto ev = test::run_cli("eval -m " + d.path + "/run/best.safetensors --data " + d.path + "/data -q");
  INFO(ev.out);
  CHECK(ev.status == 0);
  CHECK(ev.out.find("test: 18 images, top-1") != std::string::npos);
  auto cl = test::run_cli("classify -m " + d.path + "/run/checkpoint.safetensors " + d.path + "/data/test/dots/000.png --topk 1");
  INFO(cl.out);
  CHECK(cl.status == 0);
  CHECK(cl.out.find("dots") != std::string::npos);
}

TEST_CASE("--val-split says which classes have one image and so none in validation") {
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 12, 2);
  // leave the first class (in name order) one training image
  std::vector<fs::path> classes;
  for (const auto& e : fs::directory_iterator(d.path + "/data/train")) classes.push_back(e.path());
  std::sort(classes.begin(), classes.end());
  std::vector<fs::path> images;
  for (const auto& e : fs::directory_iterator(classes.front())) images.push_back(e.path());
  std::sort(images.begin(), images.end());
  for (std::size_t i = 1; i < images.size(); ++i) fs::remove(images[i]);
  Model m = Model::create(test::tiny_rgb_config(), 3);
  TrainOptions o = quick(d.path + "/data", d.path + "/run", 1);
  o.val_split = 0.25f;
  std::vector<std::string> notes;
  o.on_event = [&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::Message) notes.push_back(e.message);
  };
  train(m, o);
  const std::string want = "--val-split: 1 class has one training image, kept for training, so validation has none of '" +
                           classes.front().filename().string() + "'";
  bool found = false;
  for (const auto& n : notes) found = found || n == want;
  INFO(want);
  CHECK(found);
}

TEST_CASE("a folder of class folders without train/ and test/ is all training data: no test accuracy from it") {
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 8, 2);
  fs::rename(d.path + "/data/train", d.path + "/flat");  // three class folders, nothing else
  Model m = Model::create(test::tiny_rgb_config(), 3);
  TrainOptions o = quick(d.path + "/flat", d.path + "/run", 1);
  std::vector<std::string> notes;
  o.on_event = [&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::Message) notes.push_back(e.message);
  };
  const TrainResult r = train(m, o);
  // it scored the images it had trained on as the test set
  REQUIRE(r.history.size() == 1);
  CHECK(r.history[0].test_acc == -1.0);
  CHECK(r.test_acc == -1.0);
  bool said = false;
  for (const auto& n : notes) said = said || n.find("has no train/ and test/ folders: it is all training data") != std::string::npos;
  CHECK(said);
  // an output folder among the class folders became a class of the next run ("holds no images")
  Model inside = Model::create(test::tiny_rgb_config(), 3);
  CHECK_THROWS_WITH_AS(train(inside, quick(d.path + "/flat", d.path + "/flat/run", 1)),
                       doctest::Contains(("the output folder is inside " + d.path + "/flat, among the class folders").c_str()), Error);
  CHECK_FALSE(fs::exists(d.path + "/flat/run"));
}

TEST_CASE("resuming over changed training data is refused; --train-images takes every class of a folder") {
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 12, 2);
  Model m = Model::create(test::tiny_rgb_config(), 3);
  TrainOptions o = quick(d.path + "/data", d.path + "/run", 2);
  o.val_split = 0.25f;
  o.max_steps = 1;
  train(m, o);
  const std::string ckpt = d.path + "/run/checkpoint.safetensors";
  // another image in a class: the split and the batches would not be the run's (it resumed silently)
  fs::copy_file(d.path + "/data/train/dots/000.png", d.path + "/data/train/dots/zzz.png");
  Model again = Model::create(test::tiny_rgb_config(), 3);
  CHECK_THROWS_WITH_AS(train(again, quick(d.path + "/data", d.path + "/run", 2), ckpt),
                       doctest::Contains("changed since the run started (37 images now, 36 then"), Error);
  // moved to another class, same count
  fs::rename(d.path + "/data/train/dots/zzz.png", d.path + "/data/train/bars/zzz.png");
  fs::remove(d.path + "/data/train/bars/000.png");
  CHECK_THROWS_WITH_AS(train(again, quick(d.path + "/data", d.path + "/run", 2), ckpt), doctest::Contains("changed since"),
                       Error);
  fs::rename(d.path + "/data/train/bars/zzz.png", d.path + "/data/train/bars/000.png");
  fs::copy_file(d.path + "/data/train/bars/000.png", d.path + "/data/train/dots/000.png", fs::copy_options::overwrite_existing);
  CHECK(train(again, quick(d.path + "/data", d.path + "/run", 2), ckpt).history.size() == 2);  // restored: resumes

  // --train-images of a folder listed class after class: its first 18 were 12 of one class and 6 of another
  Model few = Model::create(test::tiny_rgb_config(), 3);
  TrainOptions f = quick(d.path + "/data", d.path + "/few", 1);
  f.train_images = 18;
  std::vector<std::string> notes;
  f.on_event = [&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::Message) notes.push_back(e.message);
  };
  train(few, f);
  bool said = false;
  for (const auto& n : notes) said = said || n == "--train-images 18: 18 of the 36 training images, 6 to 6 per class";
  CHECK(said);
}

TEST_CASE("a val/ folder is the validation set") {
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 12, 4);
  test::make_pattern_dataset(d.path + "/v", 1, 5, 9);
  fs::rename(d.path + "/v/test", d.path + "/data/val");
  Model m = Model::create(test::tiny_rgb_config(), 3);
  const TrainResult r = train(m, quick(d.path + "/data", d.path + "/run", 2));
  REQUIRE(r.history.size() == 2);
  CHECK(r.history[0].val_acc >= 0);
  CHECK(r.best_epoch >= 1);
  CHECK(r.test_acc >= 0);
  CHECK(fs::exists(d.path + "/run/best.safetensors"));
  // the CLI says which epoch model.json holds
  const auto cli = test::run_cli("train -c " + test::tiny_rgb_config() + " --data " + d.path + "/data -b 16 --threads 1 --epochs 1 -q -o " +
                                 d.path + "/cli");
  INFO(cli.out);
  CHECK(cli.status == 0);
  CHECK(cli.out.find("best epoch 1 by validation (val accuracy") != std::string::npos);
  CHECK(cli.out.find("test accuracy") != std::string::npos);
  CHECK(cli.out.find("model.json (the best epoch), best.safetensors") != std::string::npos);
}

TEST_CASE("WeightEma averages parameters and batch-norm statistics as ModelEmaV2") {
  Model m = Model::create(test::tiny_rgb_config(), 1);
  Network& net = m.network();
  detail::WeightEma ema(net, 0.75f);
  std::vector<std::vector<float>> start;
  for (const auto& p : net.params()) start.push_back(p.value->to_vector());
  for (const auto& p : net.params()) p.value->fill(1.0f);  // a "step" moved every tensor, buffers too
  ema.update(net);
  Model avg = Model::create(test::tiny_rgb_config(), 2);
  ema.copy_to(avg.network());
  std::size_t i = 0;
  bool buffer_seen = false;
  for (const auto& p : avg.network().params()) {
    buffer_seen = buffer_seen || p.grad == nullptr;
    const auto v = p.value->to_vector();
    for (std::size_t k = 0; k < v.size(); ++k) REQUIRE(v[k] == doctest::Approx(0.75f * start[i][k] + 0.25f));
    ++i;
  }
  CHECK(buffer_seen);
  CHECK_THROWS_WITH_AS(detail::WeightEma(net, 1.0f), doctest::Contains("between 0 and 1"), Error);
}

TEST_CASE("training with EMA: the checkpoint keeps it, evaluation and model.json use it, resuming is exact") {
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 12, 3);
  TrainOptions o = quick(d.path + "/data", d.path + "/full", 2);
  o.ema_decay = 0.9f;
  o.clip_grad = 0.5f;
  Model full = Model::create(test::tiny_rgb_config(), 9);
  const TrainResult r = train(full, o);
  const auto ema_weights = weights_of(Model::load(d.path + "/full/model.json"));
  CHECK(ema_weights != weights_of(full));  // model.json holds the average, not the last weights
  CHECK(weights_of(load_checkpoint_model(d.path + "/full/checkpoint.safetensors")) == ema_weights);
  const Model as_model = Model::load(d.path + "/full/checkpoint.safetensors");  // eval/classify see the EMA too
  CHECK(weights_of(as_model) == ema_weights);
  CHECK(evaluate(as_model, *open_dataset(d.path + "/data", "test")).top1 == doctest::Approx(r.history.back().test_acc));
  // stopped mid-run and resumed: the same weights and the same average
  TrainOptions part = o;
  part.out = d.path + "/part";
  part.max_steps = 3;
  Model p = Model::create(test::tiny_rgb_config(), 9);
  train(p, part);
  Model resumed = Model::create(test::tiny_rgb_config(), 1);
  TrainOptions again = o;
  again.out = d.path + "/part";
  train(resumed, again, d.path + "/part/checkpoint.safetensors");
  CHECK(weights_of(resumed) == weights_of(full));
  CHECK(weights_of(Model::load(d.path + "/part/model.json")) == ema_weights);
}

TEST_CASE("a checkpoint written before validation, EMA and extensions existed still resumes") {
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 12, 3);
  TrainOptions o = quick(d.path + "/data", d.path + "/run", 2);
  o.max_steps = 3;
  Model m = Model::create(test::tiny_rgb_config(), 9);
  train(m, o);
  // the same checkpoint as an older relpos wrote it: none of the newer option or progress keys
  const std::string path = d.path + "/run/checkpoint.safetensors";
  const SafetensorsFile f = SafetensorsFile::read(path);
  auto meta = f.metadata();
  auto opts = nlohmann::json::parse(meta.at("relpos.train_options"));
  for (const char* k : {"val_split", "ema_decay", "clip_grad", "init", "init_config", "extend", "extend_lr"}) opts.erase(k);
  auto prog = nlohmann::json::parse(meta.at("relpos.progress"));
  for (const char* k : {"best_epoch", "best_val_acc", "lr_segments"}) prog.erase(k);
  for (auto& e : prog.at("history")) e.erase("val_loss"), e.erase("val_acc");
  meta["relpos.train_options"] = opts.dump();
  meta["relpos.progress"] = prog.dump();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& e : f.entries()) tensors.emplace_back(e.name, f.tensor(e.name));
  write_safetensors(path, tensors, meta);
  Model resumed = Model::create(test::tiny_rgb_config(), 1);
  const TrainResult r = train(resumed, quick(d.path + "/data", "", 2), path);
  CHECK(r.history.size() == 2);
  Model full = Model::create(test::tiny_rgb_config(), 9);
  train(full, quick(d.path + "/data", d.path + "/full", 2));
  CHECK(weights_of(resumed) == weights_of(full));
}
