// The relpos command line, run as a user runs it: output, exit status and bad input.
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <set>
#include <sstream>
#include <vector>
#include <sys/stat.h>
#include <sys/wait.h>

#include "cli_run.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using relpos::test::TempDir;

namespace {

using Run = relpos::test::CliRun;
Run run(const std::string& args, bool stdout_only = false) { return relpos::test::run_cli(args, stdout_only); }

std::string samples() { return relpos::test::source_dir() + "/samples"; }
std::string tiny() { return relpos::test::source_dir() + "/models/tiny_botnet_96x64.json"; }

int count_lines(const std::string& s) {
  std::istringstream in(s);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += !line.empty();
  return n;
}

}  // namespace

TEST_CASE("classify prints top-k for every image of a folder and a timing summary") {
  Run r = run("classify --model " + tiny() + " " + samples() + " --topk 3 --threads 2");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("bag_00018.png") != std::string::npos);
  CHECK(r.out.find("30 images classified") != std::string::npos);
  CHECK(r.out.find("img/s") != std::string::npos);
}

TEST_CASE("classify --json writes one parseable object per image") {
  Run r = run("classify --model " + tiny() + " " + samples() + "/bag_00018.png " + samples() + "/sandal_00008.png --json -k 2",
              true);
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(count_lines(r.out) == 2);
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    CHECK(j["predictions"].size() == 2);
    CHECK(j["predictions"][0]["probability"].get<double>() >= j["predictions"][1]["probability"].get<double>());
  }
}

TEST_CASE("a bad image is reported and skipped, the rest are classified, and the exit status is non-zero") {
  TempDir dir;
  std::ofstream(dir.file("notes.txt")) << "not an image";
  std::ofstream(dir.file("broken.png")) << "\x89PNG\r\n\x1a\n garbage";
  cv::imwrite(dir.file("good.png"), cv::imread(samples() + "/bag_00018.png"));
  Run r = run("classify --model " + tiny() + " " + dir.file("notes.txt") + " " + dir.path + " " + dir.file("nope.png"));
  INFO(r.out);
  CHECK(r.status != 0);
  // each message names its file once, and no codec library prints to stderr
  CHECK(r.out.find("skipped " + dir.file("notes.txt") + ": not a readable image") != std::string::npos);
  CHECK(r.out.find(dir.file("notes.txt") + ": " + dir.file("notes.txt")) == std::string::npos);
  CHECK(r.out.find("broken.png: truncated PNG") != std::string::npos);
  CHECK(r.out.find("libpng") == std::string::npos);
  CHECK(r.out.find("nope.png: no such file or folder") != std::string::npos);
  CHECK(r.out.find(dir.file("good.png") + "\n") != std::string::npos);
  CHECK(r.out.find("1 image classified") != std::string::npos);
  CHECK(r.out.find("3 failed") != std::string::npos);
}

TEST_CASE("classify follows linked folders and reports a broken link among a folder's images") {
  TempDir dir;
  fs::create_directories(dir.path + "/in");
  fs::create_directories(dir.path + "/other");
  cv::imwrite(dir.path + "/in/good.png", cv::imread(samples() + "/bag_00018.png"));
  cv::imwrite(dir.path + "/other/linked.png", cv::imread(samples() + "/bag_00018.png"));
  fs::create_directory_symlink(dir.path + "/other", dir.path + "/in/sub");
  fs::create_symlink(dir.path + "/moved.png", dir.path + "/in/lost.png");
  Run r = run("classify --model " + tiny() + " " + dir.path + "/in");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(r.out.find(dir.path + "/in/lost.png: broken symbolic link") != std::string::npos);
  CHECK(r.out.find(dir.path + "/in/sub/linked.png\n") != std::string::npos);
  CHECK(r.out.find("2 images classified") != std::string::npos);
  CHECK(r.out.find("1 failed") != std::string::npos);
}

TEST_CASE("results that cannot be written to standard output make the run fail") {
  if (!fs::exists("/dev/full")) {
    MESSAGE("no /dev/full here");
    return;
  }
  // a full disk: every write fails; the exit status said success over a cut-off file
  TempDir dir;
  for (const std::string& args : {"classify -m " + tiny() + " " + samples() + " --json -q", "info " + tiny()}) {
    CAPTURE(args);
    const int st =
        std::system((std::string(RELPOS_CLI_PATH) + " " + args + " > /dev/full 2> " + dir.file("err")).c_str());
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 1);
    std::ifstream in(dir.file("err"));
    const std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(err.find("relpos: error: cannot write the results to standard output") != std::string::npos);
  }
  // classify stops at the first batch it cannot write (it classified every image, then said so)
  const int st = std::system((std::string(RELPOS_CLI_PATH) + " classify -m " + tiny() + " " + samples() +
                              " --batch 1 > /dev/full 2> " + dir.file("err"))
                                 .c_str());
  CHECK(WEXITSTATUS(st) == 1);
  std::ifstream in(dir.file("err"));
  const std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(err);
  CHECK(err.find("images classified") == std::string::npos);
  CHECK(err.find("cannot write the results to standard output: No space left on device") != std::string::npos);
}

TEST_CASE("control bytes in file names are escaped in text output and messages; --json keeps them exact") {
  // a newline made two lines of one name, an escape sequence cleared the screen
  TempDir dir;
  fs::create_directories(dir.path + "/in");
  fs::copy_file(samples() + "/bag_00018.png", dir.path + "/in/a\nb.png");
  fs::copy_file(samples() + "/bag_00018.png", dir.path + "/in/e\x1b[2J.png");
  std::ofstream(dir.path + "/in/z\x1b[31m.png") << "not an image";
  Run r = run("classify -m " + tiny() + " " + dir.path + "/in -k 1");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(r.out.find(dir.path + "/in/a\\nb.png\n") != std::string::npos);
  CHECK(r.out.find(dir.path + "/in/e\\x1b[2J.png\n") != std::string::npos);
  CHECK(r.out.find("skipped " + dir.path + "/in/z\\x1b[31m.png: not a readable image") != std::string::npos);
  CHECK(r.out.find('\x1b') == std::string::npos);
  Run j = run("classify -m " + tiny() + " " + dir.path + "/in -k 1 --json");
  CHECK(j.out.find("\"" + dir.path + "/in/a\\nb.png\"") != std::string::npos);  // JSON's own escape: exact
}

TEST_CASE("an empty folder is an error, not a silent success") {
  TempDir dir;
  Run r = run("classify --model " + tiny() + " " + dir.path);
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(r.out.find("folder holds no images") != std::string::npos);
}

TEST_CASE("bad model files and options fail with a message and status 1, never a crash") {
  TempDir dir;
  std::ofstream(dir.file("junk.json")) << "{\"format\": \"relpos-weights\", \"version\": 7}";
  Run r = run("classify --model " + dir.file("junk.json") + " " + samples());
  CHECK(r.status == 1);
  CHECK(r.out.find("version 7 is not supported") != std::string::npos);
  std::ofstream(dir.file("labels.txt")) << "one\ntwo\n";
  r = run("classify --model " + tiny() + " --labels " + dir.file("labels.txt") + " " + samples());
  CHECK(r.status == 1);
  CHECK(r.out.find(dir.file("labels.txt") + ": 2 labels for a model with 10 classes") != std::string::npos);
  r = run("classify --model " + tiny() + " --width 50 " + samples());
  CHECK(r.status != 0);
  CHECK(r.out.find("takes 96x64 only") != std::string::npos);
  // a flag's range says what it wants (CLI11's own checks printed 0.000000 to a 309-digit number)
  for (const std::string flags : {"train -c fmnist_conv --epochs 0", "classify -m fmnist_conv --max-model-gb 0 x.png",
                            "bench -m fmnist_conv --warmup -1", "train -c fmnist_conv --lr -1",
                            "train -c fmnist_conv --wd -1", "train -c fmnist_conv --max-steps -1",
                            "bench -m fmnist_conv --min-seconds -1", "classify -m fmnist_conv --scale -1 x.png"}) {
    r = run(flags);
    INFO(flags << ": " << r.out);
    CHECK(r.status == 2);
    CHECK((r.out.find("must be positive, got 0") != std::string::npos ||
           r.out.find("--scale: must be positive, got -1") != std::string::npos ||
           r.out.find("must be a whole number of at least 1 (epochs to train), got '0'") != std::string::npos ||
           r.out.find("must not be negative, got -1") != std::string::npos));
    CHECK(r.out.find("000000000") == std::string::npos);
  }
  // a labels file names itself once; an empty file argument is shown as ''; explain -o onto a file
  std::ofstream(dir.file("empty_labels.txt")) << "\n";
  r = run("classify --model " + tiny() + " --labels " + dir.file("empty_labels.txt") + " " + samples());
  CHECK(r.status == 1);
  CHECK(r.out.find("error: " + dir.file("empty_labels.txt") + ": no labels in the file") != std::string::npos);
  r = run("classify --model " + tiny() + " '' " + samples() + "/bag_00018.png");
  CHECK(r.status == 1);
  CHECK(r.out.find("skipped '': no such file or folder") != std::string::npos);
  std::ofstream(dir.file("a_file")) << "x";
  r = run("explain -m " + relpos::test::source_dir() + "/models/botnet-fmnist.json " + samples() + "/bag_00018.png -o " + dir.file("a_file"));
  CHECK(r.status == 1);
  CHECK(r.out.find(dir.file("a_file") + ": cannot make the output folder (a file of that name is there)") !=
        std::string::npos);
  // a channel order for a grayscale model was ignored silently
  r = run("classify -m " + relpos::test::source_dir() + "/models/botnet-fmnist.json --rgb " + samples() + "/bag_00018.png");
  CHECK(r.status == 2);
  CHECK(r.out.find("--rgb: the model takes grayscale input") != std::string::npos);
  // training's fractions and counts (accepted silently, or refused only after the model loaded)
  // (not a structured binding: clang's INFO cannot capture one)
  for (const auto& flag_says : std::vector<std::pair<std::string, std::string>>{
           {"--smoothing 2", "--smoothing: must be from 0 to below 1, got 2"},
           {"--erase 5", "--erase: must be from 0 to 1, got 5"},
           {"--warmup -1", "--warmup: must not be negative, got -1"},
           {"--pad -3", "--pad: must not be negative, got -3"}}) {
    r = run("train -c fmnist_conv " + flag_says.first);
    INFO(flag_says.first << ": " << r.out);
    CHECK(r.status == 2);
    CHECK(r.out.find(flag_says.second) != std::string::npos);
  }
  // eval --png into a folder that is not there fails before the evaluation, naming the file
  r = run("eval -m fmnist_conv --data fashion-mnist --png /nonexistent-folder/cm.png");
  CHECK(r.status == 1);
  CHECK(r.out.find("/nonexistent-folder/cm.png: cannot write the confusion matrix there") != std::string::npos);
  // eval --split train on a folder of class folders scored it and called it "train"
  relpos::test::make_pattern_dataset(dir.file("pat"), 2, 1);
  std::filesystem::rename(dir.file("pat/test"), dir.file("flat"));
  r = run("eval -m fmnist_conv --data " + dir.file("flat") + " --split train");
  CHECK(r.status == 2);
  CHECK(r.out.find("--split train: " + dir.file("flat") + " has no train/ folder") != std::string::npos);
  // both of a pair of opposite flags: the last one won silently
  r = run("classify -m fmnist_conv --rgb --bgr x.png");
  CHECK(r.status == 2);
  CHECK(r.out.find("--rgb excludes --bgr") != std::string::npos);
  r = run("classify -m fmnist_conv --no-crop --crop x.png");
  CHECK(r.status == 2);
  CHECK(r.out.find("--crop excludes --no-crop") != std::string::npos);
  // a command that is not one was "A subcommand is required"
  r = run("clasify x.png");
  CHECK(r.status == 2);
  CHECK(r.out.find("'clasify' is not a relpos command (classify, eval, train") != std::string::npos);
  // a picture's name that OpenCV has no encoder for failed after the evaluation; an empty one was ignored
  for (const std::string name : {"cm.txt", "''"}) {
    r = run("eval -m fmnist_conv --data fashion-mnist --png " + name);
    CHECK(r.status == 2);
    CHECK(r.out.find("--png: the file name must end in .png") != std::string::npos);
  }
  // so do quantize (before its calibration) and convert
  r = run("quantize -m " + relpos::test::source_dir() + "/models/botnet-fmnist.json --calib fashion-mnist -o /nonexistent-folder/q.json");
  CHECK(r.status == 1);
  CHECK(r.out.find("/nonexistent-folder/q.json: cannot write the int8 model there (no folder /nonexistent-folder)") !=
        std::string::npos);
  CHECK(r.out.find("calibration") == std::string::npos);
  std::filesystem::create_directories(dir.file("out.json"));
  r = run("convert fmnist_conv " + dir.file("out.json"));
  CHECK(r.status == 1);
  CHECK(r.out.find(dir.file("out.json") + ": is a folder; convert's output takes a file name") != std::string::npos);
}

TEST_CASE("convert: config -> JSON -> safetensors -> JSON gives identical predictions; labels and overrides stick") {
  TempDir dir;
  std::ofstream lab(dir.file("labels.txt"));
  for (int i = 0; i < 10; ++i) lab << "label" << i << "\n";
  lab.close();
  REQUIRE(run("convert " + tiny() + " " + dir.file("a.json") + " --labels " + dir.file("labels.txt") + " --bgr").status == 0);
  REQUIRE(run("convert " + dir.file("a.json") + " " + dir.file("b.safetensors")).status == 0);
  REQUIRE(run("convert " + dir.file("b.safetensors") + " " + dir.file("c.json") + " --numbers").status == 0);
  const std::string img = samples() + "/coat_00006.png";
  const Run a = run("classify --json -m " + dir.file("a.json") + " " + img, true);
  const Run c = run("classify --json -m " + dir.file("c.json") + " " + img, true);
  CHECK(a.status == 0);
  CHECK(a.out == c.out);
  CHECK(a.out.find("label") != std::string::npos);
  const Run i = run("info " + dir.file("c.json") + " --no-layers");
  CHECK(i.out.find("BGR") != std::string::npos);
}

TEST_CASE("--width and --height that a fixed-size network cannot take are refused before any work") {
  TempDir dir;
  const std::string fm = relpos::test::source_dir() + "/models/botnet-fmnist.json";  // 28x28, relative positions
  // convert wrote a file that no command could run (and over the input, given as the output)
  Run r = run("convert " + fm + " " + dir.file("w30.json") + " --width 30");
  INFO(r.out);
  CHECK(r.status == 2);
  CHECK(r.out.find("--width/--height ask for 28x30 input (height x width), but botnet-fmnist takes 28x28 only") !=
        std::string::npos);
  CHECK(!std::filesystem::exists(dir.file("w30.json")));
  r = run("classify -m " + fm + " --height 32 " + samples() + "/bag_00018.png");
  CHECK(r.status == 2);
  CHECK(r.out.find("ask for 32x28 input") != std::string::npos);
  // the size it has is fine, and a network without fixed tables takes any size
  CHECK(run("convert " + fm + " " + dir.file("w28.json") + " --width 28 --height 28").status == 0);
  CHECK(run("classify -m " + relpos::test::source_dir() + "/models/fmnist_conv.json --width 32 --height 32 " + samples() +
            "/bag_00018.png").status == 0);
  // its memory is checked at the size asked for, not the size it was built for, before any work
  r = run("classify -m " + relpos::test::source_dir() + "/models/fmnist_conv.json --width 60000 --height 60000 " +
          samples() + "/bag_00018.png");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(r.out.find("--width/--height ask for 60000x60000 input: model config") != std::string::npos);
  CHECK(r.out.find("GiB; set RELPOS_MAX_MODEL_GB (or relpos --max-model-gb) to allow it") != std::string::npos);
}

TEST_CASE("info and bench count and run a model of any input size at its preprocessing's size") {
  TempDir dir;
  const std::string conv = relpos::test::source_dir() + "/models/fmnist_conv.json";  // 28x28, any input size
  REQUIRE(run("convert " + conv + " " + dir.file("w32.json") + " --width 32 --height 40").status == 0);
  const Run at28 = run("info " + conv + " --no-layers"), at32 = run("info " + dir.file("w32.json") + " --no-layers");
  INFO(at28.out);
  INFO(at32.out);
  CHECK(at28.out.find(": 1x28x28 -> 10 classes") != std::string::npos);
  // (it printed the config's 28x28 and counted its multiply-adds there, while classify ran at 40x32)
  CHECK(at32.out.find(": 1x40x32 -> 10 classes") != std::string::npos);
  // bench runs and counts it at 40x32: about 40 * 32 / (28 * 28) = 1.63 times the multiply-adds
  const auto bench_gmacs = [](const std::string& model) {
    const Run b = run("bench -m " + model + " --iters 1 --warmup 0 --json", true);
    REQUIRE(b.status == 0);
    return nlohmann::json::parse(b.out)["forward_gmacs_per_image"].get<double>();
  };
  const double g28 = bench_gmacs(conv), g40 = bench_gmacs(dir.file("w32.json"));
  CHECK(g40 / g28 > 1.5);
  CHECK(g40 / g28 < 1.75);
  // and info prints the same count
  std::ostringstream want;
  want << std::fixed << std::setprecision(2) << g40 << " GMACs per image";
  CHECK(at32.out.find(want.str()) != std::string::npos);
}

TEST_CASE("info lists layers with parameters and multiply-adds") {
  Run r = run("info botnet26t_256");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("stages.3.1.self_attn") != std::string::npos);
  CHECK(r.out.find("total: 12.49 M parameters, 3.30 GMACs per image") != std::string::npos);
}

TEST_CASE("bench times inference, a training step, or the attention op, and can save logits") {
  TempDir dir;
  Run r = run("bench -m " + tiny() + " --batch 2 --iters 2 --warmup 0 --json --save-logits " + dir.file("l.safetensors"), true);
  INFO(r.out);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["batch"] == 2);
  CHECK(j["img_per_s"].get<double>() > 0);
  // the forward's multiply-adds per image (as relpos info counts them), and per second at the median
  const double gmacs = j["forward_gmacs_per_image"].get<double>();
  CHECK(gmacs > 0);
  CHECK(j["forward_gmac_per_s"].get<double>() == doctest::Approx(gmacs * j["img_per_s"].get<double>()).epsilon(1e-9));
  r = run("info " + tiny());
  std::ostringstream want;
  want << std::fixed << std::setprecision(2) << gmacs << " GMACs per image";
  CHECK(r.out.find(want.str()) != std::string::npos);
  CHECK(relpos::SafetensorsFile::read(dir.file("l.safetensors")).tensor("logits").shape() == relpos::Shape{2, 10});
  r = run("bench -m " + tiny() + " --batch 2 --iters 1 --warmup 0 --train");
  CHECK(r.status == 0);
  CHECK(r.out.find("training step batch 2") != std::string::npos);
  r = run("bench --attention 4 5 --dim 8 --heads 2 --batch 1 --iters 1 --warmup 0");
  CHECK(r.status == 0);
  CHECK(r.out.find("bot_attention 4x5 d8 heads2") != std::string::npos);
  r = run("bench --attention 6 9 --sasa 3 --dim 8 --heads 2 --batch 2 --iters 1 --warmup 0 --backward");
  CHECK(r.status == 0);
  CHECK(r.out.find("sasa_attention fwd+bwd 3x3 6x9 d8 heads2 batch 2") != std::string::npos);
  // what the flags ask for cannot be: usage errors (exit 2)
  r = run("bench --attention 6 9 --sasa 4 --dim 8 --iters 1");  // an even window
  CHECK(r.status == 2);
  CHECK(r.out.find("odd window") != std::string::npos);
  r = run("bench --attention 6 9 --sasa 3 --dim 7 --iters 1");  // dqk must split in halves
  CHECK(r.status == 2);
  CHECK(r.out.find("--dim must be even") != std::string::npos);
  r = run("bench --attention 0 0 --iters 1");
  CHECK(r.status == 2);
  r = run("bench -m fmnist_conv --attention 7 7 --iters 1");  // the model was ignored
  CHECK(r.status == 2);
  CHECK(r.out.find("it takes no --model") != std::string::npos);
  r = run("bench --iters 1");
  CHECK(r.status == 2);
  CHECK(r.out.find("--model is required") != std::string::npos);
  r = run("bench -m fmnist_conv --sasa 3 --iters 1");  // was ignored
  CHECK(r.status == 2);
  CHECK(r.out.find("--sasa times the SASA op alone") != std::string::npos);
  // one mode's options in the other were ignored too (a --save-logits that wrote nothing)
  for (const char* extra : {"--save-logits x.safetensors", "--train", "--profile", "--input x.safetensors",
                            "--paired-with fmnist_conv", "--config fmnist_conv"}) {
    CAPTURE(extra);
    r = run(std::string("bench --attention 7 7 --iters 1 ") + extra);
    CHECK(r.status == 2);
    CHECK(r.out.find("excludes") != std::string::npos);
  }
  for (const char* extra : {"--backward", "--heads 2", "--dim 8"}) {
    CAPTURE(extra);
    r = run(std::string("bench -m fmnist_conv --iters 1 ") + extra);
    CHECK(r.status == 2);
    CHECK(r.out.find("excludes") != std::string::npos);
  }
}

TEST_CASE("bench --paired-with times two models run by run and compares their multiply-adds per second") {
  const std::string other = relpos::test::source_dir() + "/models/botnet-fmnist.json";
  Run r = run("bench -m " + tiny() + " --paired-with " + other + " --batch 2 --iters 15 --warmup 1 --json", true);
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["paired"].size() == 2);
  const auto& a = j["paired"][0];
  const auto& b = j["paired"][1];
  CHECK(a["what"] == "tiny_botnet_96x64 inference");
  CHECK(b["what"].get<std::string>().find("inference") != std::string::npos);
  CHECK(a["what"] != b["what"]);
  CHECK(a["batch"] == 2);
  CHECK(b["batch"] == 2);
  CHECK(a["iters"] == 15);
  CHECK(b["iters"] == 15);
  CHECK(j["pairs"] == 15);
  // each model's multiply-adds as its own bench reports them
  const auto alone = nlohmann::json::parse(run("bench -m " + other + " --batch 2 --iters 1 --warmup 0 --json", true).out);
  CHECK(b["forward_gmacs_per_image"].get<double>() == doctest::Approx(alone["forward_gmacs_per_image"].get<double>()));
  CHECK(a["forward_gmacs_per_image"].get<double>() != doctest::Approx(b["forward_gmacs_per_image"].get<double>()));
  // the ratio is taken pair by pair: recomputed here from each pair's two times (in run order) and
  // the two models' multiply-adds, its median and quartiles are the ones printed; each model's
  // median run is the median of its times over the pairs. (A check of the printed ratio against the
  // ratio of the two models' median rates failed now and then under ctest -j2: both are timings.)
  const auto& pairs = j["pair_ms"];
  REQUIRE(pairs.size() == 15);
  const double g1 = a["forward_gmacs_per_image"], g2 = b["forward_gmacs_per_image"];
  std::vector<double> ratios, t1s, t2s;
  for (const auto& p : pairs) {
    REQUIRE(p.size() == 2);
    const double t1 = p[0], t2 = p[1];
    CHECK(t1 > 0.0);
    CHECK(t2 > 0.0);
    t1s.push_back(t1);
    t2s.push_back(t2);
    ratios.push_back((g2 / t2) / (g1 / t1));
  }
  std::sort(ratios.begin(), ratios.end());
  std::sort(t1s.begin(), t1s.end());
  std::sort(t2s.begin(), t2s.end());
  CHECK(j["per_mac_ratio"].get<double>() == doctest::Approx(ratios[7]).epsilon(1e-9));
  CHECK(j["per_mac_ratio_q1"].get<double>() == doctest::Approx(ratios[3]).epsilon(1e-9));
  CHECK(j["per_mac_ratio_q3"].get<double>() == doctest::Approx(ratios[11]).epsilon(1e-9));
  CHECK(a["median_ms"].get<double>() == t1s[7]);
  CHECK(b["median_ms"].get<double>() == t2s[7]);
  r = run("bench -m " + tiny() + " --paired-with " + other + " --iters 2 --warmup 0");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("per multiply-add, ") != std::string::npos);
  CHECK(r.out.find(" pairs; quartiles ") != std::string::npos);
  // usage errors: a different batch in the two inputs, or options that pairing does not take
  TempDir dir;
  relpos::write_safetensors(dir.file("in3.safetensors"), {{"input", relpos::Tensor::zeros({3, 1, 28, 28})}});
  r = run("bench -m " + tiny() + " --paired-with " + other + " --paired-input " + dir.file("in3.safetensors") +
          " --batch 2 --iters 1 --warmup 0");
  CHECK(r.status == 2);
  CHECK(r.out.find("both inputs need the same batch, got 2 and 3") != std::string::npos);
  r = run("bench -m " + tiny() + " --paired-with " + other + " --iters 1 --train");
  CHECK(r.status == 2);
  CHECK(r.out.find("--paired-with times inference only") != std::string::npos);
  r = run("bench -m " + tiny() + " --paired-config botnet-fmnist --iters 1");
  CHECK(r.status == 2);
  CHECK(r.out.find("need --paired-with") != std::string::npos);
  r = run("bench -m " + tiny() + " --paired-with " + relpos::test::source_dir() + "/models/no_such_model.json --iters 1");
  CHECK(r.status == 1);
  CHECK(r.out.find("no_such_model") != std::string::npos);
}

TEST_CASE("bench --profile charges every op to the layer it ran in") {
  Run r = run("bench -m " + tiny() + " --batch 2 --iters 3 --warmup 1 --json --profile", true);
  INFO(r.out);
  REQUIRE(r.status == 0);
  // Two JSON lines: the timing, then the profile.
  const auto j = nlohmann::json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  CHECK(j["runs"] == 3);
  std::set<std::string> layers;
  double sum = 0.0;
  for (const auto& row : j["profile"]) {
    layers.insert(row["layer"].get<std::string>());
    CHECK(row["ms_per_run"].get<double>() >= 0.0);
    CHECK(row["calls"].get<long>() % 3 == 0);  // the same ops in every run, warm-up left out
    sum += row["ms_per_run"].get<double>();
  }
  CHECK(layers.count("stem") == 1);
  CHECK(layers.count("stages.0.0") == 1);
  CHECK(layers.count("head") == 1);
  CHECK(layers.count("") == 0);  // nothing outside a layer in inference
  CHECK(sum > 0.0);
  r = run("bench -m " + tiny() + " --batch 2 --iters 1 --warmup 0 --profile");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("= layer") != std::string::npos);
  CHECK(r.out.find("GMAC/s") != std::string::npos);
}

TEST_CASE("bench --profile splits the SASA op into its projection and its attention kernels") {
  const std::string model = relpos::test::source_dir() + "/models/fmnist_sasa.json";
  Run r = run("bench -m " + model + " --batch 2 --iters 3 --warmup 1 --json --profile", true);
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  std::map<std::string, double> op_ms;  // layer -> the SASA op's ms per run
  std::map<std::string, long> op_calls;
  for (const auto& row : j["profile"])
    if (row["op"] == "sasa_projected_attention (cpu)") {
      op_ms[row["layer"].get<std::string>()] += row["ms_per_run"].get<double>();
      op_calls[row["layer"].get<std::string>()] += row["calls"].get<long>();
    }
  REQUIRE(op_ms.size() == 2);  // stages.1.1 and stages.2.1
  std::map<std::string, std::set<std::string>> seen;
  std::map<std::string, double> parts_ms;
  for (const auto& p : j["parts"]) {
    const std::string layer = p["layer"].get<std::string>();
    CHECK(p["op"] == "sasa_projected_attention (cpu)");
    CHECK(op_ms.count(layer) == 1);
    CHECK(p["calls"].get<long>() == op_calls[layer]);
    CHECK(p["ms_per_run"].get<double>() >= 0.0);
    seen[layer].insert(p["part"].get<std::string>());
    parts_ms[layer] += p["ms_per_run"].get<double>();
  }
  for (const auto& [layer, ms] : op_ms) {
    CHECK(seen[layer] == std::set<std::string>{"attention", "projection"});
    CHECK(parts_ms[layer] > 0.0);
    CHECK(parts_ms[layer] <= ms * 1.0001 + 1e-6);  // inside the op's own time
  }
  // as text: indented under the op, in its layer and in the totals by op
  r = run("bench -m " + model + " --batch 2 --iters 1 --warmup 0 --profile");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("of which projection") != std::string::npos);
  CHECK(r.out.find("of which attention") != std::string::npos);
  // a model without SASA has no parts
  r = run("bench -m " + tiny() + " --batch 2 --iters 1 --warmup 0 --json --profile", true);
  REQUIRE(r.status == 0);
  CHECK(nlohmann::json::parse(r.out.substr(r.out.rfind("\n{") + 1))["parts"].empty());
}

TEST_CASE("classify --shard K/N: the parts are disjoint, cover every image once, and bad parts are usage errors") {
  const std::string model = relpos::test::source_dir() + "/models/botnet-fmnist.json";
  std::vector<std::string> all;
  std::size_t largest = 0, smallest = 1000;
  for (int k = 1; k <= 3; ++k) {
    const Run r = run("classify -m " + model + " " + samples() + " --json -q --shard " + std::to_string(k) + "/3", true);
    REQUIRE(r.status == 0);
    std::istringstream lines(r.out);
    std::string line;
    std::size_t n = 0;
    while (std::getline(lines, line))
      if (!line.empty()) all.push_back(nlohmann::json::parse(line)["image"].get<std::string>()), ++n;
    largest = std::max(largest, n), smallest = std::min(smallest, n);
  }
  const Run whole = run("classify -m " + model + " " + samples() + " --json -q", true);
  std::size_t total = 0;
  for (char c : whole.out) total += c == '\n';
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());  // disjoint
  CHECK(all.size() == total);                                      // and complete
  CHECK(largest - smallest <= 1);                                  // balanced
  for (const char* bad : {"0/3", "4/3", "x", "1/0", "-1/2", "1/2/3", ""}) {  // "": before, all of the images
    CAPTURE(bad);
    const Run r = run("classify -m " + model + " " + samples() + " --shard '" + bad + "'");
    CHECK(r.status == 2);
    CHECK(r.out.find("--shard takes K/N") != std::string::npos);
  }
  // more shards than images: the shards past them have nothing to do, say so and succeed
  const Run empty = run("classify -m " + model + " " + samples() + " --json -q --shard 40/40");
  INFO(empty.out);
  CHECK(empty.status == 0);
  CHECK(empty.out.find("shard 40/40 has no images: " + std::to_string(total) + " dealt in turn over 40 shards") !=
        std::string::npos);
  // only inputs that do not exist: shard 1 reports them and fails; another shard has nothing to do
  // (before: exit 1 without a word)
  const Run missing1 = run("classify -m " + model + " /nonexistent/a.png --shard 1/2");
  CHECK(missing1.status == 1);
  CHECK(missing1.out.find("/nonexistent/a.png") != std::string::npos);
  const Run missing2 = run("classify -m " + model + " /nonexistent/a.png --shard 2/2");
  CHECK(missing2.status == 0);
  CHECK(missing2.out.find("shard 1 reports the inputs that cannot be read") != std::string::npos);
}

TEST_CASE("classify --json: an unreadable image's line stands where the image does among the others") {
  relpos::test::TempDir dir;
  std::ofstream(dir.file("cut.png")) << "\x89PNG";
  const std::string model = relpos::test::source_dir() + "/models/botnet-fmnist.json";
  const std::string a = samples() + "/bag_00018.png", b = samples() + "/coat_00006.png";
  // before: the unreadable image's line came first in its batch
  const Run r = run("classify -m " + model + " --json -q -b 3 " + a + " " + dir.file("cut.png") + " " + b, true);
  CHECK(r.status == 1);
  std::istringstream lines(r.out);
  std::string line;
  std::vector<std::string> order;
  while (std::getline(lines, line)) {
    const auto j = nlohmann::json::parse(line);
    order.push_back(j["image"].get<std::string>() + (j.contains("error") ? " error" : ""));
  }
  CHECK(order == std::vector<std::string>{a, dir.file("cut.png") + " error", b});
}

TEST_CASE("bench --attention sizes beyond what a config allows are usage errors, not an uncaught bad_alloc") {
  // --sasa 999999 aborted with exit 134 (std::bad_alloc thrown where nothing caught it)
  Run r = run("bench --attention 56 56 --sasa 999999 --iters 1 --warmup 0");
  CHECK(r.status == 2);
  CHECK(r.out.find("--sasa takes an odd window of 1 to 15") != std::string::npos);
  r = run("bench --attention 50000 50000 --iters 1 --warmup 0");
  CHECK(r.status == 2);
  r = run("bench --attention 4096 4096 --heads 256 --dim 4096 --iters 1 --warmup 0");
  CHECK(r.status == 2);
  CHECK(r.out.find("would need more than 16 GiB") != std::string::npos);
  CHECK(run("bench --attention 8 8 --sasa 3 --heads 2 --dim 8 --iters 1 --warmup 0").status == 0);
}

TEST_CASE("OMP_NUM_THREADS beyond 1024 is taken as 1024, as --threads: it crashed libgomp (exit 139)") {
  const auto r = relpos::test::run_cli("classify -q -m botnet-fmnist " + relpos::test::source_dir() + "/samples/bag_00018.png",
                                       false, "OMP_NUM_THREADS=100000");
  INFO(r.out);
  CHECK(r.status == 0);
}

TEST_CASE("a named pipe or a device given as an image, a model or a labels file: an error naming it, never a wait") {
  // opening a FIFO waits for a writer (forever when none comes); /dev/zero never ends
  relpos::test::TempDir d;
  const std::string fifo = d.file("fifo.png");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  const std::string img = samples() + "/bag_00018.png";
  const auto run_briefly = [](const std::string& args) { return relpos::test::run_cli(args, false, "RELPOS_T=1 timeout 60"); };
  Run r = run_briefly("classify -q -m botnet-fmnist " + fifo);
  CHECK(r.status == 1);
  CHECK(r.out.find(fifo + ": is a named pipe (FIFO), not a file") != std::string::npos);
  r = run_briefly("classify -q -m " + fifo + " " + img);
  CHECK(r.status == 1);
  CHECK(r.out.find(fifo + ": is a named pipe (FIFO), not a file") != std::string::npos);
  r = run_briefly("classify -q -m botnet-fmnist --labels /dev/zero " + img);
  CHECK(r.status == 1);
  CHECK(r.out.find("/dev/zero: is a character device, not a file") != std::string::npos);
  r = run_briefly("classify -q -m botnet-fmnist /dev/zero");
  CHECK(r.status == 1);
  CHECK(r.out.find("/dev/zero: is a character device, not a file") != std::string::npos);
  // a labels file from a pipe with a writer (bash's <(...)) is read, as before
  const int st = std::system(("bash -c '" + std::string(RELPOS_CLI_PATH) + " classify -q -k 1 -m botnet-fmnist --labels " +
                              "<(for i in 0 1 2 3 4 5 6 7 8 9; do echo class$i; done) " + img + " > " + d.file("out") +
                              " 2>&1'").c_str());
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  std::ifstream out(d.file("out"));
  const std::string printed((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  CHECK(printed.find("class") != std::string::npos);
}

TEST_CASE("a broken link or a link loop given as an input is named as such, as when a folder's search meets one") {
  relpos::test::TempDir d;
  const std::string dangling = d.file("dangling.png"), a = d.file("a.png"), b = d.file("b.png");
  fs::create_symlink(d.file("gone.png"), dangling);
  fs::create_symlink(b, a);
  fs::create_symlink(a, b);
  const Run r = run("classify -q -m botnet-fmnist " + dangling + " " + a);
  CHECK(r.status == 1);
  CHECK(r.out.find(dangling + ": broken symbolic link: its target '" + d.file("gone.png") + "' does not exist") !=
        std::string::npos);
  CHECK(r.out.find(a + ": cannot open it: Too many levels of symbolic links") != std::string::npos);
}
