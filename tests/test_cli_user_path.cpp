// The command line on the paths a user takes off the demo: the model file is the truth for the
// preprocessing, flags override only what was typed, class folders are matched by name, and the
// CLI behaves like one (usage errors exit 2, bounded flags, JSON for any file name).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <sstream>

#include "cli_run.hpp"
#include "relpos/data.hpp"
#include "relpos/error.hpp"
#include "relpos/model.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace relpos;
using relpos::test::run_cli;

namespace {
std::string src(const std::string& rel) { return test::source_dir() + "/" + rel; }
std::string photo() { return src("tests/data/photos/chelsea.png"); }

bool is_config_file(const std::string& path) {
  std::ifstream in(path);
  const json j = json::parse(in);
  return j.contains("stages") && !j.contains("tensors");
}

Model open_like_the_cli(const std::string& path) { return is_config_file(path) ? Model::create(path) : Model::load(path); }

// index -> logit from `classify --json --topk all` lines (one image)
std::map<int, float> cli_logits(const std::string& model_args, const std::string& image, int classes) {
  const auto r = run_cli("classify -q --json --topk " + std::to_string(classes) + " " + model_args + " " + image, true);
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  std::map<int, float> out;
  for (const json& p : j["predictions"]) out[p["index"].get<int>()] = p["logit"].get<float>();
  return out;
}

std::vector<std::string> shipped_models() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(src("models")))
    if (e.path().extension() == ".json") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

TEST_CASE("classify --json gives Model::classify's logits for every shipped model and config") {
  const std::vector<std::string> models = shipped_models();
  REQUIRE(models.size() >= 6);
  const cv::Mat img = read_image(photo());
  for (const std::string& path : models) {
    CAPTURE(path);
    const Model m = open_like_the_cli(path);
    const int classes = m.network().config().num_classes;
    const auto api = m.classify(img, classes);
    const auto cli = cli_logits("-m " + path, photo(), classes);
    REQUIRE(cli.size() == api.size());
    float worst = 0;
    for (const Prediction& p : api) worst = std::max(worst, std::abs(cli.at(p.index) - p.logit));
    CHECK(worst == 0.0f);
  }
}

TEST_CASE("a preprocessing flag overrides the model file only when given") {
  const std::string m = "-m botnet26t_256";
  const int classes = 1000;
  const auto plain = cli_logits(m, photo(), classes);
  const auto bgr = cli_logits(m + " --bgr", photo(), classes);
  const auto rgb = cli_logits(m + " --rgb", photo(), classes);
  CHECK(plain == rgb);   // the model says RGB: --rgb changes nothing
  CHECK(plain != bgr);   // --bgr does
  const auto nocrop = cli_logits(m + " --no-crop", photo(), classes);
  CHECK(plain != nocrop);
}

TEST_CASE("convert keeps the preprocessing and labels it read; info prints them as flags") {
  test::TempDir d;
  for (const std::string& in : {std::string("botnet26t_256"), src("models/botnet-fmnist.json")}) {
    CAPTURE(in);
    const Model ref = open_like_the_cli(fs::exists(in) ? in : find_config(in));
    for (const char* ext : {".json", ".safetensors"}) {
      const std::string out = d.file(std::string("out") + ext);
      REQUIRE(run_cli("convert " + in + " " + out).status == 0);
      const Model back = Model::load(out);
      CHECK(back.preprocess().to_json() == ref.preprocess().to_json());
      CHECK(back.labels() == ref.labels());
    }
    // a flag given to convert is written, the rest stays
    REQUIRE(run_cli("convert " + in + " " + d.file("bgr.json") + " --tta hflip").status == 0);
    const Preprocess p = Model::load(d.file("bgr.json")).preprocess();
    CHECK(p.tta == Tta::HFlip);
    CHECK(p.channels == ref.preprocess().channels);
    CHECK(p.crop == ref.preprocess().crop);
    CHECK(p.interpolation == ref.preprocess().interpolation);
  }
  // info: the same preprocessing in the flags' units; applying them changes nothing
  const auto info = run_cli("info botnet26t_256 --no-layers", true);
  REQUIRE(info.status == 0);
  const auto at = info.out.find("as flags: ");
  REQUIRE(at != std::string::npos);
  const std::string flags = info.out.substr(at + 10, info.out.find('\n', at) - at - 10);
  CHECK(flags.find("--mean 123.675") != std::string::npos);
  CHECK(flags.find("--crop-pct 0.95") != std::string::npos);
  CHECK(flags.find("--interpolation bicubic") != std::string::npos);
  // the same preprocessing up to float rounding of mean * scale
  const auto a = cli_logits("-m botnet26t_256 " + flags, photo(), 1000), b = cli_logits("-m botnet26t_256", photo(), 1000);
  for (const auto& [k, v] : b) CHECK(a.at(k) == doctest::Approx(v).epsilon(1e-5));
}

TEST_CASE("--crop-pct is read as a double, as timm's: 0.8 at 256 resizes to 320, the same as the model file saying 0.8") {
  // A float 0.8 is 0.800000011920929, and floor(256 / that) is 319: one pixel off timm's resize.
  test::TempDir d;
  json cfg = json::parse(std::ifstream(find_config("botnet26t_256")));
  cfg["preprocess"]["crop_pct"] = 0.8;
  std::ofstream(d.file("cp08.json")) << cfg.dump();
  const auto from_file = cli_logits("-m " + d.file("cp08.json"), photo(), 1000);
  const auto from_flag = cli_logits("-m botnet26t_256 --crop-pct 0.8", photo(), 1000);
  CHECK(from_flag == from_file);
  // convert writes what was typed, and info prints it back the same
  REQUIRE(run_cli("convert botnet26t_256 " + d.file("out.json") + " --crop-pct 0.8").status == 0);
  const json written = json::parse(std::ifstream(d.file("out.json")));
  CHECK(written["preprocess"]["crop_pct"].get<double>() == 0.8);
  const auto info = run_cli("info " + d.file("out.json") + " --no-layers", true);
  CHECK(info.out.find("--crop-pct 0.8 ") != std::string::npos);
}

TEST_CASE("--config on a file that carries its own preprocessing or labels: the same is accepted, a different one refused") {
  test::TempDir d;
  REQUIRE(run_cli("convert botnet26t_256 " + d.file("m.safetensors")).status == 0);
  REQUIRE(run_cli("convert botnet26t_256 " + d.file("m.json")).status == 0);
  json cfg = json::parse(std::ifstream(find_config("botnet26t_256")));
  cfg["preprocess"]["crop_pct"] = 0.8;
  std::ofstream(d.file("cp08.json")) << cfg.dump();
  cfg = json::parse(std::ifstream(find_config("botnet26t_256")));
  json labels = json::array();
  for (int i = 0; i < 1000; ++i) labels.push_back("X" + std::to_string(i));
  cfg["labels"] = labels;
  std::ofstream(d.file("labels.json")) << cfg.dump();
  for (const char* file : {"m.safetensors", "m.json"}) {
    CAPTURE(file);
    const std::string m = "classify -q -m " + d.file(file) + " --config ";
    CHECK(run_cli(m + "botnet26t_256 " + photo()).status == 0);  // the same settings: fine
    // the config's crop_pct was dropped without a word, and the file's used
    auto r = run_cli(m + d.file("cp08.json") + " " + photo());
    CHECK(r.status == 1);
    CHECK(r.out.find("the file carries its own preprocessing, whose crop_pct (0.95) differs from the config ") !=
          std::string::npos);
    r = run_cli(m + d.file("labels.json") + " " + photo());
    CHECK(r.status == 1);
    CHECK(r.out.find("the file carries its own labels, which differ from the config ") != std::string::npos);
    CHECK(r.out.find("class 0 is 'tench, Tinca tinca' in the file, 'X0' in the config") != std::string::npos);
  }
  // only what the config gives itself counts: fmnist_botnet says nothing of test-time mirroring,
  // and the shipped botnet-fmnist.json (tta "hflip") was refused with its own architecture config
  auto r = run_cli("classify -q -k1 --json -m " + src("models/botnet-fmnist.json") + " --config fmnist_botnet " +
                   src("samples/bag_00018.png"));
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("\"Bag\"") != std::string::npos);
  json fm = json::parse(std::ifstream(find_config("fmnist_botnet")));
  fm["preprocess"]["tta"] = "none";  // said, and different: refused
  std::ofstream(d.file("fm_tta.json")) << fm.dump();
  r = run_cli("classify -q -m " + src("models/botnet-fmnist.json") + " --config " + d.file("fm_tta.json") + " " +
              src("samples/bag_00018.png"));
  CHECK(r.status == 1);
  CHECK(r.out.find("whose tta (\"hflip\") differs from the config ") != std::string::npos);
}

TEST_CASE("preprocessing flags whose result is no valid preprocessing: a usage error naming the flags") {
  // They failed later with exit 1 and only the model file's key named; --crop-pct nan passed its
  // range check; --std 1e-20 made inputs of 1e20 that overflowed inside the network, and the
  // answer was the classifier's biases, with exit 0.
  const std::string fm = "classify -q -k1 -m " + src("models/botnet-fmnist.json") + " " + src("samples/bag_00018.png") + " ";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--crop-pct nan", "--crop-pct: must be a number from 0.01 to 1, got nan"},
      {"--std 1e-30", "with --std: preprocess: key 'std' 1e-30"},
      {"--std 1e-20", "makes input values up to 1.286e+20; relpos takes preprocessing whose inputs stay within +-1e6"},
      {"--mean 3e38", "with --mean: preprocess: key 'std'"},
      {"--scale 1e30", "with --scale: preprocess: key 'std'"},
      {"--scale 3e38 --std 1e-3", "with --std, --scale: preprocess: key 'mean'"},
  };
  for (const auto& flags_message : bad) {  // (no structured binding: clang's INFO cannot capture one)
    const std::string& flags = flags_message.first;
    INFO(flags);
    const auto r = run_cli(fm + flags);
    INFO(r.out);
    CHECK(r.status == 2);
    CHECK(r.out.find(flags_message.second) != std::string::npos);
    CHECK(r.out.find("usage: relpos classify") != std::string::npos);
  }
  CHECK(run_cli(fm + "--std 0.01").status == 0);  // inputs to about 100: fine
  // --max-model-gb reached the library as "0.000000" (std::to_string): the value given is named
  const auto r = run_cli(fm + "--max-model-gb 1e-9");
  CHECK(r.status == 1);
  CHECK(r.out.find("over the limit of 1e-09 GiB") != std::string::npos);
}

TEST_CASE("--mean and --std take one value or one per channel; anything else is a usage error naming the flag") {
  const std::string fm = "classify -m " + src("models/botnet-fmnist.json") + " ";
  const std::string img = src("samples/bag_00018.png");
  // one value followed by the image: the image is not swallowed
  auto r = run_cli(fm + "--mean 72.9 " + img);
  CHECK(r.status == 0);
  CHECK(r.out.find("bag_00018.png") != std::string::npos);
  r = run_cli(fm + "--mean 1,2 " + img);
  CHECK(r.status == 2);
  CHECK(r.out.find("--mean takes 1 value") != std::string::npos);
  CHECK(r.out.find("usage: relpos classify") != std::string::npos);
  r = run_cli("classify -m botnet26t_256 --std 0.2,0.2 " + photo());
  CHECK(r.status == 2);
  CHECK(r.out.find("--std takes 1 value or 3") != std::string::npos);
  r = run_cli("classify -m botnet26t_256 --mean x " + photo());
  CHECK(r.status == 2);
  CHECK(r.out.find("--mean takes numbers") != std::string::npos);
  CHECK(r.out.find("e.g. --mean 127.5") != std::string::npos);  // its example in its own units, 0..255
  r = run_cli("classify -m botnet26t_256 --std 0 " + photo());
  CHECK(r.status == 2);
  // numbers beyond float32's range are named as such (they were "not numbers"; 1e-45 then stopped
  // the run with a message from the library, and the message's own formatting threw)
  r = run_cli("classify -m botnet26t_256 --std 1e-45 " + photo());
  CHECK(r.status == 2);
  CHECK(r.out.find("--std must not be zero, nor as small as 1.4013e-45 (a subnormal float32)") != std::string::npos);
  r = run_cli("classify -m botnet26t_256 --mean 1e39 " + photo());
  CHECK(r.status == 2);
  CHECK(r.out.find("--mean 1e39 is beyond float32's range") != std::string::npos);
  // three values on an RGB model are fine
  CHECK(run_cli("classify -q -m botnet26t_256 --mean 120,115,100 --std 0.2,0.2,0.2 " + photo()).status == 0);
}

TEST_CASE("a missing model file, a directory or a broken config: one sentence naming the path, exit 1") {
  const std::string img = src("samples/bag_00018.png");
  relpos::test::TempDir d;
  const auto once = [](const std::string& text, const std::string& what) {
    const auto at = text.find(what);
    return at != std::string::npos && text.find(what, at + 1) == std::string::npos;
  };
  auto r = run_cli("classify -m " + d.file("weights.safetensors") + " " + img);
  CHECK(r.status == 1);
  CHECK(r.out.find(d.file("weights.safetensors") + ": no such file") != std::string::npos);
  CHECK(once(r.out, d.file("weights.safetensors")));
  r = run_cli("eval -m " + d.path + " --data " + d.path);
  CHECK(r.status == 1);
  CHECK(r.out.find(d.path + ": is a directory") != std::string::npos);
  // a folder in the working folder named as a shipped model (a run's output, say) does not hide it;
  // one named as no shipped model is still the error
  fs::create_directories(d.path + "/botnet-fmnist");
  fs::create_directories(d.path + "/no-such-model");
  r = run_cli("classify -q -m botnet-fmnist " + img, false, "-C " + d.path);
  CHECK(r.status == 0);
  r = run_cli("classify -q -m no-such-model " + img, false, "-C " + d.path);
  CHECK(r.status == 1);
  CHECK(r.out.find("no-such-model: is a directory") != std::string::npos);
  std::ofstream(d.file("cfg.json")) << R"({"name": "x", "stages": []})";
  r = run_cli("train --config " + d.file("cfg.json") + " --data fashion-mnist --epochs 1 --out " + d.file("run"));
  CHECK(r.status == 1);
  CHECK(r.out.find(d.file("cfg.json") + ": model config: missing \"stem\"") != std::string::npos);
}

TEST_CASE("usage errors exit 2 with the usage line; bounded --threads; --topk 0 in words") {
  const std::string img = src("samples/bag_00018.png");
  const std::string fm = "-m " + src("models/botnet-fmnist.json");
  auto r = run_cli("classify " + fm + " --bogus " + img);
  CHECK(r.status == 2);
  CHECK(r.out.find("usage: relpos classify") != std::string::npos);
  r = run_cli("classify " + fm + " --threads 100000 " + img);
  CHECK(r.status == 2);
  CHECK(r.out.find("--threads") != std::string::npos);
  r = run_cli("classify " + fm + " --topk 0 " + img);
  CHECK(r.status == 2);
  CHECK(r.out.find("--topk must be a whole number of at least 1") != std::string::npos);
  r = run_cli("nonsense");
  CHECK(r.status == 2);
  CHECK(run_cli("classify --help").status == 0);
  // every command that runs a model takes --threads and --device
  for (const char* cmd : {"classify", "eval", "train", "info", "convert", "bench"}) {
    CAPTURE(cmd);
    const auto h = run_cli(std::string(cmd) + " --help");
    CHECK(h.out.find("--threads") != std::string::npos);
    CHECK(h.out.find("--device") != std::string::npos);
  }
  CHECK(run_cli("info " + src("models/botnet-fmnist.json") + " --threads 1 --no-layers").status == 0);
  if (!cuda_available()) {
    r = run_cli("classify " + fm + " --device cuda " + img);
    CHECK(r.status == 1);
    CHECK(r.out.find("--device cuda:") != std::string::npos);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);  // one sentence, no stack of messages
  }
}

TEST_CASE("--json keeps going on file names that are not UTF-8") {
  test::TempDir d;
  const std::string bad = d.file("bad\xff\xfe.png");
  fs::copy_file(src("samples/bag_00018.png"), bad);
  fs::copy_file(src("samples/coat_00006.png"), d.file("good.png"));
  const auto r = run_cli("classify --json -m " + src("models/botnet-fmnist.json") + " " + d.path, true);
  CHECK(r.status == 0);
  std::istringstream lines(r.out);
  std::string line;
  int n = 0, with_bytes = 0;
  while (std::getline(lines, line)) {
    const json j = json::parse(line);  // valid JSON, valid UTF-8
    CHECK(j.contains("predictions"));
    if (j.contains("image_bytes")) {
      ++with_bytes;
      CHECK(j["image_bytes"].get<std::string>().find("fffe2e706e67") != std::string::npos);
    }
    ++n;
  }
  CHECK(n == 2);
  CHECK(with_bytes == 1);
}

namespace {
// samples/<class>_NNNNN.png into root/<label folder>/ for every Fashion-MNIST class
void make_sample_folders(const std::string& root) {
  const std::map<std::string, std::string> prefix = {
      {"T-shirt/top", "t-shirt-top"}, {"Trouser", "trouser"}, {"Pullover", "pullover"}, {"Dress", "dress"},
      {"Coat", "coat"},               {"Sandal", "sandal"},   {"Shirt", "shirt"},       {"Sneaker", "sneaker"},
      {"Bag", "bag"},                 {"Ankle boot", "ankle-boot"}};
  for (const auto& [label, p] : prefix) {
    const std::string dir = root + "/" + label_folder_name(label);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(src("samples"))) {
      const std::string f = e.path().filename().string();
      if (f.rfind(p + "_", 0) == 0) fs::copy_file(e.path(), dir + "/" + f);
    }
  }
}
}  // namespace

TEST_CASE("eval matches class folders to the model's labels by name, not by alphabet") {
  test::TempDir d;
  make_sample_folders(d.path);
  CHECK(label_folder_name("T-shirt/top") == "T-shirt_top");
  auto r = run_cli("eval --json -m " + src("models/botnet-fmnist.json") + " --data " + d.path, true);
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  CHECK(j["images"] == 30);
  CHECK(j["top1"].get<double>() >= 0.9);  // classify gets 28 of 30 right; alphabetical order gets ~10%
  CHECK(j["classes"][0] == "T-shirt/top");
  // a folder that is no label is named
  fs::create_directories(d.path + "/Socks");
  fs::copy_file(src("samples/bag_00018.png"), d.path + "/Socks/x.png");
  r = run_cli("eval -m " + src("models/botnet-fmnist.json") + " --data " + d.path);
  CHECK(r.status == 1);
  CHECK(r.out.find("folder 'Socks' is not one of the model's 10 class labels") != std::string::npos);
  fs::remove_all(d.path + "/Socks");
  // a label without a folder is named
  fs::remove_all(d.path + "/Bag");
  r = run_cli("eval -m " + src("models/botnet-fmnist.json") + " --data " + d.path);
  CHECK(r.status == 1);
  CHECK(r.out.find("no folder for class 'Bag'") != std::string::npos);
}

TEST_CASE("eval --compare pairs the two models' classes by label and runs both at the same input size") {
  test::TempDir d;
  make_sample_folders(d.path + "/data");
  const std::string fm = src("models/botnet-fmnist.json");
  // the same network with its classes in reverse order: the classifier's rows and the labels
  Model m = Model::load(fm);
  Tensor& w = *m.network().find("head.fc.weight")->value;
  Tensor& b = *m.network().find("head.fc.bias")->value;
  const std::int64_t n = w.dim(0), k = w.dim(1);
  const std::vector<float> wv = w.to_vector(), bv = b.to_vector();
  std::vector<float> rw(wv.size()), rb(bv.size());
  for (std::int64_t c = 0; c < n; ++c) {
    std::copy_n(wv.begin() + (n - 1 - c) * k, k, rw.begin() + c * k);
    rb[static_cast<std::size_t>(c)] = bv[static_cast<std::size_t>(n - 1 - c)];
  }
  w.copy_from(Tensor::from_vector(w.shape(), rw));
  b.copy_from(Tensor::from_vector(b.shape(), rb));
  std::vector<std::string> labels = m.labels();
  std::reverse(labels.begin(), labels.end());
  m.set_labels(labels);
  m.save_json(d.file("reversed.json"));
  const auto agreement = [&](const std::string& args) {
    const auto r = run_cli("eval --json -q -m " + fm + " --data " + d.path + "/data --compare " + args, true);
    INFO(args << ": " << r.out);
    REQUIRE(r.status == 0);
    return json::parse(r.out)["agreement"]["top1"].get<double>();
  };
  CHECK(agreement(d.file("reversed.json")) == 1.0);  // by position: 0
  // a model compared with itself agrees at any size (the second model ran at its own size)
  CHECK(agreement(fm + " --input-size 32") == 1.0);
  CHECK(agreement(fm + " --canvas 40") == 1.0);
  // a class the other model does not know is named, before any work
  labels[3] = "Socks";
  m.set_labels(labels);
  m.save_json(d.file("socks.json"));
  const auto r = run_cli("eval -q -m " + fm + " --data " + d.path + "/data --compare " + d.file("socks.json"));
  CHECK(r.status == 1);
  CHECK(r.out.find("--compare: " + d.file("socks.json") + "'s class 'Socks' is not one of the model's labels") !=
        std::string::npos);
}

TEST_CASE("eval and classify agree on the exit status when images are skipped; each file named once") {
  test::TempDir d;
  make_sample_folders(d.path);
  std::ofstream(d.path + "/Coat/broken.png") << "\x89PNG\r\n\x1a\n truncated";
  const std::string m = "-m " + src("models/botnet-fmnist.json");
  const auto ev = run_cli("eval " + m + " --data " + d.path);
  const auto cl = run_cli("classify " + m + " " + d.path);
  CHECK(ev.status == 1);
  CHECK(cl.status == 1);
  CHECK(ev.out.find("top-1") != std::string::npos);  // the results are still printed
  CHECK(ev.out.find("30 images (1 unreadable, skipped)") != std::string::npos);
  for (const auto* r : {&ev, &cl}) {
    CHECK(r->out.find("broken.png: truncated PNG") != std::string::npos);
    CHECK(r->out.find("broken.png: " + d.path) == std::string::npos);
    CHECK(r->out.find("libpng") == std::string::npos);
    CHECK(r->out.find('\r') == std::string::npos);  // no progress bar in a pipe
  }
}

TEST_CASE("the API: topk <= 0 is an error; CV_32F images are taken in 0..255 units like 8-bit ones") {
  const Model m = Model::load(src("models/botnet-fmnist.json"));
  const cv::Mat img = read_image(src("samples/bag_00018.png"));
  CHECK_THROWS_AS(m.classify(img, 0), Error);
  CHECK_THROWS_AS(m.classify(img, -3), Error);
  cv::Mat f;
  img.convertTo(f, CV_32F);
  const auto a = m.classify(img, 10), b = m.classify(f, 10);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].index == b[i].index);
    CHECK(a[i].logit == doctest::Approx(b[i].logit).epsilon(1e-5));
  }
}

TEST_CASE("a progress bar on a terminal only, never with -q or in a pipe") {
  if (std::system("command -v script >/dev/null 2>&1") != 0) {
    MESSAGE("skipped: util-linux 'script' (a pseudo-terminal) is not installed");
    return;
  }
  const std::string cmd = std::string(RELPOS_CLI_PATH) + " classify --threads 1 -m " + src("models/botnet-fmnist.json") +
                          " " + src("samples");
  const auto on_tty = [](const std::string& c) {
    relpos::test::CliRun r;
    FILE* p = popen(("RELPOS_PROGRESS_AFTER=0 script -qec '" + c + "' /dev/null 2>&1").c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    std::size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
    r.status = pclose(p);
    return r;
  };
  auto r = on_tty(cmd);
  CHECK(r.status == 0);
  CHECK(r.out.find("img/s  ETA") != std::string::npos);
  CHECK(r.out.find("\033[K") != std::string::npos);  // the bar is erased when done
  r = on_tty(cmd + " -q");
  CHECK(r.status == 0);
  CHECK(r.out.find("Bag") != std::string::npos);  // it did classify
  CHECK(r.out.find("ETA") == std::string::npos);
  const auto piped = run_cli("classify --threads 1 -m " + src("models/botnet-fmnist.json") + " " + src("samples"));
  CHECK(piped.out.find("ETA") == std::string::npos);
}

TEST_CASE("eval --class-order sorted reads folders in class order (ImageNet's WordNet IDs), as torchvision does") {
  test::TempDir d;
  make_sample_folders(d.path + "/named");
  // the same images in folders named n00 .. n09 in the model's class order
  const std::vector<std::string> labels = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                           "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  fs::create_directories(d.path + "/ids");
  for (std::size_t c = 0; c < labels.size(); ++c)
    fs::copy(d.path + "/named/" + label_folder_name(labels[c]), d.path + "/ids/n0" + std::to_string(c),
             fs::copy_options::recursive);
  const std::string model = src("models/botnet-fmnist.json");
  auto r = run_cli("eval -q --json -m " + model + " --data " + d.path + "/named", true);
  REQUIRE(r.status == 0);
  const json by_label = json::parse(r.out);
  // by label the ID folders are refused, and the message says what to use
  r = run_cli("eval -q -m " + model + " --data " + d.path + "/ids");
  CHECK(r.status == 1);
  CHECK(r.out.find("folder 'n00' is not one of the model's 10 class labels") != std::string::npos);
  CHECK(r.out.find("relpos eval --class-order sorted") != std::string::npos);
  r = run_cli("eval -q --json --class-order sorted -m " + model + " --data " + d.path + "/ids", true);
  REQUIRE(r.status == 0);
  const json sorted = json::parse(r.out);
  CHECK(sorted["top1"] == by_label["top1"]);
  CHECK(sorted["confusion"] == by_label["confusion"]);
  CHECK(sorted["classes"][0] == "T-shirt/top");  // the model's labels name the classes
  // top-5 as classify --topk 5 ranks the same images
  int in_top5 = 0, images = 0;
  for (std::size_t c = 0; c < labels.size(); ++c) {
    const auto k = run_cli("classify -q --json --topk 5 -m " + model + " " + d.path + "/ids/n0" + std::to_string(c), true);
    std::istringstream lines(k.out);
    for (std::string line; std::getline(lines, line);) {
      ++images;
      const json one = json::parse(line);
      for (const auto& p : one["predictions"]) in_top5 += p["index"] == static_cast<int>(c);
    }
  }
  CHECK(images == 30);
  CHECK(sorted["top5"].get<double>() == doctest::Approx(in_top5 / 30.0));
  CHECK(sorted["top5"].get<double>() >= sorted["top1"].get<double>());
  // a folder of class folders is scored as it is: no split in what is printed
  r = run_cli("eval -q --class-order sorted -m " + model + " --data " + d.path + "/ids", true);
  CHECK(r.out.rfind(d.path + "/ids: 30 images, top-1 ", 0) == 0);
  CHECK(r.out.find(", top-5 ") != std::string::npos);
  // folders named as the labels are not taken in sorted order ('Ankle boot' first would be class 0)
  r = run_cli("eval -q --class-order sorted -m " + model + " --data " + d.path + "/named");
  CHECK(r.status == 1);
  CHECK(r.out.find("the class folders are named as the model's labels, but their sorted order is not the classes' "
                   "order") != std::string::npos);
  // as many folders as classes
  fs::remove_all(d.path + "/ids/n09");
  r = run_cli("eval -q --class-order sorted -m " + model + " --data " + d.path + "/ids");
  CHECK(r.status == 1);
  CHECK(r.out.find("9 class folders, but the model has 10 classes") != std::string::npos);
}

TEST_CASE("eval with many classes: the lowest per-class accuracies and no text matrix; --png refused before work") {
  test::TempDir d;
  // a 40-class model (random weights) and one image in each of 40 folders
  json config = json::parse(std::ifstream(src("models/fmnist_conv.json")));
  config["num_classes"] = 40;
  config.erase("labels");  // (Fashion-MNIST's 10)
  std::ofstream(d.file("c40.json")) << config.dump();
  for (int c = 0; c < 40; ++c) {
    const std::string dir = d.path + "/data/c" + std::string(c < 10 ? "0" : "") + std::to_string(c);
    fs::create_directories(dir);
    fs::copy_file(src("samples/bag_00018.png"), dir + "/x.png");
  }
  auto r = run_cli("eval -q -m " + d.file("c40.json") + " --data " + d.path + "/data --class-order sorted", true);
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("per class (the 10 lowest of the 40 classes with images; --json has them all):") != std::string::npos);
  CHECK(r.out.find("confusion matrix: 40 x 40, in --json") != std::string::npos);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') < 20);
  // a class whose only image is unreadable has no accuracy: not among the lowest, null in --json
  std::ofstream(d.path + "/data/c07/x.png", std::ios::trunc) << "not a png";
  r = run_cli("eval -q -m " + d.file("c40.json") + " --data " + d.path + "/data --class-order sorted", true);
  CHECK(r.status == 1);  // (an unreadable image fails the run, after the results)
  CHECK(r.out.find("per class (the 10 lowest of the 39 classes with images; --json has them all):") != std::string::npos);
  CHECK(r.out.find("c07") == std::string::npos);
  r = run_cli("eval -q --json -m " + d.file("c40.json") + " --data " + d.path + "/data --class-order sorted", true);
  const json j = json::parse(r.out);
  CHECK(j["per_class"][7].is_null());
  CHECK(j["per_class"][8].is_number());
  // a 1000-class picture would be 28,000 pixels wide: refused before the evaluation
  r = run_cli("eval -q -m botnet26t_256 --data " + d.path + "/data --class-order sorted --png " + d.file("c.png"));
  CHECK(r.status == 2);
  CHECK(r.out.find("--png: the confusion matrix is drawn for up to 100 classes; the model has 1000") != std::string::npos);
}

TEST_CASE("convert and quantize write over an earlier relpos model only, not over a checkpoint, a config or an image") {
  test::TempDir d;
  const std::string image = d.file("photo.json"), config = d.file("config.json");
  fs::copy_file(photo(), image);  // an image whose name ends in .json
  fs::copy_file(find_config("fmnist_conv"), config);
  const auto text = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string image_bytes = text(image), config_bytes = text(config);
  for (const std::string& target : {image, config}) {
    CAPTURE(target);
    auto r = run_cli("convert botnet-fmnist " + target);
    CHECK(r.status == 1);
    CHECK(r.out.find(target + ": is there and is not a relpos model file") != std::string::npos);
    r = run_cli("quantize -m botnet-fmnist --calib fashion-mnist --samples 8 --out " + target);
    CHECK(r.status == 1);
    CHECK(r.out.find(target + ": is there and is not a relpos model file") != std::string::npos);
  }
  CHECK(text(image) == image_bytes);
  CHECK(text(config) == config_bytes);
  // an earlier model is replaced, and an empty file (mktemp's)
  std::ofstream(d.file("empty.safetensors")).close();
  CHECK(run_cli("convert botnet-fmnist " + d.file("empty.safetensors")).status == 0);
  REQUIRE(run_cli("convert botnet-fmnist " + d.file("m.safetensors")).status == 0);
  CHECK(run_cli("convert botnet-fmnist " + d.file("m.safetensors")).status == 0);
  REQUIRE(run_cli("convert botnet-fmnist " + d.file("m.json")).status == 0);
  CHECK(run_cli("quantize -m botnet-fmnist --calib fashion-mnist --samples 8 --out " + d.file("m.json")).status == 0);
}

TEST_CASE("eval on the built-in Fashion-MNIST matches a model's classes by label, in any order") {
  // A model whose labels are Fashion-MNIST's in sorted order (trained on sorted class folders) was
  // refused: "the model's 10 class labels are not Fashion-MNIST's".
  test::TempDir d;
  Model m = Model::load(src("models/botnet-fmnist.json"));
  std::vector<std::string> labels = m.labels();
  std::vector<int> order(labels.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return labels[a] < labels[b]; });
  Tensor& w = *m.network().find("head.fc.weight")->value;
  Tensor& b = *m.network().find("head.fc.bias")->value;
  const std::vector<float> wv = w.to_vector(), bv = b.to_vector();
  const std::int64_t k = w.dim(1);
  std::vector<std::string> sorted;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto from = static_cast<std::size_t>(order[i]);
    std::copy(wv.begin() + static_cast<std::ptrdiff_t>(from * k), wv.begin() + static_cast<std::ptrdiff_t>((from + 1) * k),
              w.data() + i * k);
    b.data()[i] = bv[from];
    sorted.push_back(labels[from]);
  }
  REQUIRE(sorted != labels);
  m.set_labels(sorted);
  m.network().prepare_inference();
  m.save_json(d.file("sorted.json"));
  const auto score = [&](const std::string& model) {
    const auto r = run_cli("eval -q --json --tta none -m " + model + " --data fashion-mnist", true);
    INFO(r.out);
    REQUIRE(r.status == 0);
    return json::parse(r.out);
  };
  const json a = score(src("models/botnet-fmnist.json")), s = score(d.file("sorted.json"));
  CHECK(s["top1"] == a["top1"]);
  CHECK(s["classes"].get<std::vector<std::string>>() == sorted);
  // a label that is none of Fashion-MNIST's is still refused
  sorted[0] = "Boot";
  m.set_labels(sorted);
  m.save_json(d.file("other.json"));
  const auto r = run_cli("eval -q -m " + d.file("other.json") + " --data fashion-mnist");
  CHECK(r.status == 1);
  CHECK(r.out.find("class labels are not Fashion-MNIST's") != std::string::npos);
}

TEST_CASE("eval's default batch fits the model's working set at the size it runs; --batch overrides it") {
  // 500 images of botnet26t_256 per batch took 7.8 GB; and at --width/--height larger than the
  // config's, the estimate must be at the size the preprocessing gives
  test::TempDir d;
  if (!test::make_fashion_mnist_folder(d.path, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 0, 1)) return;
  const auto batch = [&](const std::string& args) {
    const auto r = run_cli("eval -q --json --data " + d.path + " " + args);
    INFO(args << "\n" << r.out);
    REQUIRE(r.status == 0);
    const json j = json::parse(r.out.substr(r.out.find('{')));
    CHECK(j["images"] == 10);
    return j["batch"].get<int>();
  };
  const int small = batch("-m fmnist_conv"), large = batch("-m fmnist_conv --width 112 --height 112");
  CHECK(small == 500);  // a 28x28 model's 1.7 MiB per image
  CHECK(large < 100);  // 16 times the pixels: about 75 (it stayed 500)
  CHECK(large >= 1);
  CHECK(batch("-m fmnist_conv --width 112 --height 112 -b 7") == 7);
  CHECK(batch("-m fmnist_conv --compare botnet-fmnist -b 3") == 3);
}

TEST_CASE("a signal while a file is being written removes its temporary, and the run ends by the signal") {
  // convert, quantize, eval --png and explain left "<file>.tmp.<pid>" behind when stopped mid-write,
  // and a rerun did not remove it (only train swept its own)
  for (const int sig : {SIGINT, SIGTERM}) {
    CAPTURE(sig);
    test::TempDir d;
    const std::string out = d.file("model.json");
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      dup2(null, STDERR_FILENO);
      std::signal(sig, SIG_DFL);
      execl(RELPOS_CLI_PATH, "relpos", "convert", "botnet26t_256", out.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // as soon as the temporary is there (a 65 MB JSON file takes about a second to write)
    std::string temporary;
    for (int i = 0; i < 20000 && temporary.empty(); ++i) {
      for (const auto& e : fs::directory_iterator(d.path))
        if (e.path().filename().string().rfind("model.json.tmp.", 0) == 0) temporary = e.path().string();
      if (temporary.empty()) usleep(500);
    }
    REQUIRE_MESSAGE(!temporary.empty(), "the temporary never appeared");
    kill(pid, sig);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status)) {  // it finished before the signal came: nothing to check this time
      MESSAGE("convert ended before the signal");
      continue;
    }
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == sig);
    CHECK_FALSE(fs::exists(temporary));
    CHECK_FALSE(fs::exists(out));  // (the file itself was never there: nothing half-written in its place)
  }
}

TEST_CASE("eval --json gives a data folder's name that is not UTF-8 as its bytes too, as classify --json does") {
  // "data" held U+FFFD for the bad byte, which maps back to no folder
  test::TempDir d;
  const std::string root = d.path + "/ev\xff";
  test::make_pattern_dataset(root, 1, 1);
  Model m = Model::create(test::tiny_rgb_config(), 3);
  m.set_labels({"bars", "columns", "dots"});
  m.save_json(d.file("m.json"));
  const auto r = run_cli("eval -m " + d.file("m.json") + " --data '" + root + "' --json");
  INFO(r.out);
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out.substr(r.out.find('{')));
  CHECK(j["data"] == d.path + "/ev\xef\xbf\xbd");
  std::string hex;
  for (const unsigned char ch : root) {
    static const char kHex[] = "0123456789abcdef";
    hex += kHex[ch >> 4];
    hex += kHex[ch & 15];
  }
  CHECK(j["data_bytes"] == hex);
}
