// Fine-tuning: starting from trained weights (--init, or a weights file given as --config), the
// classes taken from the data, and the classifier replaced (or cut down) when they differ.
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#ifndef RELPOS_NO_IMAGE_CODECS
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

#include "cli_run.hpp"
#include "relpos/safetensors.hpp"
#include "relpos/error.hpp"
#include "relpos/trainer.hpp"
#include "test_util.hpp"

using namespace relpos;
namespace fs = std::filesystem;

namespace {

std::vector<float> tensor_values(const Model& m, const std::string& name) {
  const ParamRef* p = m.network().find(name);
  REQUIRE(p != nullptr);
  return p->value->to_vector();
}

TrainOptions quick(const std::string& data, const std::string& out, int epochs = 1) {
  TrainOptions o;
  o.data = data;
  o.epochs = epochs;
  o.batch = 16;
  o.lr = 0.05f;
  o.warmup_epochs = 0.0f;
  o.out = out;
  o.workers = 1;
  o.checkpoint_minutes = 0;
  return o;
}

// The config file with another class count.
std::string config_with_classes(const test::TempDir& d, int classes) {
  nlohmann::json j;
  std::ifstream(test::tiny_rgb_config()) >> j;
  j["num_classes"] = classes;
  const std::string path = d.file("tiny" + std::to_string(classes) + ".json");
  std::ofstream(path) << j.dump();
  return path;
}

}  // namespace

TEST_CASE("fit_to_data keeps a fitting classifier, takes labels from the data, and replaces the classifier otherwise") {
  Model m = Model::create(test::tiny_rgb_config(), 4);
  const auto stem = tensor_values(m, "stem.conv.weight");
  const auto fc = tensor_values(m, "head.fc.weight");
  // no labels, as many outputs as classes: kept, labels from the data
  CHECK(fit_to_data(m, {"a", "b", "c"}) == "");
  CHECK(m.labels() == std::vector<std::string>{"a", "b", "c"});
  CHECK(tensor_values(m, "head.fc.weight") == fc);
  // labels naming the data's folders (in another order): kept as they are
  CHECK(fit_to_data(m, {"c", "a", "b"}) == "");
  CHECK(m.labels() == std::vector<std::string>{"a", "b", "c"});
  // two of the three classes: a classifier of two rows, the rows of those labels
  const std::string cut = fit_to_data(m, {"c", "a"});
  CHECK(cut.find("a new classifier") != std::string::npos);
  CHECK(cut.find("keep the rows of the data's classes") != std::string::npos);
  CHECK(m.network().config().num_classes == 2);
  CHECK(m.labels() == std::vector<std::string>{"c", "a"});
  const auto fc2 = tensor_values(m, "head.fc.weight");
  const std::size_t row = fc.size() / 3;
  CHECK(std::vector<float>(fc2.begin(), fc2.begin() + static_cast<long>(row)) ==
        std::vector<float>(fc.begin() + 2 * static_cast<long>(row), fc.end()));
  CHECK(std::vector<float>(fc2.begin() + static_cast<long>(row), fc2.end()) ==
        std::vector<float>(fc.begin(), fc.begin() + static_cast<long>(row)));
  CHECK(tensor_values(m, "stem.conv.weight") == stem);  // the rest is kept
  // other classes: new labels, a new (random) classifier, everything else kept
  const std::string fresh = fit_to_data(m, {"x", "y", "z", "w"});
  CHECK(fresh.find("head.fc.weight") != std::string::npos);
  CHECK(fresh.find("start from random weights") != std::string::npos);
  CHECK(m.network().config().num_classes == 4);
  CHECK(m.labels() == std::vector<std::string>{"x", "y", "z", "w"});
  CHECK(tensor_values(m, "stem.conv.weight") == stem);
  // labels with '/' match their folder names
  Model f = Model::create(test::tiny_rgb_config(), 4);
  f.set_labels({"T-shirt/top", "Bag", "Coat"});
  CHECK(fit_to_data(f, {"Bag", "Coat", "T-shirt_top"}) == "");
}

TEST_CASE("train takes the class count from the data: a config with another num_classes trains, with a message") {
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 8, 2);
  // before: "has 3 classes but the model has 5 outputs" (the config had to be edited by hand)
  const auto r = test::run_cli("train -c " + config_with_classes(d, 5) + " --data " + d.path + "/data -b 8 --threads 1 --epochs 1 -q -o " +
                               d.path + "/run");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("the model has 5 outputs but the data 3 classes (bars, columns, dots): a new classifier for 3") !=
        std::string::npos);
  const Model m = Model::load(d.path + "/run/model.json");
  CHECK(m.network().config().num_classes == 3);
  // the run's first line counted the 5-output classifier: the note gives the count the run trains
  std::ostringstream now;
  now << std::fixed << std::setprecision(2) << static_cast<double>(m.network().num_params()) / 1e6 << " M parameters now";
  CHECK(r.out.find(now.str()) != std::string::npos);
  CHECK(m.labels() == std::vector<std::string>{"bars", "columns", "dots"});
}

TEST_CASE("train --init and --config with a weights file start from the weights; another class count gets a new classifier") {
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 24, 8);
  Model trained = Model::create(test::tiny_rgb_config(), 7);
  TrainOptions o = quick(d.path + "/data", d.path + "/first", 8);
  train(trained, o);
  const double trained_acc = evaluate(trained, *open_dataset(d.path + "/data", "test")).top1;
  MESSAGE("trained: " << trained_acc);
  REQUIRE(trained_acc > 0.8);
  const std::string weights = d.path + "/first/model.json";

  // --config naming a weights file: before, random weights without a word; now fine-tuning, said so.
  // One step at a tiny learning rate keeps the weights almost as they were, so the accuracy stays.
  auto r = test::run_cli("train -c " + weights + " --data " + d.path + "/data -b 16 --threads 1 --epochs 1 --max-steps 1 --lr 1e-6 -q -o " +
                         d.path + "/cfg");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("holds trained weights: fine-tuning from them (as --init " + weights + ")") != std::string::npos);
  const Model from_cfg = load_checkpoint_model(d.path + "/cfg/checkpoint.safetensors");
  CHECK(evaluate(from_cfg, *open_dataset(d.path + "/data", "test")).top1 == doctest::Approx(trained_acc).epsilon(0.1));

  // --init on a dataset of two of the classes: their classifier rows are kept, so it starts above chance
  fs::create_directories(d.path + "/two/train");
  fs::create_directories(d.path + "/two/test");
  for (const char* split : {"train", "test"})
    for (const char* c : {"bars", "dots"})
      fs::copy(d.path + "/data/" + split + "/" + c, d.path + "/two/" + split + "/" + c, fs::copy_options::recursive);
  r = test::run_cli("train --init " + weights + " --data " + d.path + "/two -b 16 --threads 1 --epochs 1 --lr 0.01 -q -o " + d.path +
                    "/two_run");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("from " + weights) != std::string::npos);
  CHECK(r.out.find("keep the rows of the data's classes") != std::string::npos);
  Model two = Model::load(d.path + "/two_run/model.json");
  CHECK(two.labels() == std::vector<std::string>{"bars", "dots"});
  CHECK(evaluate(two, *open_dataset(d.path + "/two", "test")).top1 > 0.8);

  // classes the model does not know (renamed folders): a new classifier; the options record --init
  fs::rename(d.path + "/two/train/bars", d.path + "/two/train/stripes");
  fs::rename(d.path + "/two/test/bars", d.path + "/two/test/stripes");
  r = test::run_cli("train --init " + weights + " --data " + d.path + "/two -b 16 --threads 1 --epochs 1 -q -o " + d.path + "/renamed");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("a new classifier (head.fc.weight, head.fc.bias start from random weights)") != std::string::npos);
  CHECK(Model::load(d.path + "/renamed/model.json").labels() == std::vector<std::string>{"dots", "stripes"});
  const auto meta = SafetensorsFile::read(d.path + "/renamed/checkpoint.safetensors").metadata();
  CHECK(TrainOptions::from_json(nlohmann::json::parse(meta.at("relpos.train_options"))).init == weights);
}

TEST_CASE("fine-tuning the shipped Fashion-MNIST model on three of its classes beats training from scratch") {
  test::TempDir d;
  // Trouser, Bag, Ankle boot: 32 training and 20 test images each
  if (!test::make_fashion_mnist_folder(d.path + "/fm3", {1, 8, 9}, 32, 20)) {
    MESSAGE("dataset-fashion-mnist is not installed");
    return;
  }
  for (const char* split : {"train", "test"}) {  // the same images in folders named a, b, c
    fs::create_directories(d.path + "/abc/" + split);
    int k = 0;
    for (const char* c : {"Trouser", "Bag", "Ankle boot"})
      fs::copy(d.path + "/fm3/" + split + "/" + c, d.path + "/abc/" + split + "/" + std::string(1, static_cast<char>('a' + k++)),
               fs::copy_options::recursive);
  }
  const auto accuracy_after = [&](const std::string& data, bool fine_tune, long steps) {
    Model m = fine_tune ? Model::load(test::source_dir() + "/models/botnet-fmnist.json")
                        : Model::create(test::source_dir() + "/models/fmnist_botnet.json", 1);
    TrainOptions o = quick(data, d.path + "/run", 1);
    o.lr = 0.02f;
    o.max_steps = steps;
    o.eval_each_epoch = false;
    o.overwrite = true;  // every run is scratch: each replaces the last one's results
    if (steps == 0) fit_to_data(m, open_dataset(data, "train")->classes());
    else train(m, o);
    m.network().prepare_inference();
    return evaluate(m, *open_dataset(data, "test", m.labels())).top1;
  };
  // the shipped model knows these classes: before any step it is far above chance (1/3)
  const double start = accuracy_after(d.path + "/fm3", true, 0);
  CHECK(start > 0.9);
  // classes it does not know by name (a new classifier): a few steps from its weights beat the same
  // steps from random weights
  const double tuned = accuracy_after(d.path + "/abc", true, 6);
  const double scratch = accuracy_after(d.path + "/abc", false, 6);
  MESSAGE("Fashion-MNIST 3 classes: known classes before training " << start << "; after 6 steps: fine-tuned " << tuned
                                                                    << ", from scratch " << scratch);
  CHECK(tuned > scratch);
  CHECK(tuned > 0.5);
}

TEST_CASE("train says when a grey model is trained on colour folders (their colours are lost), and only then") {
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 4, 2);
  nlohmann::json j;
  std::ifstream(test::tiny_rgb_config()) >> j;
  j["in_chans"] = 1;
  j["preprocess"]["channels"] = "GRAY";
  j["preprocess"]["mean"] = {0.5};
  j["preprocess"]["std"] = {0.25};
  const std::string grey = d.file("grey.json");
  std::ofstream(grey) << j.dump();
  const std::string run = " --data " + d.path + "/data -b 4 --threads 1 --epochs 1 --max-steps 1 -q -o ";
  // before: no word, and a model that could not tell red from blue
  auto r = test::run_cli("train -c " + grey + run + d.path + "/grey");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("12x12 GRAY input (its preprocessing), so the colour images of " + d.path + "/data") != std::string::npos);
  r = test::run_cli("train -c " + test::tiny_rgb_config() + run + d.path + "/rgb");
  CHECK(r.status == 0);
  CHECK(r.out.find("GRAY input") == std::string::npos);
#ifndef RELPOS_NO_IMAGE_CODECS
  // grey images on a grey model: nothing to say
  for (const auto& e : fs::recursive_directory_iterator(d.path + "/data"))
    if (e.path().extension() == ".png") {
      cv::Mat g;
      cv::cvtColor(cv::imread(e.path().string()), g, cv::COLOR_BGR2GRAY);
      cv::imwrite(e.path().string(), g);
    }
  r = test::run_cli("train -c " + grey + run + d.path + "/grey2");
  CHECK(r.status == 0);
  CHECK(r.out.find("GRAY input") == std::string::npos);
#endif
}
